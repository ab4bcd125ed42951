"""The least bytes each stage must receive, from the stage windows of bound tightening.

Bound tightening (`stage_ilp.tighten`) gives every instruction a window [lo, hi] of
stages. The windows also bound the objective from below, stage by stage:

    before(s)  = {i : hi[i] < s}                  surely on a stage before s
    sep(s, j)  = the least bytes of a vertex set that meets every path from before(s)
                 to j, taking no vertex with lo >= s and not j itself
Claim: in every plan that meets (order) and (balance), if j is on stage s then stage s
receives at least sep(s, j) bytes. Proof: on a path from h in before(s) to j the stages
never decrease, from below s to s; the last vertex w below s is followed by one on s.
So w's result is received by stage s, and the vertices received by s meet every such
path: their bytes are at least sep(s, j). Each received result counts once, as in the
objective (once per producer and receiving stage).

Stage s holds at least `floor` compute, so it holds some instruction j whose sep(s, j) is
at least
    least(s) = the largest t such that the instructions that may take stage s
               (lo <= s <= hi) with sep(s, j) < t compute less than `floor` in all
and stage s receives at least least(s) bytes; and at least sep(s, F), the same cut to all
the instructions F fixed on stage s at once (lo = hi = s), which is at least each one's.
Where F alone holds the floor, least(s) is at most sep(s, F), and only that flow runs.
The larger of the two bounds stage s. The sum over the stages bounds the cut
bytes of every plan from below; the stage ILP adds one row per stage
(sum_i b[i] R[i][s] >= least(s)), and where its start plan already cuts no more than the
sum, that plan is optimal and no solver runs.

sep(s, j) is a max flow: each instruction split into an arc in -> out of capacity b[i]
(unbounded for lo[i] >= s), unbounded arcs out_i -> in_j along the edges and from a
source to every instruction of before(s), and j's `in` as the sink. The flows run
heaviest instruction first; the lightest ones that together compute less than
`LIGHT_SHARE` of the floor take sep = 0 (a lower bound, so least(s) stays valid). Without
tightening, before(s) is empty and every bound is 0. On the 24-layer GPT into 8 stages the
bounds sum to the optimum (7 x 16 MiB); on an encoder-decoder, where a stage may hold
either stream alone, to 80 of 96 MiB on 4 stages.
"""

from __future__ import annotations

import numpy as np
from ortools.graph.python import max_flow  # type: ignore[import-untyped]

from rhino.search.stage_problem import StageProblem

LIGHT_SHARE = 0.1
"""The lightest instructions of a stage's candidates whose compute together stays under
this share of the floor are not flowed (their sep is taken as 0). On the zoo models at
0.1 the bounds equal those of flowing every instruction, with 5-8x fewer flows."""

_SLACK = 1e-6
"""A stage may hold a little less than `floor` (the float tolerance `evaluate` allows)."""


def least_receipts(problem: StageProblem, lo: tuple[int, ...], hi: tuple[int, ...]
                   ) -> tuple[int, ...]:  # fmt: skip
    """least(s) of the module docstring for s = 0 .. d-1 (least(0) = 0), for windows
    [lo, hi] that hold every plan meeting (order) and (balance)."""
    edges = np.array([(i, j) for i, cs in enumerate(problem.consumers) for j in cs],
                     dtype=np.int64).reshape(-1, 2)  # fmt: skip
    return (0,) + tuple(_least(problem, np.array(lo), np.array(hi), s, edges)
                        for s in range(1, problem.stages))  # fmt: skip


def _least(problem: StageProblem, lo: np.ndarray, hi: np.ndarray, s: int, edges: np.ndarray) -> int:
    floor = problem.floor * (1 - _SLACK)
    before = hi < s
    if not before.any() or floor <= 0:
        return 0
    # The flow graph keeps the instructions that may precede stage s (lo <= s: every
    # ancestor of a candidate, since lo grows along edges) less those of before(s) that
    # feed only before(s): a path through one goes on to one that feeds a later stage,
    # which the source reaches directly.
    n = len(lo)
    frontier = np.zeros(n, dtype=bool)
    frontier[edges[before[edges[:, 0]] & ~before[edges[:, 1]], 0]] = True
    kept = (lo <= s) & (~before | frontier)
    at = np.cumsum(kept) - 1  # instruction -> its node in the flow graph
    nodes = np.flatnonzero(kept)
    links = edges[kept[edges[:, 0]] & kept[edges[:, 1]]]
    unbounded = sum(problem.bytes) + 1
    sizes = np.array(problem.bytes, dtype=np.int64)[nodes]
    sources = at[np.flatnonzero(kept & before)]
    source = 2 * len(nodes)
    # instruction k is the arc 2k -> 2k + 1; an edge k -> m the arc 2k + 1 -> 2m
    flow = max_flow.SimpleMaxFlow()
    flow.add_arcs_with_capacity(
        np.concatenate([2 * at[nodes], 2 * at[links[:, 0]] + 1, np.full(len(sources), source)]),
        np.concatenate([2 * at[nodes] + 1, 2 * at[links[:, 1]], 2 * sources]),
        np.concatenate([np.where(lo[nodes] >= s, unbounded, sizes),
                        np.full(len(links) + len(sources), unbounded, dtype=np.int64)]),
    )  # fmt: skip
    # the instructions fixed on stage s, all at once: a sink fed by each
    fixed = np.flatnonzero(kept & (lo == s) & (hi == s))
    sink = source + 1
    flow.add_arcs_with_capacity(2 * at[fixed], np.full(len(fixed), sink),
                                np.full(len(fixed), unbounded, dtype=np.int64))  # fmt: skip
    if flow.solve(source, sink) != flow.OPTIMAL:
        return 0
    together = flow.optimal_flow() if len(fixed) else 0
    compute = problem.compute
    if sum(compute[j] for j in fixed.tolist()) >= floor:
        return together  # every instruction's own sep is at most `together`: so is least(s)
    candidates = sorted((j for j in np.flatnonzero(kept & (hi >= s)).tolist() if compute[j] > 0),
                        key=lambda j: (-compute[j], j))  # fmt: skip
    light = sum(compute[j] for j in candidates)
    separated: list[tuple[int, float]] = []
    for j in candidates:
        if light < LIGHT_SHARE * floor:
            break
        if flow.solve(source, 2 * int(at[j])) != flow.OPTIMAL:
            return 0
        separated.append((flow.optimal_flow(), compute[j]))
        light -= compute[j]
    held = max(light, 0.0)  # the unflowed instructions, taken as sep 0
    for cut, work in sorted(separated):
        held += work
        if held >= floor:
            return max(cut, together)
    return together
