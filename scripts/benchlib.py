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
    """Wall-clock seconds from its start to its exit."""
    peak_rss_bytes: int
    """Its peak resident set size (see :func:`measure`)."""
    returncode: int
    """Its exit status (negative: killed by that signal, e.g. -9 past the timeout)."""
    stdout: str
    stderr: str


LAUNCHER = """
import ctypes, os, resource, signal, sys, time
report, timeout_s, command = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
start = time.perf_counter()
pid = os.posix_spawnp(command[0], command, os.environ, setsid=True)

def kill(*_):
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass

if timeout_s > 0:
    signal.signal(signal.SIGALRM, kill)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
_, status = os.waitpid(pid, 0)
wall_s = time.perf_counter() - start
while True:  # descendants the command left behind (a forkserver and its workers) end here
    try:
        os.wait()
    except ChildProcessError:
        break
maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
with open(report, "w") as out:
    out.write(f"{wall_s} {maxrss} {os.waitstatus_to_exitcode(status)}")
"""
"""What :func:`measure` runs: starts the command, waits for it and for every descendant
it leaves behind, writes its wall time, the largest `ru_maxrss` (KiB) among them and its
exit status to the file named first."""


def measure(
    command: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    timeout_s: float = 0.0,
) -> Measured:
    """Run `command` to its end; its wall time, peak RSS and output.

    The peak RSS is the largest `ru_maxrss` among the command and all its descendants,
    not their sum (two workers that ran at once count as the larger one). The command is
    started by a small Python process (LAUNCHER), not by this one, for two reasons:

    - Linux carries a process's peak over into the program it `exec`s, so a command
      started directly by a bench that has itself grown (XLA loaded, a model parsed)
      would report at least the bench's own peak (`rhino --help` read 193 MiB after an
      in-process XLA parse, 17 MiB alone), and this process's `RUSAGE_CHILDREN` is the
      maximum over every child it ever reaped. The launcher's own ~10 MiB is the floor.
    - The launcher is a child subreaper (`PR_SET_CHILD_SUBREAPER`): descendants that
      outlive their parent, e.g. the workers of a multiprocessing forkserver, which the
      command never reaps, are reaped by it and counted (`rhino plan --devices` read its
      main process's 107 MiB without them).

    The wall time is the launcher's, from spawning the command to the command's exit
    (neither Python's start-up for the launcher nor the reaping of leftovers is in it).
    Past `timeout_s` (0: none) the command's process group is killed (returncode -9).
    """
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryDirectory() as tmp,
    ):
        report = Path(tmp) / "report"
        launcher = [sys.executable, "-I", "-S", "-c", LAUNCHER, str(report), str(timeout_s)]
        subprocess.run([*launcher, *command], stdout=out, stderr=err, env=env, cwd=cwd, check=True)
        wall, maxrss_kib, returncode = report.read_text().split()
        out.seek(0)
        err.seek(0)
        return Measured(
            wall_s=float(wall),
            peak_rss_bytes=int(maxrss_kib) * 1024,  # KiB on Linux
            returncode=int(returncode),
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
    for an editable install). Without PYTHONDONTWRITEBYTECODE (set in some development
    shells): rhino runs from compiled bytecode, as an installed rhino does, once a first
    run has written it."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
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
