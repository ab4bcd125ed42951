"""The parts of a stage plan (`PipelinePlan`): per stage, per schedule, per baseline and per
instruction, each a frozen dataclass turned into JSON only at the edge (`to_json`) and read
back from it (`from_json`) with the plan file (`PipelinePlan.read`).

A stage plan file of version 1 written before a key existed still reads: the keys version 1
gained later are `ADDED_IN_VERSION_1`; a missing one reads as said there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rhino.search.pipeline.split import Role

ADDED_IN_VERSION_1 = {
    "simulated_bubble_fraction": "1 - busy_fraction (what it is computed as)",
    "loss": '"" (not recorded: the runtime finds the loss from the graph)',
    "forward_share": "NaN (not recorded)",
    "mesh": "None (not a hybrid plan)",
}
"""Keys of the stage plan that files of version 1 written before them lack, and how such a
file reads without them."""


@dataclass(frozen=True)
class StageReport:
    stage: int
    forward_s: float
    """Compute of the whole batch's forward on this stage (seconds)."""
    backward_s: float
    update_s: float
    instructions: dict[str, int]
    """Instructions per role on this stage."""
    parameter_bytes: int
    """Weights on this stage."""
    optimizer_bytes: int
    """Optimizer state on this stage (moments, step count)."""
    activation_bytes: float
    """Bytes one micro-batch's stored forward activations take (read by the backward)."""
    peak_activation_bytes: dict[str, float]
    """Schedule -> most activation bytes held at once."""
    sent_bytes: dict[str, int]
    """Bytes per step this stage sends to each other stage ("2": to stage 2)."""
    sent_forward_bytes: int
    """Bytes per step of forward tensors sent to later stages: the ILP's cut, and any a
    backward instruction on a later stage reads that no forward one there does."""
    sent_backward_bytes: int
    """Bytes per step sent to earlier stages (gradients, and activations a backward
    instruction reads on another stage)."""

    def to_json(self) -> dict[str, object]:
        return {
            "stage": self.stage,
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "update_s": self.update_s,
            "instructions": dict(self.instructions),
            "parameter_bytes": self.parameter_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "activation_bytes": self.activation_bytes,
            "peak_activation_bytes": dict(self.peak_activation_bytes),
            "sent_bytes": dict(self.sent_bytes),
            "sent_forward_bytes": self.sent_forward_bytes,
            "sent_backward_bytes": self.sent_backward_bytes,
        }

    @staticmethod
    def from_json(doc: dict[str, Any]) -> StageReport:
        return StageReport(
            stage=int(doc["stage"]),
            forward_s=float(doc["forward_s"]),
            backward_s=float(doc["backward_s"]),
            update_s=float(doc["update_s"]),
            instructions={str(k): int(v) for k, v in doc["instructions"].items()},
            parameter_bytes=int(doc["parameter_bytes"]),
            optimizer_bytes=int(doc["optimizer_bytes"]),
            activation_bytes=float(doc["activation_bytes"]),
            peak_activation_bytes={
                str(k): float(v) for k, v in doc["peak_activation_bytes"].items()
            },
            sent_bytes={str(k): int(v) for k, v in doc["sent_bytes"].items()},
            sent_forward_bytes=int(doc["sent_forward_bytes"]),
            sent_backward_bytes=int(doc["sent_backward_bytes"]),
        )


@dataclass(frozen=True)
class ScheduleReport:
    """One schedule (1F1B or GPipe) of the plan, simulated."""

    step_s: float
    """Seconds of one step (all micro-batches and the update)."""
    bubble_fraction: float
    """(p - 1) / (m + p - 1): the bubble with equal stages and free sends."""
    simulated_bubble_fraction: float
    """The simulated share of stage-time spent idle (1 - `busy_fraction`)."""
    busy_fraction: float
    """The simulated share of stage-time spent computing."""
    peak_microbatches: tuple[int, ...]
    """Per stage: most micro-batches whose activations it holds at once."""
    peak_activation_bytes: tuple[float, ...]
    """Per stage: most activation bytes it holds at once."""

    def to_json(self) -> dict[str, object]:
        return {
            "step_s": self.step_s,
            "bubble_fraction": self.bubble_fraction,
            "simulated_bubble_fraction": self.simulated_bubble_fraction,
            "busy_fraction": self.busy_fraction,
            "peak_microbatches": list(self.peak_microbatches),
            "peak_activation_bytes": list(self.peak_activation_bytes),
        }

    @staticmethod
    def from_json(doc: dict[str, Any]) -> ScheduleReport:
        busy = float(doc["busy_fraction"])
        return ScheduleReport(
            step_s=float(doc["step_s"]),
            bubble_fraction=float(doc["bubble_fraction"]),
            simulated_bubble_fraction=float(doc.get("simulated_bubble_fraction", 1.0 - busy)),
            busy_fraction=busy,
            peak_microbatches=tuple(int(n) for n in doc["peak_microbatches"]),
            peak_activation_bytes=tuple(float(b) for b in doc["peak_activation_bytes"]),
        )


@dataclass(frozen=True)
class BaselineReport:
    """A baseline split (consecutive ranges of a topological order) and how it fares."""

    name: str
    """"equal_count", "best_split" or "best_split_late"."""
    cut_bytes: int | None
    """Forward bytes it sends between stages; None where it has no plan."""
    imbalance: float | None
    within_balance: bool
    """Does it meet the plan's epsilon?"""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "cut_bytes": self.cut_bytes,
            "imbalance": self.imbalance,
            "within_balance": self.within_balance,
        }

    @staticmethod
    def from_json(doc: dict[str, Any]) -> BaselineReport:
        cut, imbalance = doc["cut_bytes"], doc["imbalance"]
        return BaselineReport(
            name=str(doc["name"]),
            cut_bytes=None if cut is None else int(cut),
            imbalance=None if imbalance is None else float(imbalance),
            within_balance=bool(doc["within_balance"]),
        )


@dataclass(frozen=True)
class InstructionStage:
    """Where the plan puts one ENTRY instruction."""

    name: str
    opcode: str
    role: Role
    stage: int
    free: bool
    """Recomputed wherever it is read (made from constants alone)."""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "opcode": self.opcode,
            "role": self.role.value,
            "stage": self.stage,
            "free": self.free,
        }

    @staticmethod
    def from_json(doc: dict[str, Any]) -> InstructionStage:
        return InstructionStage(
            name=str(doc["name"]),
            opcode=str(doc["opcode"]),
            role=Role(doc["role"]),
            stage=int(doc["stage"]),
            free=bool(doc["free"]),
        )
