"""Stage plans that cut a topological order into d consecutive ranges: the baselines the
stage ILP must never do worse than.

    equal_count   d ranges of (nearly) equal instruction counts, balance ignored
    best_split    Alpa's way: the ranges found by dynamic programming; here the ones
                  with the least cut bytes among those meeting the ILP's balance row
    best_split_late  the same DP over the as-late-as-possible order: every instruction
                  right before its first reader, so a side branch (the one-hot of the
                  labels, computed first, read by the loss) sits beside its reader

The DP, over the problem's order v_0 .. v_{n-1} (ranges are half-open [i, j)):
    recv(i, j)   bytes of the results made before i and read inside [i, j), each once
    load(i, j)   compute of [i, j)
    f[s][j]      least cut bytes placing v_0 .. v_{j-1} on stages 0 .. s-1
    f[0][0] = 0,   f[s][j] = min over i < j with load(i, j) <= cap of f[s-1][i] + recv(i, j)
    answer f[d][n]; every range holds at least one instruction.
recv(i, ·) comes from the results live at i: a result made before i is received by the
range [i, j) when its first reader at or after i is before j, so one row of recv is a
prefix sum over those first readers. O(n x range length) in numpy.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rhino.search.pipeline.problem import StageEvaluation, StageProblem
from rhino.search.problem import FEASIBILITY


@dataclass(frozen=True)
class Baseline:
    name: str
    """One of "equal_count", "best_split", "best_split_late"."""
    stage: tuple[int, ...] | None
    """The plan, or None when no split of the order meets the balance."""
    evaluation: StageEvaluation | None
    """Cut bytes, per-stage compute and imbalance (measured, balance not enforced)."""
    within: bool = False
    """Does the plan meet the problem's balance (1 + epsilon)?"""


def equal_count(problem: StageProblem) -> Baseline:
    """Consecutive ranges of the order with instruction counts differing by at most one."""
    n, d = len(problem.names), problem.stages
    stage = tuple(min(d - 1, k * d // n) for k in range(n))
    return _baseline(problem, "equal_count", stage)


def best_split(problem: StageProblem) -> Baseline:
    """The consecutive ranges of the order with the least cut bytes among those whose
    every range computes at most `problem.capacity` (the DP of the module docstring)."""
    stage = _dp(problem)
    return (
        Baseline("best_split", None, None)
        if stage is None
        else _baseline(problem, "best_split", stage)
    )


def best_split_late(problem: StageProblem) -> Baseline:
    """`best_split` over `late_order(problem)` instead of the problem's order."""
    order = late_order(problem)
    position = {v: k for k, v in enumerate(order)}
    reordered = StageProblem(
        tuple(problem.names[v] for v in order),
        tuple(problem.compute[v] for v in order),
        tuple(problem.bytes[v] for v in order),
        tuple(tuple(sorted(position[j] for j in problem.consumers[v])) for v in order),
        problem.stages,
        problem.epsilon,
    )
    stage = _dp(reordered)
    if stage is None:
        return Baseline("best_split_late", None, None)
    return _baseline(
        problem, "best_split_late", tuple(stage[position[v]] for v in range(len(order)))
    )


def late_order(problem: StageProblem) -> tuple[int, ...]:
    """A topological order that puts every instruction as late as it can go: by the
    length of its longest path to a sink, longest first (ties: the problem's order)."""
    n = len(problem.names)
    height = [0] * n
    for v in range(n - 1, -1, -1):
        height[v] = max((height[j] + 1 for j in problem.consumers[v]), default=0)
    return tuple(sorted(range(n), key=lambda v: (-height[v], v)))


def _dp(problem: StageProblem) -> tuple[int, ...] | None:
    """The DP's stage per instruction, or None when no split meets the balance."""
    n, d = len(problem.names), problem.stages
    cap, floor = problem.capacity * (1 + FEASIBILITY), problem.floor * (1 - FEASIBILITY)
    prefix = np.concatenate([[0.0], np.cumsum(problem.compute)])
    f = np.full((d + 1, n + 1), math.inf)
    parent = np.full((d + 1, n + 1), -1, dtype=np.int64)
    f[0, 0] = 0.0
    for i, row in _recv_rows(problem):
        end = int(np.searchsorted(prefix, prefix[i] + cap, side="right")) - 1  # last j
        first = max(i + 1, int(np.searchsorted(prefix, prefix[i] + floor, side="left")))
        if end < first:
            continue
        recv = row[first - i - 1 : end - i]  # recv(i, j) for j = first .. end
        for s in range(1, d + 1):
            if not math.isfinite(f[s - 1, i]):
                continue
            cand = f[s - 1, i] + recv
            target = f[s, first : end + 1]
            better = cand < target
            target[better] = cand[better]
            parent[s, first : end + 1][better] = i
    if not math.isfinite(f[d, n]):
        return None
    stage = [0] * n
    j = n
    for s in range(d, 0, -1):
        i = int(parent[s, j])
        stage[i:j] = [s - 1] * (j - i)
        j = i
    return tuple(stage)


def _recv_rows(problem: StageProblem) -> Iterator[tuple[int, np.ndarray]]:
    """(i, recv(i, i+1 .. n)) for i = 0 .. n-1, as float arrays."""
    n = len(problem.names)
    readers = [list(cs) for cs in problem.consumers]
    last = [cs[-1] if cs else -1 for cs in readers]
    live: list[int] = []
    for i in range(n):
        if i > 0 and last[i - 1] >= i:
            live.append(i - 1)
        live = [p for p in live if last[p] >= i]
        hist = np.zeros(n - i)
        for p in live:
            first = readers[p][bisect.bisect_left(readers[p], i)]
            hist[first - i] += problem.bytes[p]
        yield i, np.cumsum(hist)


def _baseline(problem: StageProblem, name: str, stage: tuple[int, ...]) -> Baseline:
    found = problem.measure(stage)
    within = found.imbalance <= problem.epsilon * (1 + FEASIBILITY) + 1e-12
    return Baseline(name, stage, found, within)
