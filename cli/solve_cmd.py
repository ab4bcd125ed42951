"""`rhino solve`: the sharding solver on an IOPDDL problem file (XLA auto-sharding
problems of the ASPLOS 2025 contest)."""

from __future__ import annotations

import time

import click
from rich.table import Table

from rhino.cli.common import debug_option, emit_json, handle_errors, json_option, status, stdout
from rhino.search.iopddl import answer_line, load, solve
from rhino.search.problem import SolveOptions

EPILOG = """
\b
Examples:
  rhino solve asplos-2025-iopddl-A.json.gz --time-limit 60
  rhino solve problem.json --json | jq .cost
  rhino solve problem.json | tail -1 > answer.txt      # the contest's answer line
"""

SAFETY_S = 2.0
SAFETY_SHARE = 0.02
"""The search ends SAFETY_S plus this share of the limit before it (the answer still has
to be checked and written)."""


@click.command("solve", epilog=EPILOG)
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--time-limit",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds for everything, reading the file included.",
)
@click.option(
    "--threads",
    default=2,
    show_default=True,
    type=click.IntRange(min=1),
    help="Solver threads: CP-SAT workers; with 2 or more, a large problem also gets a "
    "helper process (Lagrangian rounds solved by toulbar2) on a second core.",
)
@click.option("--seed", default=0, show_default=True, help="Random seed of the search.")
@json_option
@debug_option
@handle_errors
def solve_command(
    file: str, time_limit: float, threads: int, seed: int, as_json: bool, debug: bool
) -> None:
    """Solve an IOPDDL problem (.json or .json.gz): one strategy per node, minimum cost,
    usage within the limit at every time. Prints cost, lower bound, peak usage against
    the limit and time per phase, and last the answer line [s0, s1, ...]."""
    begin = time.perf_counter()
    deadline = begin + max(0.1, time_limit * (1 - SAFETY_SHARE) - SAFETY_S)
    with status("reading", enabled=not as_json):
        instance = load(file)
    read_s = time.perf_counter() - begin
    options = SolveOptions(time_limit_s=time_limit, threads=threads, seed=seed, deadline=deadline)
    with status("solving", enabled=not as_json):
        solved = solve(instance, options)
    phases = {"read": read_s, **solved.phases}
    total = time.perf_counter() - begin
    c = solved.check
    if as_json:
        emit_json(
            "solve",
            {
                "name": instance.name,
                "nodes": instance.size[0],
                "edges": instance.size[1],
                "cost": c.cost,
                "bound": solved.bound,
                "peak": c.peak,
                "limit": instance.limit,
                "feasible": c.feasible,
                "windows": solved.windows,
                "helped": solved.helped,
                "time_s": total,
                "phases_s": phases,
                "choice": list(solved.choice),
            },
        )
        return
    table = Table(
        title=f"{instance.name}: {instance.size[0]} nodes, {instance.size[1]} edges",
        show_header=False,
    )
    gap = (c.cost - solved.bound) / c.cost if c.cost else 0.0
    table.add_row("cost", f"{c.cost}")
    table.add_row("lower bound", f"{solved.bound:.0f} (gap {gap:.2%})")
    table.add_row(
        "peak usage", f"{c.peak} of {instance.limit} ({c.peak / max(instance.limit, 1):.1%})"
    )
    table.add_row("time", f"{total:.1f} s: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    table.add_row("windows", str(solved.windows))
    table.add_row("plan from", "toulbar2 helper" if solved.helped else "search")
    stdout.print(table)
    click.echo(answer_line(solved.choice))
