"""What a stage plan's run reports (`run.run_pipeline`): typed parts, turned
into the JSON of `rhino run --json` only by `PipelineReport.to_json`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rhino.runtime.spmd.runner import Timing
from rhino.runtime.verify import OutputCheck
from rhino.search.pipeline.schedule import Timeline


@dataclass(frozen=True)
class StepVerifyReport:
    """The outputs of a pipelined step this process made, against the single-device
    step's on the same inputs."""

    outputs: tuple[OutputCheck, ...]
    seed: int

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.outputs)

    def summary(self) -> str:
        bad = [c for c in self.outputs if not c.ok]
        head = (
            f"{len(self.outputs) - len(bad)}/{len(self.outputs)} outputs match the "
            f"single-device step (seed {self.seed})"
        )
        return "\n  ".join([head, *(c.describe() for c in bad)])

    def to_json(self) -> dict[str, Any]:
        """ok, the summary and per output its errors (as `rhino run` reports a plan's)."""
        return {
            "ok": self.ok,
            "summary": self.summary(),
            "outputs": [c.to_json() for c in self.outputs],
        }


@dataclass(frozen=True)
class ProgramReport:
    """One program of a stage (its forward, backward, an update or an accumulation)."""

    stage: int
    kind: str
    instructions: int
    inputs: int
    outputs: int
    compile_s: float
    """Planning its shardings (hybrid) and compiling it, seconds."""


@dataclass(frozen=True)
class BytesReport:
    """Bytes between stages per step, per (from, to) pair ("0->1"); in a job of several
    processes, those this process sends (from its stages)."""

    predicted: dict[str, int]
    """What the stage plan predicts."""
    planned: dict[str, int]
    """What this task graph sends."""
    measured: dict[str, int]
    predicted_total: int
    planned_total: int
    measured_total: int


@dataclass(frozen=True)
class OrderReport:
    """Per stage ("0", ...) of this process, its tasks ("F0.1": stage 0's forward of
    micro-batch 1) in the schedule's order and in the order they ran."""

    planned: dict[str, tuple[str, ...]]
    measured: dict[str, tuple[str, ...]]
    same: bool


@dataclass(frozen=True)
class BubbleReport:
    """The share of a step the stages sit idle."""

    simulated: float
    """The simulator's, on the measured task times."""
    measured: float
    formula: float
    """(p-1)/(m+p-1) for p stages and m micro-batches."""


@dataclass(frozen=True)
class StepPrediction:
    """Step seconds: predicted, simulated and measured."""

    plan: float
    """The stage plan's prediction (for its cluster)."""
    simulated: float
    """The simulator's, on the measured task times."""
    measured: float
    """The median step's."""


@dataclass(frozen=True)
class PipelineReport:
    module: str
    stages: int
    microbatches: int
    schedule: str
    devices: tuple[str, ...]
    programs: tuple[ProgramReport, ...]
    """The programs of this process's stages."""
    verify: StepVerifyReport | None
    step: Timing
    single_device_step_s: float | None
    task_seconds: dict[str, dict[str, float]]
    """Per stage ("0", ...), per task kind: the median seconds of one task."""
    bytes: BytesReport
    order: OrderReport
    bubble: BubbleReport
    predicted_step_s: StepPrediction
    peak_activation_bytes: tuple[float, ...]
    """Per stage, the simulator's peak for this schedule."""
    measured: Timeline = field(repr=False)
    simulated: Timeline = field(repr=False)
    notes: tuple[str, ...] = ()
    process_index: int = 0
    process_count: int = 1
    local_stages: tuple[int, ...] = ()
    """The stages this process ran; verification, times, order and bytes are theirs."""

    @property
    def ok(self) -> bool:
        return self.verify is None or self.verify.ok

    def to_json(self) -> dict[str, Any]:
        """The report as `rhino run --json` prints it."""
        return {
            "module": self.module,
            "stages": self.stages,
            "microbatches": self.microbatches,
            "schedule": self.schedule,
            "devices": list(self.devices),
            "programs": [asdict(p) for p in self.programs],
            "verify": None if self.verify is None else self.verify.to_json(),
            "step": asdict(self.step),
            "single_device_step_s": self.single_device_step_s,
            "task_seconds": self.task_seconds,
            "bytes": asdict(self.bytes),
            "order": {
                "planned": {s: list(tasks) for s, tasks in self.order.planned.items()},
                "measured": {s: list(tasks) for s, tasks in self.order.measured.items()},
                "same": self.order.same,
            },
            "bubble": asdict(self.bubble),
            "predicted_step_s": asdict(self.predicted_step_s),
            "peak_activation_bytes": list(self.peak_activation_bytes),
            "notes": list(self.notes),
            "process_index": self.process_index,
            "process_count": self.process_count,
            "local_stages": list(self.local_stages),
            "measured_timeline": _timeline_doc(self.measured),
            "simulated_timeline": _timeline_doc(self.simulated),
        }


def _timeline_doc(t: Timeline) -> dict[str, Any]:
    return {
        "step_s": t.step_s,
        "events": [
            {
                "stage": e.stage,
                "kind": e.kind,
                "microbatch": e.microbatch,
                "start_s": e.start_s,
                "end_s": e.end_s,
            }
            for e in t.events
        ],
    }
