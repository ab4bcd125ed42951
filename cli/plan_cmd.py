"""`rhino plan`: the best SPMD sharding plan for a mesh."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields

import click
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rhino.cli.common import (
    PIPE_WIDTH,
    SECONDS,
    cluster_option,
    debug_option,
    emit_json,
    handle_errors,
    input_argument,
    json_option,
    load_input,
    mesh_option,
    opt_option,
    prepare_output,
    save_output,
    status,
    stderr,
    stdout,
)
from rhino.cli.flags import in_flags
from rhino.hlo.errors import ConfigError
from rhino.hlo.printer import print_module
from rhino.hlo.verify import verify
from rhino.search.cluster import load_cluster, parse_quantity
from rhino.search.mesh import DeviceMesh, parse_mesh
from rhino.search.problem import SolveOptions
from rhino.search.spmd.meshsearch import MeshTrial, plan_best_mesh
from rhino.search.spmd.pins import check_pins, pin_from_text, read_pins_file
from rhino.search.spmd.plan import Plan, mesh_use
from rhino.search.spmd.planner import PlanRequest, make_plan
from rhino.search.units import format_bytes, format_seconds

MERGE_LEVELS = {
    0: "whole graph",
    1: "cones merged, nothing left",
    2: "one ILP over the merged graph",
    3: "segments between critical nodes",
}

SHARDING = (
    "sharding (result = operands; one token per mesh axis: R replicated, S<d> split dim d)",
    ("instruction", "opcode", "shape", "strategy"),
)
"""The title and columns of the table of instructions."""

EPILOG = """
\b
Examples:
  rhino plan examples/gpt_tiny.hlo --mesh 1x8
  rhino plan model.hlo --mesh 2x8 --opt O3 --time-limit 300   # whole-graph ILP
  rhino plan model.hlo --mesh 2x4 --cluster h100x8 --memory 16GiB --out plan.json
  rhino plan model.hlo --mesh 1x4 --pin params_0_.1=RS1 --emit-hlo annotated.hlo
  rhino plan model.hlo --mesh 2x4 --emit-stablehlo plan.mlir   # for Shardy (jax's)
  rhino plan model.hlo --mesh 1x8 --pins pins.yaml   # pins.yaml: {params_0_.1: RS1}
  rhino plan step.hlo --mesh 2x4 --emit-shardings specs.json --axis-names data,model
  rhino plan model.hlo --devices 8            # try 8, 2x4, 4x2; keep the best
  rhino plan model.hlo --mesh 2x4 --json | jq .objective_s
"""


@click.command("plan", epilog=EPILOG)
@input_argument
@mesh_option("Device mesh, outermost axis first: 8, 1x8, 2x4.")
@click.option(
    "--devices",
    type=click.IntRange(min=1),
    help="Try every 1-D and 2-D mesh of this many devices; keep the best.",
)
@click.option(
    "--jobs",
    default=2,
    show_default=True,
    type=click.IntRange(min=1),
    help="Worker processes for --devices.",
)
@opt_option(
    "Search level. O2: cones merged exactly, then one ILP over them or, for large "
    "graphs, segments between critical nodes solved by ILP and refined (seconds on 40k "
    "instructions; a memory budget is met by pricing memory into the search, the "
    "budget's rows relaxed into node costs). "
    "O3: one ILP over the whole graph (optimal when it finishes; slow on large graphs).",
)
@cluster_option()
@click.option(
    "--memory", help="Per-device memory budget, e.g. 16GiB (default: the cluster's device memory)."
)
@click.option("--no-memory-limit", is_flag=True, help="Plan without any memory budget.")
@click.option(
    "--time-limit",
    default=60.0,
    show_default=True,
    type=SECONDS,
    help="Solver time limit in seconds (best plan so far when hit).",
)
@click.option(
    "--pin",
    "pins",
    multiple=True,
    metavar="NAME=SPEC",
    help="Pin an instruction's result layout, e.g. w1=RS1. Repeatable; wins over --pins.",
)
@click.option(
    "--pins",
    "pins_file",
    type=click.Path(dir_okay=False),
    help="YAML mapping of instruction name to layout (e.g. `w1: RS1`); pins them all.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True),
    callback=prepare_output,
    help="Write the plan (versioned JSON) here.",
)
@click.option(
    "--emit-hlo",
    type=click.Path(dir_okay=False, writable=True),
    callback=prepare_output,
    help="Write the HLO that realizes the plan (what `rhino run --partitioner gspmd` "
    "compiles): the plan's shardings, and its conversion paths and loop layouts pinned by "
    "Sharding constraints.",
)
@click.option(
    "--emit-stablehlo",
    type=click.Path(dir_okay=False, writable=True),
    callback=prepare_output,
    help="Write the plan as StableHLO for Shardy, jax's partitioner (what `rhino run` "
    "compiles by default): an sdy.mesh of the plan's mesh (axes axis_0, axis_1, ...), "
    "sdy.sharding on @main's arguments and results, and a sdy.sharding_constraint on every "
    "value the plan fixes, its conversion paths included.",
)
@click.option(
    "--emit-shardings",
    type=click.Path(dir_okay=False, writable=True),
    callback=prepare_output,
    help="Write every entry parameter's PartitionSpec (JSON, schema rhino.shardings/1), "
    "keyed by its JAX pytree path (`params['dense']['kernel']`: the parameter's "
    'metadata op_name, which jax prints with `as_text(dialect="hlo", debug_info=True)`; '
    "else the parameter's name), with the mesh's shape and axis names.",
)
@click.option(
    "--axis-names",
    metavar="A,B",
    help="Mesh axis names for --emit-shardings, outermost first (default: axis_0,axis_1,...).",
)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="List every instruction, not only parameters and dots/convolutions.",
)
@json_option
@debug_option
@handle_errors
def plan_command(
    file: str,
    module_name: str | None,
    mesh_text: str | None,
    devices: int | None,
    jobs: int,
    level: str,
    cluster: str,
    memory: str | None,
    no_memory_limit: bool,
    time_limit: float,
    pins: tuple[str, ...],
    pins_file: str | None,
    out: str | None,
    emit_hlo: str | None,
    emit_shardings: str | None,
    axis_names: str | None,
    emit_stablehlo: str | None,
    show_all: bool,
    as_json: bool,
    debug: bool,
) -> None:
    """Find the SPMD sharding of every instruction that minimizes the step time on a
    device mesh within the device memory (Rhino §4), and report it."""
    if (mesh_text is None) == (devices is None):
        raise ConfigError("give either --mesh (e.g. --mesh 2x4) or --devices (e.g. --devices 8)")
    if axis_names is not None and emit_shardings is None:
        raise ConfigError("--axis-names names the mesh axes of --emit-shardings; give both")
    if (pins or pins_file) and devices is not None:
        flag = "--pin" if pins else "--pins"
        raise ConfigError(f"{flag} needs a fixed --mesh (a pin names a layout per mesh axis)")
    mesh = parse_mesh(mesh_text) if mesh_text is not None else DeviceMesh((devices or 1,))
    if emit_shardings and mesh_text is not None:
        _axis_names(axis_names, mesh.ndim)  # refused before the search, not after
    clus = load_cluster(cluster)
    budget = None if no_memory_limit else _budget(memory, clus.memory_bytes)
    given = (read_pins_file(pins_file, mesh.ndim) if pins_file else []) + [
        pin_from_text(text, mesh.ndim, f"--pin {text}") for text in pins
    ]
    chosen = {p.name: p for p in given}  # a --pin wins over the file's pin of the same name
    request = PlanRequest(
        mesh,
        clus,
        level,
        budget,
        tuple((p.name, p.spec) for p in chosen.values()),
        SolveOptions(time_limit_s=time_limit),
    )
    trials: tuple[MeshTrial, ...] = ()
    with status(
        f"planning {file} on {mesh_text or f'{devices} devices'}",
        enabled=not as_json,
        limit_s=time_limit,
    ) as update:
        loaded = load_input(file, module_name)
        module = loaded.module
        verify(module)
        check_pins(chosen.values(), module, mesh, file)
        if devices is not None:
            plan, trials = plan_best_mesh(
                print_module(module), file, devices, request, jobs=jobs, progress=update
            )
        else:
            plan = make_plan(module, request, progress=update)
    if out:
        save_output(out, plan.text(), "plan")
    emitted: dict[str, object] | None = None
    shown: set[str] = set()  # notes already printed
    if emit_hlo:
        from rhino.runtime.spmd.apply import realized_program

        program, notes = realized_program(module, plan)  # `rhino run --partitioner gspmd`'s
        save_output(emit_hlo, print_module(program), "realized HLO")
        emitted = {"path": emit_hlo, "notes": list(notes)}
        if not as_json:
            for note in notes:
                stderr.print(f"note: {escape(note)}")
        shown.update(notes)
    shardings: dict[str, object] | None = None
    if emit_shardings:
        from rhino.runtime.spmd.boundary import boundary, shardings_document

        names = _axis_names(axis_names, plan.mesh.ndim)
        found = boundary(module, plan)
        document = shardings_document(found, plan, names)
        save_output(emit_shardings, json.dumps(document, indent=1) + "\n", "shardings")
        if not as_json:
            for x in found.inputs:
                if x.note:
                    stderr.print(f"note: {escape(x.key)}: {escape(x.note)}")
        shardings = {"path": emit_shardings, "parameters": len(document["partition_specs"])}
    emitted_mlir: dict[str, object] | None = None
    if emit_stablehlo:
        from rhino.runtime.spmd.apply import realized_stablehlo

        text, notes = realized_stablehlo(module, plan)  # what `rhino run` compiles
        save_output(emit_stablehlo, text, "realized StableHLO")
        emitted_mlir = {"path": emit_stablehlo, "notes": list(notes)}
        if not as_json:  # --emit-hlo's notes (once), and Shardy's own
            for note in notes:
                if note not in shown:
                    stderr.print(f"note: {escape(note)}")
    if as_json:
        doc = {f.name: getattr(plan, f.name) for f in fields(plan)}  # emit_json makes it JSON
        doc["input"] = loaded.to_json()
        if emitted is not None:
            doc["emitted_hlo"] = emitted
        if shardings is not None:
            doc["emitted_shardings"] = shardings
        if emitted_mlir is not None:
            doc["emitted_stablehlo"] = emitted_mlir
        doc["meshes_tried"] = [
            {
                "mesh": t.mesh.to_json(),
                "objective_s": t.objective_s,
                "error": t.error,
                "search_time_s": t.seconds,
            }
            for t in trials
        ]
        emit_json("plan", doc)
    else:
        render(file, plan, show_all, trials)


def _axis_names(text: str | None, ndim: int) -> tuple[str, ...]:
    """The mesh axis names of --axis-names (`data,model`), one per mesh axis."""
    if text is None:
        return tuple(f"axis_{a}" for a in range(ndim))
    names = tuple(n.strip() for n in text.split(","))
    if len(names) != ndim or not all(names):
        raise ConfigError(
            f"--axis-names {text!r}: expected {ndim} comma-separated names, one per mesh axis"
        )
    return names


def _budget(memory: str | None, device_memory: float) -> float:
    if memory is None:
        return device_memory
    try:
        return parse_quantity(memory, "bytes")
    except ValueError as e:
        raise ConfigError(f"--memory {memory!r}: {e}") from None


def render(file: str, plan: Plan, show_all: bool, trials: tuple[MeshTrial, ...] = ()) -> None:
    out = stdout
    if trials:
        tried = Table(title="meshes tried", title_justify="left")
        for col in ("mesh", "estimated step", "search", "note"):
            tried.add_column(col)
        for trial in trials:
            best = "(best)" if trial.mesh == plan.mesh else ""
            tried.add_row(
                str(trial.mesh),
                format_seconds(trial.objective_s) if trial.objective_s is not None else "-",
                f"{trial.seconds:.1f} s",
                " ".join(note for note in (trial.error, best) if note),
            )
        out.print(tried)
    out.print(f"[bold]{plan.module}[/] on mesh {plan.mesh} ({plan.cluster}), level {plan.level}")
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_row("estimated step", format_seconds(plan.objective_s))
    t.add_row("  compute", format_seconds(plan.compute_s))
    for kind, seconds in plan.comm_by_kind.items():
        t.add_row(f"  {kind}", format_seconds(seconds))
    budget = f" (budget {format_bytes(plan.budget_bytes)})" if plan.budget_bytes else ""
    t.add_row("memory per device", format_bytes(plan.peak_memory_bytes) + budget)
    t.add_row("useful work", f"{mesh_use(plan).share:.0%} of the devices' compute")
    solver = plan.solver
    gap = "no bound" if solver.merge_level == 3 else f"gap {solver.gap:.2%}"
    t.add_row(
        "search",
        f"{plan.search_time_s:.1f} s, solver {solver.status.value}, {gap}, "
        f"{plan.problem.get('nodes', 0)} nodes, {plan.problem.get('edges', 0)} edges",
    )
    if solver.merge_level is not None:
        counts = solver.sizes.measured() if solver.sizes is not None else {}
        sizes = ", ".join(
            f"{v} {k.replace('_', ' ')}"
            + (f" ({v / counts['nodes']:.1%})" if k == "critical" and counts.get("nodes") else "")
            for k, v in counts.items()
        )
        level = solver.merge_level
        t.add_row("  merging", f"level {level} ({MERGE_LEVELS.get(level, '?')}): {sizes}")
        phases = ", ".join(f"{k} {v:.2f} s" for k, v in (solver.phases_s or {}).items())
        t.add_row("  phases", phases)
    combined = solver.combined
    if combined and plan.combined_latency_s:
        groups = len({c.group for c in plan.collectives if c.group >= 0})
        closed = ", ".join(combined.closed) or "none"
        t.add_row(
            "  combined",
            f"{groups} groups of collectives XLA merges, {format_seconds(plan.combined_latency_s)} "
            f"of latency; {combined.plans} plans made, not combined: {closed}",
        )
    found = solver.budget_search
    if found:
        if found.solves <= 1:
            text = f"did not bind (the plan without it peaks at {format_bytes(found.free_peak)})"
        else:
            text = (
                f"binds (the plan without it peaks at {format_bytes(found.free_peak)}); "
                f"{found.solves} O2 solves with memory priced in"
                + (", none fit: the smallest layouts, improved" if found.fallback else "")
            )
        t.add_row("  budget", text)
    out.print(t)
    rows = [
        (f"%{inst.name}", inst.opcode, inst.shape, inst.strategy)
        for inst in plan.instructions
        if show_all or inst.opcode in ("parameter", "dot", "convolution")
    ]
    drawn = None if out.is_terminal or out.color_system else _drawn_table(SHARDING, rows)
    if drawn is not None:
        out.file.write(drawn)
    else:
        table = Table(title=SHARDING[0], title_justify="left")
        for col in SHARDING[1]:
            table.add_column(col)
        for row in rows:  # as text: a strided layout's `[s=2]` is no markup
            table.add_row(*map(Text, row))
        out.print(table)
    for note in plan.notes:
        out.print(f"[dim]note:[/] {escape(note)}")
    for w in plan.warnings:
        out.print(f"[yellow]warning:[/] {in_flags(w)}")


def _drawn_table(
    head: tuple[str, tuple[str, ...]], rows: Sequence[tuple[str, ...]], width: int = PIPE_WIDTH
) -> str | None:
    """The table (title, columns; `rows`) as rich draws it off a terminal, without colour,
    `width` columns wide: drawn line by line here, as rich takes about a millisecond a
    row (seconds for the thousands of parameters and dots of a large model). None where
    rich would fold a line (a title wider than the table, a table wider than `width`) or
    measure a cell otherwise (a character that is not printable ASCII): rich draws those."""
    title, columns = head
    if not all(cell.isascii() and cell.isprintable() for row in rows for cell in row):
        return None
    widths = [max([len(col), *(len(row[i]) for row in rows)]) for i, col in enumerate(columns)]
    total = sum(widths) + 3 * len(widths) + 1
    if len(title) > total or total > width:
        return None

    def line(left: str, fill: str, cross: str, right: str) -> str:
        return left + cross.join(fill * (w + 2) for w in widths) + right + "\n"

    def cells(bar: str, row: tuple[str, ...]) -> str:
        return bar + bar.join(f" {cell:<{w}} " for cell, w in zip(row, widths, strict=True)) + bar

    return "".join(
        [
            title.ljust(total) + "\n",
            line("┏", "━", "┳", "┓"),
            cells("┃", columns) + "\n",
            line("┡", "━", "╇", "┩"),
            *(cells("│", row) + "\n" for row in rows),
            line("└", "─", "┴", "┘"),
        ]
    )
