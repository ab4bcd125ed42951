"""What the benchmark scripts share: the revision a run measured, JSON of dataclasses, the
instruction count of HLO text, a command's wall time and peak memory, and a past revision
of rhino installed beside this tree.

Imported as `benchlib` by scripts run as `python scripts/<bench>.py` (scripts/ is then
on sys.path).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def revision(*paths: str) -> str:
    """HEAD's short hash, with "+dirty" when `paths` (e.g. "search", "hlo") differ from it."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", *paths], capture_output=True, text=True
    )
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def count_instructions(text: str) -> int:
    """Instructions of an HLO module: lines with `` = `` inside computation bodies."""
    count, inside = 0, False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("{") and not line.startswith((" ", "HloModule")):
            inside = True
        elif stripped == "}":
            inside = False
        elif inside and " = " in line:
            count += 1
    return count


def json_default(value: object) -> object:
    """`json.dumps(default=...)`: dataclasses as dicts, anything else as its str."""
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)  # type: ignore[call-overload]
    return str(value)


@dataclass(frozen=True)
class Measured:
    """One finished command: how long it took, how much memory it held, what it said."""

    wall_s: float
    """Wall-clock seconds from start to exit."""
    peak_rss_bytes: int
    """The command's peak resident set size (see :func:`measure`)."""
    returncode: int
    """Its exit status (negative: killed by that signal, e.g. -9 on a timeout)."""
    stdout: str
    stderr: str


def measure(
    command: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    timeout_s: float | None = None,
) -> Measured:
    """Run `command` to its end; its wall time and peak RSS.

    The peak RSS is the kernel's for this one child, read by `os.wait4` when it is reaped:
    `ru_maxrss` of the child and of the descendants it waited for, the largest of them,
    not their sum (two worker processes that ran at once count as the larger one).
    `resource.getrusage(RUSAGE_CHILDREN)` would not do: its maximum covers every child
    this process ever reaped, so a small command after a big one would report the big
    one's. Output goes through temporary files, so that nothing reaps the child before
    `os.wait4` does. Past `timeout_s` the command is killed (returncode -9).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=cwd)
        killer = threading.Timer(timeout_s, proc.kill) if timeout_s else None
        if killer:
            killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            if killer:
                killer.cancel()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        return Measured(
            wall_s=wall,
            peak_rss_bytes=usage.ru_maxrss * 1024,  # KiB on Linux
            returncode=proc.returncode,
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
        )


def own_peak_rss() -> int:
    """This process's peak RSS so far, in bytes (for benches that run rhino in-process)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def mib(n: int | float | None) -> str:
    """Bytes in MiB, whole ("717 MiB"); "-" for None."""
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def rhino_command(args: Sequence[str]) -> list[str]:
    """The rhino CLI as a user runs it, in this Python: `python -m rhino.cli.main ARGS`."""
    return [sys.executable, "-m", "rhino.cli.main", *args]


def rhino_env(site: Path | None) -> dict[str, str]:
    """This environment with rhino taken from `site` (an installed revision, see
    :func:`installed`) or, for None, from this Python's own install (the working tree
    for an editable install)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return env


@contextmanager
def installed(rev: str) -> Iterator[Path]:
    """Revision `rev` checked out into a temporary git worktree and installed from there
    (`pip install --no-deps --target`); yields the directory to put on PYTHONPATH. The
    worktree and the install are removed on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        tree, site = Path(tmp) / "tree", Path(tmp) / "site"
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run(
            [*git, "add", "--detach", "-f", str(tree), rev], check=True, capture_output=True
        )
        try:
            pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target"]
            subprocess.run([*pip, str(site), str(tree)], check=True, capture_output=True)
            yield site
        finally:
            subprocess.run([*git, "remove", "--force", str(tree)], capture_output=True)
