"""Pictures of a pipeline plan: the schedule as a Gantt chart (one matplotlib figure,
written as SVG or PNG) and the graph coloured by stage (Graphviz DOT text)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rhino.cli.common import save_output
from rhino.hlo.errors import ConfigError
from rhino.hlo.ir import Module
from rhino.search.pipeline import PipelinePlan
from rhino.search.pipeline.schedule import Timeline
from rhino.search.units import format_seconds

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

STAGE_COLOURS = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)
KIND_COLOURS = {"F": "#4e79a7", "B": "#e15759", "U": "#59a14f"}
ROLE_SHAPES = {
    "forward": "box",
    "backward": "ellipse",
    "update": "diamond",
    "state": "note",
    "output": "doubleoctagon",
}


def check_picture_path(path: str) -> None:
    """Refuse, before any work, a picture rhino cannot write."""
    if Path(path).suffix.lower() not in (".svg", ".png"):
        raise ConfigError(f"--gantt {path}: expected a .svg or .png file name")


KIND_NAMES = {"F": "forward", "B": "backward", "U": "update"}
FIGURE_INCHES = 12.0
"""The chart's width; its height grows with the stages."""
AXES = (0.08, 0.97)
"""The time axis's left and right edge, as fractions of the width."""
ROW_INCHES = 0.45
"""The height of one stage's row."""
ABOVE_INCHES, BELOW_INCHES = 0.45, 0.7
"""Room for a chart's title, and for its time axis."""
LEGEND_INCHES = 0.35
"""Room for the legend of the task kinds, once, under the charts."""
FONT_SIZE = 9.0


def write_gantt(timeline: Timeline, path: str, title: str) -> None:
    """The chart of `gantt_figure`, as SVG or PNG by `path`'s suffix."""
    write_charts([(timeline, title)], path, "schedule picture")


def write_charts(charts: Sequence[tuple[Timeline, str]], path: str, what: str) -> None:
    """`gantt_figure(charts)` as SVG or PNG by `path`'s suffix: `what` names the picture
    in an error."""
    import matplotlib

    # the same chart, the same SVG bytes (matplotlib salts its element ids at random
    # otherwise); text kept as text, not as outlines
    with matplotlib.rc_context({"svg.hashsalt": "rhino", "svg.fonttype": "none"}):
        figure = gantt_figure(charts)
        if Path(path).suffix.lower() == ".png":
            figure.savefig(path, format="png", dpi=100)
        else:
            text = io.StringIO()
            figure.savefig(text, format="svg", metadata={"Date": None})
            save_output(path, text.getvalue(), what)


def gantt_figure(charts: Sequence[tuple[Timeline, str]]) -> Figure:
    """One chart per (timeline, title), one above the other on the time scale of the
    longest step: stages top to bottom, time left to right, with a legend of the task
    kinds, each task labelled with its micro-batch (F3: micro-batch 3's forward; the
    number alone where the bar is narrow, nothing where it is narrower) and a time axis
    from 0 in round steps. Each bar's id names its task ("stage 1 F3")."""
    from matplotlib.figure import Figure

    span = max((t.step_s for t, _ in charts), default=0.0)
    heights = [ABOVE_INCHES + ROW_INCHES * _stages(t) + BELOW_INCHES for t, _ in charts]
    total = sum(heights) + LEGEND_INCHES
    figure = Figure(figsize=(FIGURE_INCHES, total))
    top = total
    for (timeline, title), height in zip(charts, heights, strict=True):
        top -= height
        rows = height - ABOVE_INCHES - BELOW_INCHES
        ax = figure.add_axes(
            (AXES[0], (top + BELOW_INCHES) / total, AXES[1] - AXES[0], rows / total)
        )
        _draw(ax, timeline, title, span if span > 0 else 1.0)
    from matplotlib.patches import Patch

    figure.legend(
        handles=[Patch(color=KIND_COLOURS[k], label=f"{k} {n}") for k, n in KIND_NAMES.items()],
        loc="lower left",
        bbox_to_anchor=(AXES[0], 0.0),
        ncol=3,
        fontsize=FONT_SIZE,
        frameon=False,
    )
    return figure


def _stages(timeline: Timeline) -> int:
    return len(timeline.peak_microbatches)


def _draw(ax: Axes, timeline: Timeline, title: str, span: float) -> None:
    """One chart on `ax`, whose time axis runs from 0 to `span` seconds."""
    stages = _stages(timeline)
    points = FIGURE_INCHES * 72 * (AXES[1] - AXES[0]) / span  # points per second
    for e in timeline.events:
        label = "U" if e.kind == "U" else f"{e.kind}{e.microbatch}"
        width = e.end_s - e.start_s
        ax.barh(
            e.stage,
            width,
            left=e.start_s,
            height=0.8,
            color=KIND_COLOURS[e.kind],
            edgecolor="white",
            linewidth=0.5,
            gid=f"stage {e.stage} {label}",
        )
        short = "" if e.kind == "U" else str(e.microbatch)
        text = label if width * points > 0.6 * FONT_SIZE * len(label) + 3 else short
        if text and width * points > 0.6 * FONT_SIZE * len(text) + 1:
            ax.text(
                e.start_s + width / 2,
                e.stage,
                text,
                color="white",
                ha="center",
                va="center",
                fontsize=FONT_SIZE if text == label else FONT_SIZE - 2,
            )
    ax.set_title(title, loc="left", fontsize=FONT_SIZE + 2)
    ticks = _ticks(span)
    ax.set_xticks(ticks, _tick_labels(ticks), fontsize=FONT_SIZE)
    ax.set_xlim(0, span)
    ax.grid(axis="x", color="#ccc", linewidth=0.5)
    ax.set_axisbelow(True)
    ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)], fontsize=FONT_SIZE)
    ax.set_ylim(stages - 0.5, -0.5)  # stage 0 on top
    ax.set_xlabel(f"step {format_seconds(timeline.step_s)}", loc="right", fontsize=FONT_SIZE)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _ticks(span: float) -> list[float]:
    """Round times from 0 to `span`: 4 to 10 of them at 1, 2 or 5 x a power of ten."""
    if span <= 0:
        return [0.0]
    step = 10 ** math.floor(math.log10(span / 5))
    for factor in (1, 2, 5, 10):
        if span / (step * factor) <= 10:
            step *= factor
            break
    return [k * step for k in range(int(span / step + 1e-9) + 1)]


def _tick_labels(ticks: list[float]) -> list[str]:
    """The ticks in one unit, the largest in which the last is at least 1 (0, 10 ms,
    20 ms, ...), each with the digits it needs."""
    last = max(ticks, default=0.0)
    unit, name = next(
        ((u, n) for u, n in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")) if last >= u), (1e-9, "ns")
    )
    return [f"{round(t / unit, 6):g} {name}" for t in ticks]


def write_dot(plan: PipelinePlan, module: Module, path: str) -> None:
    """The ENTRY computation as DOT: node colour = stage, node shape = role; free
    instructions (recomputed wherever read) are left out."""
    lines = [f'digraph "{plan.module}" {{', "  node [style=filled, fontsize=10];"]
    kept = {i.name for i in plan.instructions if not i.free}
    for info in plan.instructions:
        if info.name not in kept:
            continue
        colour = STAGE_COLOURS[info.stage % len(STAGE_COLOURS)]
        shape = ROLE_SHAPES.get(info.role.value, "box")
        lines.append(
            f'  "{info.name}" [fillcolor="{colour}", shape={shape}, '
            f'tooltip="{info.opcode} stage {info.stage}"];'
        )
    for inst in module.entry.instructions:
        for op in dict.fromkeys(inst.operands):
            if op.name in kept and inst.name in kept:
                lines.append(f'  "{op.name}" -> "{inst.name}";')
    lines.append("}")
    save_output(path, "\n".join(lines) + "\n", "Graphviz view")
