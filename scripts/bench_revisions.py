"""One rhino command timed at two revisions, side by side, in alternation.

    python scripts/bench_revisions.py --base 43cab0d -- \\
        plan generated/gpt_hidden512_layers72.hlo --mesh 2x8 --json

This machine is shared and noisy (the same command varies by +-20% from one minute to
the next), so a speed-up is only worth quoting as the two revisions measured in turn:
base, this tree, base, this tree, ... `--rounds` times. The base revision is checked
out into a temporary git worktree and installed there (`pip install --no-deps
--target`); "this tree" is the rhino installed in the running Python (the working
tree for an editable install). Each run is `python -m rhino.cli ARGS`; its wall time is
recorded and, when it prints rhino's JSON, the plan's `objective_s` (so a faster run
that plans worse shows it).

Prints a table and writes JSON (`--out`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from benchlib import ROOT, revision
from rich.console import Console
from rich.table import Table


def install(rev: str, into: Path) -> Path:
    """Check `rev` out under `into` and install it there; the directory to put on
    PYTHONPATH."""
    tree, site = into / "tree", into / "site"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), rev],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(tree),
        ],
        check=True,
        capture_output=True,
    )
    return site


def run_once(args: tuple[str, ...], pythonpath: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "rhino.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    wall = time.perf_counter() - start
    row: dict[str, Any] = {"wall_s": wall, "exit": done.returncode}
    try:
        row["objective_s"] = json.loads(done.stdout).get("objective_s")
    except (json.JSONDecodeError, AttributeError):
        pass
    return row


@click.command(context_settings={"ignore_unknown_options": True})
@click.option("--base", required=True, help="The revision to compare with (a commit, tag, branch).")
@click.option("--rounds", default=3, show_default=True, help="Pairs of runs.")
@click.option(
    "--out", default="bench/revisions.json", show_default=True, type=click.Path(dir_okay=False)
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED, required=True)
def main(base: str, rounds: int, out: str, args: tuple[str, ...]) -> None:
    """Time `rhino ARGS` at BASE and at this tree, alternating."""
    here = revision("search", "hlo", "runtime", "cli")
    runs: dict[str, list[dict[str, Any]]] = {base: [], here: []}
    with tempfile.TemporaryDirectory() as tmp:
        site = install(base, Path(tmp))
        try:
            for _ in range(rounds):
                for name, path in ((base, str(site)), (here, None)):
                    runs[name].append(run_once(args, path))
                    last = runs[name][-1]
                    print(f"{name}: {last['wall_s']:.1f} s", file=sys.stderr)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(Path(tmp) / "tree")],
                capture_output=True,
            )
    table = Table(title=f"rhino {' '.join(args)}: wall seconds, alternating, {rounds} rounds")
    for col in ("revision", "runs (s)", "min", "median", "objective_s", "exit codes"):
        table.add_column(col, justify="left" if col in ("revision", "runs (s)") else "right")
    for name, rows in runs.items():
        walls = sorted(r["wall_s"] for r in rows)
        objectives = sorted({r.get("objective_s") for r in rows}, key=str)
        table.add_row(
            name,
            " / ".join(f"{r['wall_s']:.1f}" for r in rows),
            f"{walls[0]:.1f}",
            f"{walls[len(walls) // 2]:.1f}",
            ", ".join(str(o) for o in objectives),
            ", ".join(str(r["exit"]) for r in rows),
        )
    Console().print(table)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps({"args": list(args), "base": base, "head": here, "runs": runs}, indent=1)
    )
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()
