"""What the stage search found and how (`rhino.search.pipeline.ilp.solve_stages`), apart
from the solver itself: a stage plan read back (`PipelinePlan.from_json`, `rhino run`
of a stage plan) needs these, not CP-SAT."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rhino.search.problem import SolveStatus


@dataclass(frozen=True)
class StageSolveStats:
    """The sizes and times of one `solve_stages`."""

    nodes: int
    """Forward instructions of the problem."""
    reduced_nodes: int
    """Instructions left by the exact reduction (`reduce`)."""
    fixed: int
    """Of those, how many bound tightening fixed to one stage."""
    window_choices: int
    """Stage choices left in the windows (`Windows.choices`)."""
    receipt_bound: int
    """Sum of the stages' least receipts: a lower bound on the cut (0 without tightening)."""
    tighten_s: float
    """Seconds of the reduction, the tightening and the receipts."""
    variables: int = 0
    """Of the CP-SAT model; 0 when the start plan met `receipt_bound` and CP-SAT did not
    run."""
    constraints: int = 0
    build_s: float = 0.0
    """Seconds building the model and its hint."""
    cpsat_s: float = 0.0
    """CP-SAT's wall time."""

    @property
    def ran_cpsat(self) -> bool:
        return self.variables > 0

    def to_json(self) -> dict[str, float]:
        """Every number as a float, in the order the search records them (a CP-SAT run
        records its build time before the model's size), as version 1 writes them."""
        head = {
            "nodes": float(self.nodes),
            "reduced_nodes": float(self.reduced_nodes),
            "fixed": float(self.fixed),
            "window_choices": float(self.window_choices),
            "receipt_bound": float(self.receipt_bound),
            "tighten_s": self.tighten_s,
        }
        size = {"variables": float(self.variables), "constraints": float(self.constraints)}
        if self.ran_cpsat:
            return {**head, "build_s": self.build_s, **size, "cpsat_s": self.cpsat_s}
        return {**head, **size, "build_s": self.build_s, "cpsat_s": self.cpsat_s}

    @staticmethod
    def from_json(doc: dict[str, Any]) -> StageSolveStats:
        return StageSolveStats(
            nodes=int(doc["nodes"]),
            reduced_nodes=int(doc["reduced_nodes"]),
            fixed=int(doc["fixed"]),
            window_choices=int(doc["window_choices"]),
            receipt_bound=int(doc["receipt_bound"]),
            tighten_s=float(doc["tighten_s"]),
            variables=int(doc["variables"]),
            constraints=int(doc["constraints"]),
            build_s=float(doc["build_s"]),
            cpsat_s=float(doc["cpsat_s"]),
        )


@dataclass(frozen=True)
class StageAssignment:
    """A stage per instruction, with how it was found."""

    stage: tuple[int, ...]
    cut_bytes: int
    """Recomputed by `evaluate`."""
    bound: float
    """Best lower bound on the cut bytes the solver proved."""
    status: SolveStatus
    method: str
    """"ilp", or "hint" when the start plan was not beaten (then it is the answer)."""
    solve_time_s: float
    stats: StageSolveStats

    @property
    def gap(self) -> float:
        if self.cut_bytes <= 0:
            return 0.0
        return max(0.0, (self.cut_bytes - self.bound) / self.cut_bytes)
