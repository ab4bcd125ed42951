"""The stage problem as plain data, and an evaluation of any plan for it.

A `StageProblem` is what the stage ILP, its reductions, the baselines and brute force in
tests work on: instructions in a topological order with their compute and result bytes,
their consumers, a stage count and a balance tolerance. Nothing here knows about HLO.
`evaluate(stage)` recomputes the cut bytes (each result once per receiving stage) and
every stage's compute from scratch, and raises InfeasibleError for a plan that breaks
precedence or the balance, so no solver is trusted blindly.
"""

from __future__ import annotations

from dataclasses import dataclass

from rhino.hlo.errors import InfeasibleError
from rhino.search.problem import FEASIBILITY
from rhino.search.units import format_seconds


@dataclass(frozen=True)
class StageProblem:
    """Place every forward instruction on one of `stages` stages."""

    names: tuple[str, ...]
    """Instruction names, in a topological order (operands first)."""
    compute: tuple[float, ...]
    """Seconds of each instruction."""
    bytes: tuple[int, ...]
    """Bytes of each instruction's result."""
    consumers: tuple[tuple[int, ...], ...]
    """Indices of each instruction's consumers (all later in the order)."""
    stages: int
    """Number of stages d."""
    epsilon: float
    """Balance tolerance: a stage's compute is at most (1 + epsilon) x the average."""

    def __post_init__(self) -> None:
        n = len(self.names)
        if not (len(self.compute) == len(self.bytes) == len(self.consumers) == n):
            raise ValueError("names, compute, bytes and consumers differ in length")
        for i, cs in enumerate(self.consumers):
            if any(j <= i or j >= n for j in cs):
                raise ValueError(f"{self.names[i]}: consumers {cs} not after it in the order")

    @property
    def capacity(self) -> float:
        """Most compute a stage may hold (seconds)."""
        return (1.0 + self.epsilon) * sum(self.compute) / self.stages

    @property
    def floor(self) -> float:
        """Least compute a stage must hold (seconds)."""
        return max(0.0, 1.0 - self.epsilon) * sum(self.compute) / self.stages

    @property
    def edges(self) -> int:
        return sum(len(cs) for cs in self.consumers)

    def measure(self, stage: tuple[int, ...] | list[int]) -> StageEvaluation:
        """Cut bytes and per-stage compute of `stage`; raises on a broken precedence or
        stage number, not on imbalance (see `evaluate`)."""
        if len(stage) != len(self.names):
            raise ValueError(f"plan has {len(stage)} stages for {len(self.names)} instructions")
        d = self.stages
        per_stage = [0.0] * d
        received: set[tuple[int, int]] = set()
        for i, s in enumerate(stage):
            if not 0 <= s < d:
                raise InfeasibleError(f"%{self.names[i]}: stage {s} is not in 0..{d - 1}")
            per_stage[s] += self.compute[i]
            for j in self.consumers[i]:
                if stage[j] < s:
                    raise InfeasibleError(
                        f"%{self.names[j]} on stage {stage[j]} reads %{self.names[i]} "
                        f"from the later stage {s}"
                    )
                if stage[j] != s:
                    received.add((i, stage[j]))
        cut = sum(self.bytes[i] for i, _ in received)
        average = sum(self.compute) / d
        imbalance = (
            max(max(per_stage) / average - 1.0, 1.0 - min(per_stage) / average)
            if average > 0
            else 0.0
        )
        return StageEvaluation(cut, tuple(per_stage), imbalance)

    def evaluate(self, stage: tuple[int, ...] | list[int]) -> StageEvaluation:
        """`measure`, and raise InfeasibleError when a stage holds more than `capacity`
        or less than `floor`."""
        found = self.measure(stage)
        cap, floor = self.capacity, self.floor
        for s, load in enumerate(found.stage_compute):
            if load > cap * (1 + FEASIBILITY):
                raise InfeasibleError(
                    f"stage {s} computes {format_seconds(load)} > {format_seconds(cap)} "
                    f"(1 + epsilon {self.epsilon:g} times the average)"
                )
            if load < floor * (1 - FEASIBILITY):
                raise InfeasibleError(
                    f"stage {s} computes {format_seconds(load)} < {format_seconds(floor)} "
                    f"(1 - epsilon {self.epsilon:g} times the average)"
                )
        return found


@dataclass(frozen=True)
class StageEvaluation:
    cut_bytes: int
    """Bytes sent between stages, once per (producer, receiving stage)."""
    stage_compute: tuple[float, ...]
    """Seconds of compute on each stage."""
    imbalance: float
    """The stage farthest from the average, relative to it (0.1: a stage 10% above or
    below the average; a plan meets the balance when this is at most epsilon)."""
