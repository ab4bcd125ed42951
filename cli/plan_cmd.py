"""`rhino plan`: the best SPMD sharding plan for a mesh."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from rhino.cli.common import (
    debug_option,
    emit_json,
    handle_errors,
    human_bytes,
    json_option,
    status,
    stdout,
)
from rhino.hlo.errors import ConfigError
from rhino.hlo.parser import parse_file
from rhino.hlo.printer import print_module
from rhino.hlo.verify import verify
from rhino.search.cluster import load_cluster, parse_quantity
from rhino.search.mesh import DeviceMesh, parse_mesh
from rhino.search.meshsearch import MeshTrial, plan_best_mesh
from rhino.search.plan import Plan
from rhino.search.planner import LEVELS, PlanRequest, make_plan
from rhino.search.problem import SolveOptions
from rhino.search.spec import parse_spec

EPILOG = """
\b
Examples:
  rhino plan examples/gpt_tiny.hlo --mesh 1x8
  rhino plan model.hlo --mesh 2x4 --cluster h100x8 --memory 16GiB --out plan.json
  rhino plan model.hlo --mesh 1x4 --pin params_0_.1=RS1 --emit-hlo annotated.hlo
  rhino plan model.hlo --devices 8            # try 8, 2x4, 4x2; keep the best
  rhino plan model.hlo --mesh 2x4 --json | jq .objective_s
"""


@click.command("plan", epilog=EPILOG)
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--mesh", "mesh_text", help="Device mesh, outermost axis first: 8, 1x8, 2x4.")
@click.option(
    "--devices",
    type=click.IntRange(min=1),
    help="Try every 1-D and 2-D mesh of this many devices; keep the best.",
)
@click.option("--jobs", default=2, show_default=True, help="Worker processes for --devices.")
@click.option(
    "--opt",
    "level",
    default="O3",
    show_default=True,
    help=f"Search level: {', '.join(LEVELS)} (O3: whole-graph ILP).",
)
@click.option(
    "--cluster",
    default="m8",
    show_default=True,
    help="Cluster name (configs/clusters) or YAML file.",
)
@click.option(
    "--memory", help="Per-device memory budget, e.g. 16GiB (default: the cluster's device memory)."
)
@click.option("--no-memory-limit", is_flag=True, help="Plan without any memory budget.")
@click.option(
    "--time-limit",
    default=60.0,
    show_default=True,
    help="Solver time limit in seconds (best plan so far when hit).",
)
@click.option(
    "--pin",
    "pins",
    multiple=True,
    metavar="NAME=SPEC",
    help="Pin an instruction's result layout, e.g. w1=RS1. Repeatable.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the plan (versioned JSON) here.",
)
@click.option(
    "--emit-hlo",
    type=click.Path(dir_okay=False, writable=True),
    help="Write the HLO annotated with the plan's shardings.",
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
def plan_command(file: str, mesh_text: str | None, devices: int | None, jobs: int, level: str, cluster: str, memory: str | None, no_memory_limit: bool,
                 time_limit: float, pins: tuple[str, ...], out: str | None, emit_hlo: str | None, show_all: bool,
                 as_json: bool, debug: bool) -> None:  # fmt: skip
    """Find the SPMD sharding of every instruction that minimizes the step time on a
    device mesh within the device memory (Rhino §4), and report it."""
    if (mesh_text is None) == (devices is None):
        raise ConfigError("give either --mesh (e.g. --mesh 2x4) or --devices (e.g. --devices 8)")
    if pins and devices is not None:
        raise ConfigError("--pin needs a fixed --mesh (a pin names a layout per mesh axis)")
    mesh = parse_mesh(mesh_text) if mesh_text else DeviceMesh((devices or 1,))
    clus = load_cluster(cluster)
    budget = None if no_memory_limit else _budget(memory, clus.memory_bytes)
    request = PlanRequest(
        mesh, clus, level, budget, _pins(pins, mesh.ndim), SolveOptions(time_limit_s=time_limit)
    )
    trials: tuple[MeshTrial, ...] = ()
    with status(
        f"planning {file} on {mesh_text or f'{devices} devices'}", enabled=not as_json
    ) as update:
        module = parse_file(file)
        verify(module)
        if devices is not None:
            plan, trials = plan_best_mesh(
                print_module(module), file, devices, request, jobs=jobs, progress=update
            )
        else:
            plan = make_plan(module, request, progress=update)
    if out:
        plan.write(out)
    if emit_hlo:
        from rhino.runtime.apply import apply_plan

        Path(emit_hlo).write_text(print_module(apply_plan(module, plan)))
    if as_json:
        doc = {k: v for k, v in plan.to_dict().items() if k != "schema"}
        doc["meshes_tried"] = [
            {"mesh": list(t.mesh), "objective_s": t.objective_s, "error": t.error} for t in trials
        ]
        emit_json("plan", doc)
    else:
        render(file, plan, show_all, trials)


def _budget(memory: str | None, device_memory: float) -> float:
    if memory is None:
        return device_memory
    try:
        return parse_quantity(memory, "bytes")
    except ValueError as e:
        raise ConfigError(f"--memory {memory!r}: {e}") from None


def _pins(pins: tuple[str, ...], ndim: int) -> tuple[tuple[str, object], ...]:
    out = []
    for text in pins:
        name, sep, spec = text.partition("=")
        if not sep or not name:
            raise ConfigError(f"--pin {text!r}: expected NAME=SPEC, e.g. w1=RS1")
        out.append((name.lstrip("%"), parse_spec(spec, ndim)))
    return tuple(out)


def _ms(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} us"
    return f"{seconds * 1e3:.3f} ms"


def render(file: str, plan: Plan, show_all: bool, trials: tuple[MeshTrial, ...] = ()) -> None:
    out = stdout
    if trials:
        tried = Table(title="meshes tried", title_justify="left")
        for col in ("mesh", "estimated step", "note"):
            tried.add_column(col)
        for t in trials:
            best = " (best)" if t.mesh == plan.mesh else ""
            tried.add_row("x".join(map(str, t.mesh)), _ms(t.objective_s) if t.objective_s is not None else "-",
                          (t.error or "") + best)  # fmt: skip
        out.print(tried)
    mesh = "x".join(map(str, plan.mesh))
    out.print(f"[bold]{plan.module}[/] on mesh {mesh} ({plan.cluster}), level {plan.level}")
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_row("estimated step", _ms(plan.objective_s))
    t.add_row("  compute", _ms(plan.compute_s))
    for kind, seconds in plan.comm_by_kind.items():
        t.add_row(f"  {kind}", _ms(seconds))
    budget = f" (budget {human_bytes(plan.budget_bytes)})" if plan.budget_bytes else ""
    t.add_row("memory per device", human_bytes(plan.peak_memory_bytes) + budget)
    solver = plan.solver
    t.add_row("search", f"{plan.search_time_s:.1f} s, solver {solver['status']}, gap {solver['gap']:.2%}, "
                        f"{plan.problem.get('nodes', 0)} nodes, {plan.problem.get('edges', 0)} edges")  # fmt: skip
    out.print(t)
    table = Table(title="sharding (result = operands; one token per mesh axis: R replicated, S<d> split dim d)",
                  title_justify="left")  # fmt: skip
    for col in ("instruction", "opcode", "shape", "strategy"):
        table.add_column(col)
    for inst in plan.instructions:
        if show_all or inst.opcode in ("parameter", "dot", "convolution"):
            table.add_row(f"%{inst.name}", inst.opcode, inst.shape, inst.strategy)
    out.print(table)
    for w in plan.warnings:
        out.print(f"[yellow]warning:[/] {w}")
