"""Pictures of a pipeline plan: the schedule as a Gantt chart (SVG, or PNG through
matplotlib when it is installed) and the graph coloured by stage (Graphviz DOT text)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from xml.sax.saxutils import escape

from rhino.cli.common import save_output
from rhino.hlo.errors import ConfigError
from rhino.hlo.ir import Module
from rhino.search.pipeline import PipelinePlan
from rhino.search.pipeline.schedule import Timeline
from rhino.search.units import format_seconds

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
    suffix = Path(path).suffix.lower()
    if suffix == ".svg":
        return
    if suffix == ".png":
        if importlib.util.find_spec("matplotlib") is None:
            raise ConfigError(
                f"--gantt {path}: writing PNG needs matplotlib, which is not "
                "installed (pip install 'rhino[png]' or matplotlib), or write .svg instead"
            )
        return
    raise ConfigError(f"--gantt {path}: expected a .svg or .png file name")


def write_gantt(timeline: Timeline, path: str, title: str) -> None:
    """Stages top to bottom, time left to right; F, B and the update U per micro-batch."""
    if Path(path).suffix.lower() == ".png":
        _gantt_png(timeline, path, title)
    else:
        save_output(path, gantt_svg(timeline, title), "schedule picture")


KIND_NAMES = {"F": "forward", "B": "backward", "U": "update"}


def gantt_svg(timeline: Timeline, title: str) -> str:
    """Stages top to bottom, time left to right, with a legend of the task kinds, each
    task labelled with its micro-batch (F3: micro-batch 3's forward; the number alone
    where the box is narrow; every box's tooltip has the times) and a time axis."""
    stages = len(timeline.peak_microbatches)
    left, top, row, width = 80, 40, 36, 1000
    scale = width / timeline.step_s if timeline.step_s > 0 else 0.0
    height = top + stages * row + 44
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="{left}" y="20" font-size="14">{escape(title)}</text>',
    ]
    key_x = left + width
    for kind in reversed(KIND_NAMES):  # the legend, right-aligned on the title's line
        key_x -= 16 + 7 * len(f"{kind} {KIND_NAMES[kind]}") + 14
        parts.append(
            f'<rect x="{key_x}" y="9" width="12" height="12" fill="{KIND_COLOURS[kind]}"/>'
            f'<text x="{key_x + 16}" y="19">{kind} {KIND_NAMES[kind]}</text>'
        )
    axis_y = top + stages * row
    for tick in _ticks(timeline.step_s):
        tx = left + tick * scale
        parts.append(
            f'<line x1="{tx:.2f}" y1="{top}" x2="{tx:.2f}" y2="{axis_y + 4}" '
            'stroke="#ccc" stroke-width="0.5"/>'
            f'<text x="{tx:.2f}" y="{axis_y + 18}" text-anchor="middle">'
            f"{format_seconds(tick)}</text>"
        )
    for s in range(stages):
        y = top + s * row
        parts.append(f'<text x="8" y="{y + row / 2 + 4:.1f}">stage {s}</text>')
    for e in timeline.events:
        x, w = left + e.start_s * scale, max(0.5, (e.end_s - e.start_s) * scale)
        y = top + e.stage * row + 4
        label = "U" if e.kind == "U" else f"{e.kind}{e.microbatch}"
        parts.append(
            f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row - 8}" '
            f'fill="{KIND_COLOURS[e.kind]}" stroke="white" stroke-width="0.5">'
            f"<title>stage {e.stage} {label}: {format_seconds(e.start_s)} to "
            f"{format_seconds(e.end_s)}</title></rect>"
        )
        short = "" if e.kind == "U" else str(e.microbatch)
        text, size = (label, 12) if w > 7 * len(label) + 4 else (short, 9)
        if text and w > 6 * len(text) + 1:
            parts.append(
                f'<text x="{x + w / 2:.2f}" y="{y + row / 2:.1f}" fill="white" '
                f'font-size="{size}" text-anchor="middle">{text}</text>'
            )
    parts.append(
        f'<text x="{left + width}" y="{axis_y + 34}" text-anchor="end">'
        f"step {format_seconds(timeline.step_s)}</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


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


def _gantt_png(timeline: Timeline, path: str, title: str) -> None:
    import matplotlib  # type: ignore[import-not-found]  # optional: checked before the run

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found]

    stages = len(timeline.peak_microbatches)
    fig, ax = plt.subplots(figsize=(12, 0.6 * stages + 1.2))
    from matplotlib.patches import Patch  # type: ignore[import-not-found]

    for e in timeline.events:
        ax.barh(
            e.stage,
            (e.end_s - e.start_s) * 1e3,
            left=e.start_s * 1e3,
            color=KIND_COLOURS[e.kind],
            edgecolor="white",
        )
        if e.kind != "U" and (e.end_s - e.start_s) > timeline.step_s / 80:
            ax.text(
                (e.start_s + e.end_s) / 2 * 1e3,
                e.stage,
                str(e.microbatch),
                color="white",
                ha="center",
                va="center",
                fontsize=7,
            )
    ax.legend(
        handles=[Patch(color=KIND_COLOURS[k], label=f"{k} {n}") for k, n in KIND_NAMES.items()],
        loc="upper right",
        ncol=3,
        fontsize=8,
    )
    ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


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
