"""One rhino command timed at two revisions, side by side, in alternation: wall time and
peak memory.

    python scripts/bench_revisions.py --base 43cab0d -- \\
        plan generated/gpt_hidden512_layers72.hlo --mesh 2x8 --json

This machine is shared and noisy (the same command varies by +-20% from one minute to
the next), so a speed-up is only worth quoting as the two revisions measured in turn:
base, this tree, base, this tree, ... `--rounds` times. The base revision is checked
out into a temporary git worktree and installed there (`benchlib.installed`); "this
tree" is the rhino installed in the running Python (the working tree for an editable
install). Each run is `python -m rhino.cli.main ARGS` (`benchlib.measure`); its wall
time and peak RSS are recorded and, when it prints rhino's JSON, the plan's
`objective_s` (so a faster run that plans worse shows it).

Prints a table (min and median of each revision's wall time and peak RSS, and this
tree's over the base's) and writes JSON (`--out`).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import click
from benchlib import ROOT, installed, measure, mib, revision, rhino_command, rhino_env
from rich.console import Console
from rich.table import Table


def run_once(args: tuple[str, ...], site: Path | None) -> dict[str, Any]:
    """`rhino ARGS` once with rhino from `site` (None: this tree): wall, peak RSS, exit,
    and the plan's objective when it printed rhino's JSON."""
    done = measure(rhino_command(args), env=rhino_env(site), cwd=ROOT)
    row: dict[str, Any] = {
        "wall_s": done.wall_s,
        "peak_rss_bytes": done.peak_rss_bytes,
        "exit": done.returncode,
    }
    try:
        row["objective_s"] = json.loads(done.stdout).get("objective_s")
    except (json.JSONDecodeError, AttributeError):
        pass
    return row


def _ratio(here: float, base: float) -> str:
    return f"{here / base:.2f}x" if base else "-"


def render(args: tuple[str, ...], rounds: int, runs: dict[str, list[dict[str, Any]]]) -> Table:
    """Per revision: the runs, min and median wall and peak RSS of those that exited 0
    (nan if none did), objectives, exit codes; the last row is this tree over the base
    (below 1: this tree is faster / smaller)."""
    table = Table(title=f"rhino {' '.join(args)}: alternating, {rounds} rounds")
    columns = ("revision", "runs (s)", "min s", "median s", "min RSS", "median RSS")
    for col in (*columns, "objective_s", "exit codes"):
        table.add_column(col, justify="left" if col in ("revision", "runs (s)") else "right")
    stats: list[tuple[float, float, float, float]] = []
    for name, rows in runs.items():
        walls = [r["wall_s"] for r in rows if r["exit"] == 0] or [math.nan]
        rss = [r["peak_rss_bytes"] for r in rows if r["exit"] == 0] or [math.nan]
        stats.append((min(walls), statistics.median(walls), min(rss), statistics.median(rss)))
        objectives = sorted({r.get("objective_s") for r in rows}, key=str)
        table.add_row(
            name,
            " / ".join(f"{r['wall_s']:.2f}" for r in rows),
            f"{stats[-1][0]:.2f}",
            f"{stats[-1][1]:.2f}",
            mib(stats[-1][2]),
            mib(stats[-1][3]),
            ", ".join(str(o) for o in objectives),
            ", ".join(str(r["exit"]) for r in rows),
        )
    base, here = stats
    table.add_row("this / base", "", *(_ratio(h, b) for h, b in zip(here, base, strict=True)))
    return table


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
    if here == base:
        here += " (tree)"
    runs: dict[str, list[dict[str, Any]]] = {base: [], here: []}
    with installed(base) as site:
        for _ in range(rounds):
            for name, path in ((base, site), (here, None)):
                runs[name].append(run_once(args, path))
                last = runs[name][-1]
                rss = mib(last["peak_rss_bytes"])
                print(f"{name}: {last['wall_s']:.1f} s, {rss}", file=sys.stderr)
    Console(width=160).print(render(args, rounds, runs))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps({"args": list(args), "base": base, "head": here, "runs": runs}, indent=1)
    )
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()
