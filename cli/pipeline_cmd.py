"""`rhino pipeline`: pipeline stages of a training step (Rhino §5), with a schedule."""

from __future__ import annotations

import click
from rich.table import Table

from rhino.cli.common import (
    SECONDS,
    cluster_option,
    debug_option,
    emit_json,
    gantt_option,
    handle_errors,
    input_argument,
    json_option,
    load_input,
    mesh_option,
    prepare_output,
    save_output,
    status,
    stdout,
)
from rhino.cli.pipeline_draw import check_picture_path, write_dot, write_gantt
from rhino.hlo.errors import ConfigError
from rhino.hlo.verify import verify
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.pipeline import EPSILON, PipelinePlan, PipelineRequest, plan_pipeline
from rhino.search.pipeline.stats import StageSolveStats
from rhino.search.problem import SolveOptions
from rhino.search.units import format_bytes, format_seconds

EPILOG = """
\b
Examples:
  rhino pipeline examples/gpt_tiny.hlo --stages 4
  rhino pipeline examples/unet_tiny.hlo --stages 4 --epsilon 0.2 --out stages.json
  rhino pipeline model.hlo --stages 8 --microbatches 16 --cluster h100x8 --time-limit 60
  rhino pipeline examples/gpt_tiny.hlo --stages 2 --gantt schedule.svg --dot stages.dot
  rhino pipeline model.hlo --stages 4 --json | jq .cut_bytes
  rhino pipeline examples/gpt_tiny.hlo --mesh 2x4 --out stages.json   # hybrid, 2 stages
  rhino pipeline examples/gpt_tiny.hlo --compare 8    # SPMD, pipeline or hybrid on 8?
"""


@click.command("pipeline", epilog=EPILOG)
@input_argument
@click.option("--stages", type=int, help="Number of pipeline stages d (default: --mesh's axis 0).")
@mesh_option(
    "Hybrid: the job's mesh, e.g. 2x4: stages on axis 0, each stage's programs "
    "sharded over the others when `rhino run` runs the plan."
)
@click.option(
    "--epsilon",
    default=None,
    type=float,
    help="Balance tolerance: every stage's forward compute is within (1 +- epsilon) x the "
    "average. Default: 0.1, or, where no plan meets it (one instruction holds most of the "
    "compute), the least wider one that has a plan (reported).",
)
@click.option(
    "--microbatches",
    default=8,
    show_default=True,
    type=int,
    help="Micro-batches per step, for the schedules.",
)
@cluster_option()
@click.option(
    "--time-limit",
    default=20.0,
    show_default=True,
    type=SECONDS,
    help="Stage ILP time limit in seconds (the best plan so far when hit).",
)
@click.option(
    "--no-tightening",
    is_flag=True,
    help="Solve the stage ILP without bound tightening (slower; for comparison).",
)
@click.option("--loss", help="Name of the loss instruction (default: found from the graph).")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True),
    callback=prepare_output,
    help="Write the stage plan (versioned JSON) here.",
)
@gantt_option("Draw the 1F1B schedule (stages x time) to this .svg (or .png) file.")
@click.option(
    "--dot",
    type=click.Path(dir_okay=False, writable=True),
    callback=prepare_output,
    help="Write the graph coloured by stage as Graphviz DOT to this file.",
)
@click.option(
    "--compare",
    "compare_devices",
    type=click.IntRange(min=2),
    help="Estimate pure SPMD, pure pipeline and hybrid layouts of this many devices "
    "(Rhino §3) and report the best, instead of planning one stage count.",
)
@json_option
@debug_option
@handle_errors
def pipeline_command(
    file: str,
    module_name: str | None,
    stages: int | None,
    mesh_text: str | None,
    epsilon: float | None,
    microbatches: int,
    cluster: str,
    time_limit: float,
    no_tightening: bool,
    loss: str | None,
    out: str | None,
    gantt: str | None,
    dot: str | None,
    compare_devices: int | None,
    as_json: bool,
    debug: bool,
) -> None:
    """Split a single-device training step into pipeline stages: forward instructions
    placed by an ILP that minimizes the bytes sent between stages at balanced compute
    (Rhino §5, with bound tightening), backward and update mirrored onto the stage of
    what they differentiate or update; report per-stage compute, memory and sends, and
    the step time under 1F1B and GPipe."""
    if compare_devices is not None:
        if stages is not None or mesh_text is not None or out or gantt or dot:
            raise ConfigError(
                "--compare estimates every layout; it takes no --stages, --mesh, "
                "--out, --gantt or --dot"
            )
        compare(
            file, module_name, compare_devices, microbatches, epsilon, cluster, time_limit, as_json
        )
        return
    mesh = parse_mesh(mesh_text) if mesh_text is not None else None
    if stages is None:
        if mesh is None:
            raise ConfigError("give --stages (or --mesh, whose axis 0 holds the stages)")
        stages = mesh.shape[0]
    if stages < 1:
        raise ConfigError(f"--stages {stages}: need at least 1 stage")
    if gantt:
        check_picture_path(gantt)
    request = PipelineRequest(
        stages,
        epsilon,
        microbatches,
        load_cluster(cluster),
        SolveOptions(time_limit_s=time_limit),
        not no_tightening,
        loss,
        mesh,
    )
    with status(
        f"pipelining {file} into {stages} stages", enabled=not as_json, limit_s=time_limit
    ) as update:
        loaded = load_input(file, module_name)
        module = loaded.module
        verify(module)
        plan = plan_pipeline(module, request, progress=update)
    if out:
        save_output(out, plan.text(), "stage plan")
    if gantt:
        write_gantt(
            plan.timelines["1f1b"],
            gantt,
            f"{plan.module}: {stages} stages, {microbatches} micro-batches, 1F1B",
        )
    if dot:
        write_dot(plan, module, dot)
    if as_json:
        emit_json("pipeline", {**plan.to_json(), "input": loaded.to_json()})
    else:
        render(file, plan, widened=epsilon is None)


def compare(
    file: str,
    module_name: str | None,
    devices: int,
    microbatches: int,
    epsilon: float | None,
    cluster: str,
    time_limit: float,
    as_json: bool,
) -> None:
    """`--compare N`: every layout of N devices estimated, the best one named."""
    from rhino.runtime.pipeline.controller import compare_layouts
    from rhino.search.mesh import DeviceMesh
    from rhino.search.spmd.planner import PlanRequest

    request = PlanRequest(
        DeviceMesh((devices,)), load_cluster(cluster), solve=SolveOptions(time_limit_s=time_limit)
    )
    with status(f"comparing layouts of {file} on {devices} devices", enabled=not as_json):
        loaded = load_input(file, module_name)
        module = loaded.module
        verify(module)
        found = compare_layouts(
            module, devices, request, microbatches=microbatches, epsilon=epsilon
        )
    best = found.best
    if as_json:
        emit_json(
            "pipeline.compare",
            {
                "devices": devices,
                "microbatches": microbatches,
                "best": best.to_json() if best else None,
                "candidates": [c.to_json() for c in found.candidates],
                "input": loaded.to_json(),
            },
        )
        return
    table = Table(
        title=f"{module.name} on {devices} devices ({cluster}): estimated step time",
        title_justify="left",
    )
    for col in ("layout", "mesh", "step", "how"):
        table.add_column(col, justify="right" if col == "step" else "left")
    for c in found.candidates:
        mark = " (best)" if c is best else ""
        step = "-" if c.step_s is None else format_seconds(c.step_s)
        table.add_row(c.kind + mark, str(c.mesh), step, c.note)
    stdout.print(table)


def _solved(solver: StageSolveStats) -> str:
    """How the ILP ran: its size, or that the stages' least receipts proved the start."""
    least = format_bytes(float(solver.receipt_bound))
    if not solver.ran_cpsat and solver.receipt_bound > 0:
        return f"the start plan meets the stages' least receipts ({least}): no ILP run"
    return f"{solver.variables} variables, least receipts {least}"


def render(file: str, plan: PipelinePlan, *, widened: bool = False) -> None:
    out = stdout
    out.print(
        f"[bold]{plan.module}[/] ({file}) in {plan.stages} stages, {plan.microbatches} "
        f"micro-batches ({plan.cluster})"
    )
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_row(
        "loss",
        f"%{plan.loss} (its forward holds {plan.forward_share:.0%} of the step's "
        "dot and convolution FLOPs)",
    )
    t.add_row(
        "cut (forward)",
        f"{format_bytes(plan.cut_bytes)} per step "
        f"(bound {format_bytes(plan.bound_bytes)}, gap {plan.gap:.2%}, {plan.status}, "
        f"from {plan.method})",
    )
    note = f"; widened: no plan has {EPSILON:g}" if widened and plan.epsilon > EPSILON else ""
    t.add_row(
        "imbalance",
        f"{plan.imbalance:.1%}: the stage farthest from the average "
        f"(epsilon {plan.epsilon:g}{note})",
    )
    for name, sched in plan.schedules.items():
        peaks = sched.peak_activation_bytes
        t.add_row(
            f"step ({name})",
            f"{format_seconds(sched.step_s)}, bubble "
            f"{sched.simulated_bubble_fraction:.1%} simulated ((p-1)/(m+p-1) "
            f"= {sched.bubble_fraction:.1%} with equal stages and free sends), "
            f"peak activations {format_bytes(max(peaks, default=0))} "
            f"(stage {peaks.index(max(peaks))})",
        )
    steps = {name: sched.step_s for name, sched in plan.schedules.items()}
    if steps.get("1f1b", 0.0) > 1.05 * steps.get("gpipe", float("inf")):
        t.add_row(
            "",
            "1F1B is slower than GPipe here: it has at most p micro-batches in flight, "
            "so each waits for the round trip of its sends between stages, which outweigh "
            "the stages' compute at this size; GPipe streams every forward first, holding "
            "all m micro-batches' activations",
        )
    solver = plan.solver
    t.add_row(
        "search",
        f"{plan.search_time_s:.2f} s; {solver.nodes} forward instructions, "
        f"{solver.reduced_nodes} after exact reductions, "
        f"{solver.fixed} of them fixed by bound tightening "
        f"({'on' if plan.tightening else 'off'}), {_solved(solver)}",
    )
    out.print(t)
    out.print(_stage_table(plan))
    base = Table(
        title="baselines (consecutive ranges of a topological order)", title_justify="left"
    )
    for col in ("plan", "cut bytes", "imbalance", "within epsilon"):
        base.add_column(col)
    base.add_row("rhino (ILP)", format_bytes(plan.cut_bytes), f"{plan.imbalance:.1%}", "yes")
    for b in plan.baselines:
        base.add_row(
            b.name,
            "-" if b.cut_bytes is None else format_bytes(b.cut_bytes),
            "-" if b.imbalance is None else f"{b.imbalance:.1%}",
            "yes" if b.within_balance else "no",
        )
    out.print(base)


def _stage_table(plan: PipelinePlan) -> Table:
    table = Table(
        title="stages: fwd/bwd/upd forward, backward, update compute per step; opt. optimizer "
        "state; act./mb activations stored per micro-batch",
        title_justify="left",
    )
    for col in (
        "stage",
        "fwd",
        "bwd",
        "upd",
        "weights",
        "opt.",
        "act./mb",
        "peak 1F1B",
        "sends (to stage: bytes)",
    ):
        table.add_column(col, justify="left" if col.startswith("sends") else "right")
    for r in plan.stage_reports:
        sends = "\n".join(f"{k}: {format_bytes(v)}" for k, v in r.sent_bytes.items()) or "-"
        table.add_row(
            str(r.stage),
            format_seconds(r.forward_s),
            format_seconds(r.backward_s),
            format_seconds(r.update_s),
            format_bytes(r.parameter_bytes),
            format_bytes(r.optimizer_bytes),
            format_bytes(r.activation_bytes),
            format_bytes(r.peak_activation_bytes["1f1b"]),
            sends,
        )
    return table
