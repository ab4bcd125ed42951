"""`rhino parse`: what is in this HLO graph?"""

from __future__ import annotations

from pathlib import Path

import click

from rhino.cli.common import (
    debug_option,
    emit_json,
    handle_errors,
    human_count,
    input_argument,
    json_option,
    load_input,
    prepare_output,
    save_output,
    status,
)
from rhino.hlo.analysis import ModuleSummary, summarize
from rhino.hlo.collector import collector_paused
from rhino.hlo.verify import verify
from rhino.search.units import format_bytes

EPILOG = """
\b
Examples:
  rhino parse examples/gpt_tiny.hlo
  rhino parse model.hlo.gz --json | jq .total_flops
  rhino parse model.hlo --emit reprinted.hlo --dot entry.dot
  cat model.hlo | rhino parse -
  rhino parse step.stablehlo.mlir          # jax.jit(step).lower(...).as_text()
  rhino parse dump/ --json | jq .input     # an XLA_FLAGS=--xla_dump_to=dump/ folder
"""


@click.command("parse", epilog=EPILOG)
@input_argument
@click.option(
    "--emit",
    type=click.Path(dir_okay=False, writable=True),
    callback=prepare_output,
    help="Write the reprinted HLO to this file.",
)
@click.option(
    "--dot",
    "dot_file",
    type=click.Path(dir_okay=False, writable=True),
    callback=prepare_output,
    help="Write a Graphviz view of the entry computation.",
)
@click.option(
    "--top", default=10, show_default=True, help="How many of the largest tensors to list."
)
@json_option
@debug_option
@handle_errors
def parse_command(
    file: str,
    module_name: str | None,
    emit: str | None,
    dot_file: str | None,
    top: int,
    as_json: bool,
    debug: bool,
) -> None:
    """Summarize an HLO module: computations, instructions, opcodes, parameter bytes,
    FLOPs (while loops weighted by their trip count), largest tensors, loops.

    FILE is HLO text as XLA or JAX prints it (pre- or post-optimization), StableHLO
    text (`jax.jit(f).lower(...).as_text()`), a serialized HloModuleProto (`.pb`), an
    XLA dump folder (`--xla_dump_to`), any file `.gz`, or `-` for standard input. Every
    attribute is checked, and the module verified.
    """
    with collector_paused():  # the module's objects: millions, none freed
        with status(f"parsing {file}", enabled=not as_json):
            loaded = load_input(file, module_name, lazy=False)
            module = loaded.module
            verify(module)
            summary = summarize(module, top=top)
        if emit:
            from rhino.hlo.printer import print_module

            save_output(emit, print_module(module), "reprinted module")
        if dot_file:
            from rhino.hlo.dot import entry_to_dot

            save_output(dot_file, entry_to_dot(module), "Graphviz view")
        if as_json:
            emit_json("parse", {"file": file, "input": loaded.to_json(), **summary.__dict__})
        else:
            picked = f": {Path(loaded.source).name}" if loaded.kind == "xla-dump" else ""
            render(file + picked, summary)


def render(file: str, s: ModuleSummary) -> None:
    from rich.table import Table  # not needed for --json

    from rhino.cli.common import stdout

    out = stdout
    out.print(f"[bold]{s.name}[/]  ({file})")
    facts = Table(show_header=False, box=None, pad_edge=False)
    facts.add_row("computations", str(s.computations))
    facts.add_row(
        "instructions", f"{s.instructions} ({s.entry_instructions} in the entry computation)"
    )
    facts.add_row("parameters", f"{s.parameters} ({format_bytes(s.parameter_bytes)})")
    facts.add_row("outputs", format_bytes(s.output_bytes))
    facts.add_row(
        "FLOPs",
        human_count(s.total_flops)
        + "FLOP"
        + (" (loops weighted by trip count)" if s.while_loops else ""),
    )
    facts.add_row("bytes accessed", format_bytes(s.total_bytes))
    if s.fusions:
        facts.add_row("fusions", str(s.fusions))
    if s.unknown_opcodes:
        facts.add_row("[yellow]unmodelled opcodes[/]", ", ".join(s.unknown_opcodes))
    out.print(facts)
    hist = Table(title="opcodes", title_justify="left")
    hist.add_column("opcode")
    hist.add_column("count", justify="right")
    for op, n in list(s.opcode_histogram.items())[:25]:
        hist.add_row(op, str(n))
    if len(s.opcode_histogram) > 25:
        hist.add_row(f"... {len(s.opcode_histogram) - 25} more", "")
    out.print(hist)
    big = Table(title="largest tensors", title_justify="left")
    for col in ("instruction", "opcode", "shape", "size"):
        big.add_column(col, justify="right" if col == "size" else "left")
    for t in s.largest_tensors:
        big.add_row(f"%{t.name}", t.opcode, t.shape, format_bytes(t.bytes))
    out.print(big)
    if s.while_loops:
        loops = Table(title="while loops", title_justify="left")
        for col in ("instruction", "body", "body size", "trip count"):
            loops.add_column(col)
        for lp in s.while_loops:
            trips = (
                f"{lp.trip_count} ({lp.trip_count_source})"
                if lp.trip_count is not None
                else "unknown (counted once)"
            )
            loops.add_row(f"%{lp.name}", lp.body, str(lp.body_instructions), trips)
        out.print(loops)
