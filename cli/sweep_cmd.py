"""`rhino sweep`: a batch of plans (model x mesh x level x cluster x memory) from YAML."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from textwrap import indent

import click
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from rhino.cli.common import (
    debug_option,
    emit_json,
    handle_errors,
    json_option,
    prepare_output,
    stderr,
    stdout,
)
from rhino.runtime.sweep import (
    SweepEntry,
    SweepRow,
    load_sweep,
    output_format,
    run_sweep,
    write_rows,
)
from rhino.search.units import format_bytes

EPILOG = """
\b
Sweep file (paths relative to it; see configs/sweeps/):
  models: ["../../examples/*.hlo"]
  meshes: ["1x8", "2x4"]
  levels: [O2, O3]
  clusters: [m8]
  memory: [null, 16GiB]     # null: the cluster's device memory; "unlimited": none
  time_limit: 60
  entries:                  # optional, more entries after the product above
    - {model: ../../generated/gpt_medium.hlo, mesh: "1x8"}

\b
Exit status: 0 when every entry planned, 1 when any entry failed (its row says why),
2 when the sweep file or an option is bad.

\b
Examples:
  rhino sweep configs/sweeps/examples.yaml
  rhino sweep configs/sweeps/examples.yaml --jobs 4 --out results.csv
  rhino sweep configs/sweeps/gpt.yaml --json | jq '.rows[] | select(.status != "ok")'
  rhino sweep configs/sweeps/examples.yaml configs/sweeps/gpt.yaml   # both, one table
"""


def _default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@click.command("sweep", epilog=EPILOG)
@click.argument(
    "files", metavar="FILE...", nargs=-1, required=True, type=click.Path(dir_okay=False)
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=_default_jobs,
    show_default="CPU cores",
    help="Entries planned at once, each in its own worker process.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True),
    callback=prepare_output,
    help="Also write the rows here: .csv or .json (by the extension).",
)
@json_option
@debug_option
@handle_errors
def sweep_command(
    files: tuple[str, ...], jobs: int, out: str | None, as_json: bool, debug: bool
) -> None:
    """Plan every entry of one or more sweep files (models x meshes x levels x clusters x memory
    budgets) in parallel, and tabulate the predicted step time, communication, memory
    and search effort of each. A failing entry is reported in its row; the rest go on."""
    if out:
        output_format(out)  # a bad extension fails before hours of planning
    sweeps = [load_sweep(file) for file in files]  # every file checked before any work
    entries = tuple(entry for sweep in sweeps for entry in sweep.entries)
    finished: dict[int, SweepRow] = {}
    with _progress(entries, enabled=not as_json) as show_row:

        def on_row(i: int, row: SweepRow) -> None:
            finished[i] = row
            show_row(i, row)
            if out:  # as each row finishes: an interrupted sweep keeps what it did
                write_rows([finished[k] for k in sorted(finished)], out)

        try:
            rows = run_sweep(entries, jobs=jobs, on_row=on_row, tracebacks=debug)
        except KeyboardInterrupt:
            rows = [finished[k] for k in sorted(finished)]
            if rows and not as_json:
                render(rows)
            kept = f"; their rows are in {out}" if out and rows else ""
            click.echo(
                f"interrupted: {len(rows)} of {len(entries)} entries had finished{kept}", err=True
            )
            sys.exit(130)
    if out and not finished:  # each finished row wrote the file; a sweep of none writes it here
        write_rows(rows, out)
    if as_json:
        emit_json("sweep", {"rows": rows})
    else:
        render(rows)
    if any(not r.ok for r in rows):
        sys.exit(1)


@contextmanager
def _progress(
    entries: Sequence[SweepEntry], enabled: bool
) -> Iterator[Callable[[int, SweepRow], None]]:
    """A progress bar on stderr (only on a terminal); yields the per-row callback."""
    if not enabled:
        yield lambda _i, _row: None
        return
    if not stderr.is_terminal:  # a log: a line per finished entry, with the time spent
        start = time.perf_counter()
        count = [0]
        click.echo(f"rhino: planning {len(entries)} entries", err=True)

        def line(_i: int, row: SweepRow) -> None:
            count[0] += 1
            mark = "ok" if row.ok else "error"
            click.echo(
                f"rhino: [{count[0]}/{len(entries)}, {time.perf_counter() - start:.0f} s] "
                f"{mark} {_entry(row)}",
                err=True,
            )

        yield line
        return
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=stderr, transient=True) as progress:
        task = progress.add_task(f"planning {len(entries)} entries", total=len(entries))

        def on_row(_i: int, row: SweepRow) -> None:
            mark = "ok" if row.ok else "[red]error[/]"
            progress.console.print(f"{mark} {escape(_entry(row))}")
            progress.advance(task)

        yield on_row


def _entry(row: SweepRow) -> str:
    return f"{row.model} {row.mesh} {row.level} {row.cluster} memory={row.memory}"


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def render(rows: Sequence[SweepRow]) -> None:
    """The table on stdout, then each failure's message, then a count."""
    table = Table(title="sweep (predicted per training step; times in ms)", title_justify="left")
    for col in ("model", "mesh", "level", "cluster", "memory", "status"):
        table.add_column(col, overflow="fold", min_width=16 if col == "model" else len(col))
    for col in ("step", "compute", "comm", "peak mem", "search s", "gap", "nodes"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        budget = "unlimited" if r.budget_bytes is None else format_bytes(r.budget_bytes)
        status = "ok" if r.ok else "[red]error[/]"
        if r.ok and r.solver_status != "optimal":
            status = f"ok ({r.solver_status})"
        peak = "" if r.peak_memory_bytes is None else format_bytes(r.peak_memory_bytes)
        gap = "" if r.solver_gap is None else f"{r.solver_gap:.1%}"
        table.add_row(
            escape(r.model),
            r.mesh,
            r.level,
            escape(r.cluster),
            budget,
            status,
            _num(r.step_ms, ".4g"),
            _num(r.compute_ms, ".4g"),
            _num(r.comm_ms, ".4g"),
            peak,
            _num(r.search_s, ".1f"),
            gap,
            _num(r.nodes, "d"),
        )
    stdout.print(table)
    failed = [(i, r) for i, r in enumerate(rows, 1) if not r.ok]
    for i, r in failed:
        stdout.print(f"[red]error[/] in row {i} ({escape(_entry(r))}):", soft_wrap=True)
        stdout.print(indent(r.message, "  "), markup=False, soft_wrap=True)
    summary = f"{len(rows)} entries: {len(rows) - len(failed)} ok, {len(failed)} failed"
    stdout.print(summary if not failed else f"[red]{summary}[/]")
