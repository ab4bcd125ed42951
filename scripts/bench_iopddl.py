"""`rhino solve` on every IOPDDL instance (google/iopddl, ASPLOS 2025 contest) with its
contest time limit halved (2 cores here, 8 there).

    python scripts/bench_iopddl.py                          # all of ../shared/iopddl
    python scripts/bench_iopddl.py --only B --only G --out bench/iopddl.json

Each instance runs in a fresh process (`python -m rhino.cli.main solve FILE --json`,
`benchlib.measure`), given the halved limit less STARTUP_S for starting Python; the time
reported is the process's wall time, start and reading included, and its peak RSS. Every
plan is judged again here by `rhino.search.iopddl.check` (cost and usage per the format's
rules). Contest points are the best team cost of iopddl_final_results.csv over ours (1.0:
as good as the winner; 0 for an infeasible plan). The lower bound is the solver's own;
published_bounds.json's is printed beside it. Nothing here stores or reads a solution.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import click
from benchlib import ROOT, Measured, measure, mib, revision, rhino_command
from rich.console import Console
from rich.table import Table

DATA = ROOT.parent / "shared" / "iopddl"
"""The instances, beside the repository (../shared/iopddl); `--data` names another folder."""
LIMITS = {"ABCDE": 60, "FGHIJ": 120, "KLMNO": 180, "PQRST": 240, "UVWXY": 300}
"""Contest time limits (seconds on 8 cores) by instance letter."""
STARTUP_S = 4.0
"""Of the halved limit, left for starting the process (imports) before the solver's clock."""


def contest_limit(letter: str) -> int:
    return next(limit for letters, limit in LIMITS.items() if letter in letters)


def best_costs(data: Path) -> dict[str, int]:
    """Per instance letter, the lowest cost any team reached (infeasible entries are
    1e18 and more; a blank is no answer)."""
    with open(data / "iopddl_final_results.csv") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    best = {}
    for j, letter in enumerate(header[1:], 1):
        costs = [int(r[j]) for r in rows[1:] if len(r) > j and r[j]]
        best[letter] = min(costs)
    return best


def run_one(path: Path, limit: float, threads: int) -> tuple[dict[str, Any], Measured]:
    """`rhino solve` on one instance in a fresh process: its --json document (or the end of
    its stderr as "error"), and its wall time and peak RSS."""
    args = ["solve", str(path), "--json", "--time-limit", f"{limit:.2f}", "--threads", str(threads)]
    done = measure(rhino_command(args), cwd=Path.cwd())
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-500:]}, done
    return json.loads(done.stdout), done


@click.command()
@click.option("--data", default=str(DATA), show_default=True, type=click.Path(exists=True))
@click.option("--only", multiple=True, help="Instance letters (default: every file).")
@click.option("--threads", default=2, show_default=True)
@click.option("--out", default="bench/iopddl.json", show_default=True)
def main(data: str, only: tuple[str, ...], threads: int, out: str) -> None:
    sys.path.insert(0, str(ROOT))
    from rhino.search.iopddl import check, load

    folder = Path(data)
    best = best_costs(folder)
    bounds = json.loads((folder / "published_bounds.json").read_text())
    files = sorted(folder.glob("asplos-2025-iopddl-*.json.gz"))
    console = Console(width=160)
    results = []
    for path in files:
        letter = path.name.split("-")[-1].split(".")[0]
        if only and letter not in only:
            continue
        half = contest_limit(letter) / 2
        doc, done = run_one(path, half - STARTUP_S, threads)
        wall = done.wall_s
        row = {
            "instance": letter,
            "limit_s": half,
            "wall_s": wall,
            "peak_rss_bytes": done.peak_rss_bytes,
            "best": best[letter],
            "published_bound": bounds.get(letter, {}).get("ti2_lower_bound"),
        }
        if "error" in doc:
            row |= {"feasible": False, "points": 0.0, "error": doc["error"]}
        else:
            judged = check(load(path), doc["choice"])  # judged again, here
            row |= {
                "cost": judged.cost,
                "feasible": judged.feasible,
                "bound": doc["bound"],
                "points": best[letter] / judged.cost if judged.feasible else 0.0,
                "phases_s": doc["phases_s"],
                "windows": doc["windows"],
                "helped": doc["helped"],
            }
        results.append(row)
        console.print(
            f"{letter}: {row.get('cost', '-')} points {row['points']:.3f} wall {wall:.1f} s"
            + (" (toulbar2 helper's plan)" if row.get("helped") else ""),
            row.get("error", ""),
        )
    table = Table(
        title=f"rhino solve on IOPDDL, contest limits halved ({revision('search', 'cli')})"
    )
    for column in (
        "inst",
        "limit s",
        "wall s",
        "cost",
        "best (contest)",
        "points",
        "bound",
        "published bound",
        "feasible",
        "peak RSS",
    ):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(
            r["instance"],
            f"{r['limit_s']:.0f}",
            f"{r['wall_s']:.1f}",
            str(r.get("cost", "-")),
            str(r["best"]),
            f"{r['points']:.3f}",
            f"{r.get('bound', 0):.4g}",
            f"{r['published_bound'] or 0:.4g}",
            "yes" if r["feasible"] else "NO",
            mib(r["peak_rss_bytes"]),
        )
    mean = sum(r["points"] for r in results) / max(len(results), 1)
    console.print(table)
    console.print(
        f"mean points {mean:.3f} over {len(results)} instances; "
        f"feasible {sum(r['feasible'] for r in results)}/{len(results)}; "
        f"within the halved limit "
        f"{sum(r['wall_s'] <= r['limit_s'] for r in results)}/{len(results)}"
    )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps(
            {"revision": revision("search", "cli"), "mean_points": mean, "results": results},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
