"""`rhino run FILE --plan stages.json`: the report of a stage plan (from `rhino pipeline
--out`) run stage by stage (`rhino.runtime.request`), verified, timed, and set against its
prediction."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from rhino.cli.common import emit_json, stdout
from rhino.cli.pipeline_draw import write_charts
from rhino.hlo.errors import VerificationFailed
from rhino.runtime.environment import versions
from rhino.runtime.pipeline.report import PipelineReport
from rhino.search.pipeline.schedule import Timeline
from rhino.search.units import format_bytes, format_seconds

GANTT_WIDTH = 60
"""Characters of the text timeline."""


def show_stage_run(
    report: PipelineReport,
    as_json: bool,
    gantt: str | None = None,
    source: dict[str, Any] | None = None,
) -> None:
    """Render (and draw the timelines to `gantt`), then raise VerificationFailed (exit 1)
    when an output differs. `source`: the `input` object of the JSON (what was read)."""
    if gantt:
        write_timelines(report, gantt)
    if as_json:
        emit_json("run.pipeline", {**report.to_json(), **({"input": source} if source else {})})
    else:
        render(report)
    if not report.ok:
        raise VerificationFailed(report.verify.summary() if report.verify else "failed")


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
        f"jax {versions()['jax']}"
    )
    if report.verify is not None:
        mark = "[green]ok[/]" if report.verify.ok else "[red]FAILED[/]"
        out.print(f"verification: {mark}: {report.verify.summary()}")
        worst = max(report.verify.outputs, key=lambda o: o.max_rel_error, default=None)
        if worst is not None:
            out.print(
                f"  largest errors: abs {worst.max_abs_error:.3g}, rel "
                f"{worst.max_rel_error:.3g} (output {worst.index})"
            )
    out.print(_task_table(report))
    out.print(_bytes_table(report))
    same = "yes" if report.order.same else "[red]NO[/]"
    out.print(f"task order as planned on every stage: {same}")
    b = report.bubble
    out.print(
        f"bubble: simulated {b.simulated:.1%} (on the measured task times), measured "
        f"{b.measured:.1%}; (p-1)/(m+p-1) = {b.formula:.1%}"
    )
    p, step = report.predicted_step_s, report.step
    line = (
        f"step: measured median {format_seconds(step.median_s)} over {step.steps} "
        f"steps; simulated on the measured task times {format_seconds(p.simulated)}; "
        f"the stage plan's prediction for its cluster {format_seconds(p.plan)}"
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
        compile_s = sum(p.compile_s for p in report.programs if str(p.stage) == s)
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
    b = report.bytes
    for pair in sorted(set(b.predicted) | set(b.planned) | set(b.measured)):
        sides = (b.predicted, b.planned, b.measured)
        t.add_row(pair, *(format_bytes(side.get(pair, 0)) for side in sides))
    totals = (b.predicted_total, b.planned_total, b.measured_total)
    t.add_row("total", *(format_bytes(n) for n in totals))
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
