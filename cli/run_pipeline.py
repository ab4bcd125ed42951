"""`rhino run FILE --plan stages.json`: a stage plan (from `rhino pipeline --out`) run
stage by stage, verified, timed, and set against its prediction."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from rhino.cli.common import emit_json, stdout
from rhino.cli.pipeline_draw import write_charts
from rhino.hlo.errors import ConfigError, VerificationFailed
from rhino.hlo.ir import Module
from rhino.runtime import xla_bridge as xb
from rhino.runtime.job import Job
from rhino.runtime.pipeline_run import PipelineOptions, PipelineReport, run_pipeline
from rhino.runtime.stage_programs import StagePlan
from rhino.search.cluster import load_cluster
from rhino.search.mesh import DeviceMesh, parse_mesh
from rhino.search.pipeline import check_pipeline_mesh
from rhino.search.pipeline.schedule import Timeline
from rhino.search.spmd.planner import PlanRequest
from rhino.search.units import format_bytes, format_seconds

GANTT_WIDTH = 60
"""Characters of the text timeline."""

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
"""Coordinator hosts under which a stage plan runs as several processes."""


def run_stage_plan(
    module: Module,
    plan_file: str,
    options: PipelineOptions,
    devices: int | None,
    mesh_text: str | None,
    cluster: str,
    level: str,
    job: Job | None = None,
) -> PipelineReport:
    """Run the stage plan in `plan_file`: stage s on device s, or, with a mesh (`--mesh`,
    else the plan's), on the s-th block of the devices of mesh axis 0, its programs sharded over the other axes
    by plans made for them (`--opt` level `level` on `cluster`). In a `job` of several
    processes (on one machine) the stages span all of their devices (--devices per
    process), and arrays move between processes through jax's transfer server, at the
    coordinator's port plus 1 + process id on the coordinator's (loopback) host."""
    plan = StagePlan.read(plan_file)
    spmd = None
    per_stage = 1
    # --mesh, else the mesh the plan was made for (`rhino pipeline --mesh`)
    mesh = parse_mesh(mesh_text) if mesh_text is not None else None
    if mesh is None and plan.mesh is not None:
        mesh = DeviceMesh(plan.mesh)
    if mesh is not None:
        check_pipeline_mesh(mesh.shape, plan.stages)
        if mesh.ndim > 1 and mesh.size > plan.stages:
            spmd = PlanRequest(DeviceMesh(mesh.shape[1:]), load_cluster(cluster), level)
            per_stage = spmd.mesh.size
    need = plan.stages * per_stage
    processes = job.num_processes if job else 1
    if devices is not None and devices * processes < need:
        raise ConfigError(
            f"the stage plan has {plan.stages} stages of {per_stage} device(s), "
            f"but --devices {devices} x {processes} process(es): need {need} "
            "devices"
        )
    if job is None:
        return run_pipeline(module, plan, options, spmd)
    host, port = job.coordinator.rsplit(":", 1)
    if host not in LOOPBACK:
        raise ConfigError(
            f"--coordinator {job.coordinator}: a stage plan runs as several "
            "processes on one machine only for now (coordinator on 127.0.0.1 or "
            "localhost): arrays cross processes through transfer servers on the "
            "coordinator's host"
        )
    address = f"{host}:{int(port) + 1 + job.process_id}"
    with xb.native_stdout_to_stderr():
        xb.init_distributed(
            job.coordinator, job.num_processes, job.process_id, transfer_address=address
        )
        try:
            return run_pipeline(module, plan, options, spmd)
        finally:
            xb.shutdown_distributed()


def show_stage_run(report: PipelineReport, as_json: bool, gantt: str | None = None) -> None:
    """Render (and draw the timelines to `gantt`), then raise VerificationFailed (exit 1)
    when an output differs."""
    if gantt:
        write_timelines(report, gantt)
    if as_json:
        emit_json("run.pipeline", report.to_json())
    else:
        render(report)
    if not report.ok:
        raise VerificationFailed(report.verify["summary"] if report.verify else "failed")


def render(report: PipelineReport) -> None:
    out = stdout
    per_stage = len(report.devices) // report.stages
    if report.process_count > 1:
        out.print(
            f"process {report.process_index} of {report.process_count}: stages "
            f"{', '.join(map(str, report.local_stages))}; verification, times, order "
            "and bytes below are theirs"
        )
    where = f"{per_stage} devices a stage (SPMD in the stage), " if per_stage > 1 else ""
    out.print(
        f"[bold]{report.module}[/]: {report.stages} stages x {report.microbatches} "
        f"micro-batches, {report.schedule.upper()}, {where}on {', '.join(report.devices)}, "
        f"jax {xb.versions()['jax']}"
    )
    if report.verify is not None:
        mark = "[green]ok[/]" if report.verify["ok"] else "[red]FAILED[/]"
        out.print(f"verification: {mark}: {report.verify['summary']}")
        worst = max(report.verify["outputs"], key=lambda o: o["max_rel_error"], default=None)
        if worst is not None:
            out.print(
                f"  largest errors: abs {worst['max_abs_error']:.3g}, rel "
                f"{worst['max_rel_error']:.3g} (output {worst['index']})"
            )
    out.print(_task_table(report))
    out.print(_bytes_table(report))
    same = "yes" if report.order["same"] else "[red]NO[/]"
    out.print(f"task order as planned on every stage: {same}")
    b = report.bubble
    out.print(
        f"bubble: simulated {b['simulated']:.1%} (on the measured task times), measured "
        f"{b['measured']:.1%}; (p-1)/(m+p-1) = {b['formula']:.1%}"
    )
    p, step = report.predicted_step_s, report.step
    line = (
        f"step: measured median {format_seconds(step['median_s'])} over {int(step['steps'])} "
        f"steps; simulated on the measured task times {format_seconds(p['simulated'])}; "
        f"the stage plan's prediction for its cluster {format_seconds(p['plan'])}"
    )
    if report.single_device_step_s is not None:
        line += f"; single device {format_seconds(report.single_device_step_s)}"
    out.print(line)
    for note in report.notes:
        out.print(f"[yellow]note:[/] {note}")
    peaks = ", ".join(format_bytes(x) for x in report.peak_activation_bytes)
    out.print(f"peak activations per stage (simulated): {peaks}")
    out.print("timeline (F forward, B backward, U update; simulated above measured, same scale):")
    for row in gantt_rows(report.simulated, report.measured, report.stages):
        out.print(row, markup=False)


def _task_table(report: PipelineReport) -> Table:
    t = Table(
        title="median seconds of one task per stage (AF/AB: accumulating F's or B's sums)",
        title_justify="left",
    )
    kinds = [
        k
        for k in ("F", "B", "AF", "AB", "U")
        if any(k in row for row in report.task_seconds.values())
    ]
    for col in ("stage", *kinds, "compile"):
        t.add_column(col, justify="right")
    for s, row in report.task_seconds.items():
        compile_s = sum(p["compile_s"] for p in report.programs if str(p["stage"]) == s)
        t.add_row(
            s,
            *(format_seconds(row[k]) if k in row else "-" for k in kinds),
            format_seconds(compile_s),
        )
    return t


def _bytes_table(report: PipelineReport) -> Table:
    t = Table(
        title="bytes between stages per step: the stage plan's prediction, this task "
        "graph's, and measured",
        title_justify="left",
    )
    for col in ("from->to", "predicted", "planned", "measured"):
        t.add_column(col, justify="right")
    b: dict[str, Any] = report.bytes
    pairs = sorted(set(b["predicted"]) | set(b["planned"]) | set(b["measured"]))
    for pair in pairs:
        t.add_row(
            pair, *(format_bytes(b[k].get(pair, 0)) for k in ("predicted", "planned", "measured"))
        )
    t.add_row(
        "total", *(format_bytes(b[f"{k}_total"]) for k in ("predicted", "planned", "measured"))
    )
    return t


def write_timelines(report: PipelineReport, path: str) -> None:
    """The simulated and the measured timeline as one picture, one above the other, on the
    same time scale (the Gantt picture of `rhino pipeline --gantt`)."""
    title = f"{report.module}: {report.stages} stages, {report.microbatches} micro-batches, "
    charts = [
        (report.simulated, title + f"{report.schedule}, simulated on the measured task times"),
        (report.measured, title + f"{report.schedule}, measured"),
    ]
    write_charts(charts, path, "timelines picture")


def gantt_rows(simulated: Timeline, measured: Timeline, stages: int) -> list[str]:
    """Two text rows per stage, one character per 1/GANTT_WIDTH of the longer step."""
    span = max(simulated.step_s, measured.step_s) or 1.0
    rows = []
    for s in range(stages):
        for label, timeline in (("sim", simulated), ("run", measured)):
            cells = ["."] * GANTT_WIDTH
            for e in timeline.events:
                if e.stage != s:
                    continue
                a = min(GANTT_WIDTH - 1, int(e.start_s / span * GANTT_WIDTH))
                z = max(a + 1, min(GANTT_WIDTH, round(e.end_s / span * GANTT_WIDTH)))
                for i in range(a, z):
                    cells[i] = e.kind
            rows.append(f"  stage {s} {label} |{''.join(cells)}|")
    return rows
