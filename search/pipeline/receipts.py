"""The least bytes each stage must receive, from the stage windows of bound tightening.

Bound tightening (`ilp.tighten`) gives every instruction a window [lo, hi] of
stages. The windows also bound the objective from below, stage by stage:

    before(s)  = {i : hi[i] < s}                  surely on a stage before s
    F(s)       = {i : lo[i] = hi[i] = s}          surely on stage s
    sep(s, X)  = the least bytes of a vertex set that meets every path from before(s)
                 to X, taking no vertex with lo >= s
Claim: in every plan that meets (order) and (balance), if all of X is on stage s then
stage s receives at least sep(s, X) bytes. Proof: on a path from h in before(s) to j in
X the stages never decrease, from below s to s; the last vertex w below s is followed by
one on s. So w's result is received by stage s, and the vertices received by s meet
every such path: their bytes are at least sep(s, X). Each received result counts once,
as in the objective (once per producer and receiving stage).

Stage s holds F(s), and at least `floor` compute. Where F(s) holds less, stage s also
holds some other instruction j that may take it (lo <= s <= hi), and of those enough to
make up the floor; so stage s holds a j whose sep(s, F(s) + j) is at least
    t(s) = the largest t such that F(s) and the candidates j with sep(s, F(s) + j) < t
           compute less than `floor` in all,
and it receives at least least(s) = max(sep(s, F(s)), t(s)) bytes (where F(s) alone
holds the floor, sep(s, F(s)), and no other flow runs). The sum over the stages bounds
the cut bytes of every plan from below; the stage ILP adds one row per stage
(sum_i b[i] R[i][s] >= least(s)), and where its start plan already cuts no more than the
sum, that plan is optimal and no solver runs.

sep(s, X) is a max flow: each instruction split into an arc in -> out of capacity b[i]
(unbounded for lo[i] >= s), unbounded arcs out_i -> in_j along the edges, from a source
to every instruction of before(s), and from the `in` of every instruction of X to the
sink. Every candidate's cut is at least sep(s, F(s)), and exactly that where the residual
graph of the flow to F(s) does not reach the candidate (it adds no path to the sink):
those are not flowed. The others are flowed heaviest first; the lightest ones, that
together compute less than `Tuning.light_share` of the floor, are taken as cut off by
sep(s, F(s)) alone (a lower bound, so least(s) stays valid). Before the first flow and
after 1, 2, 4, ..., the candidates not flowed yet are taken at sep(s, F(s)) (a lower
bound on t(s)) and left out (an upper bound); where the two meet, that is t(s) and the
flows stop. On the T5-large-sized encoder-decoder at 4 stages, 3 flows are left of 294;
on 88 zoo problems (26 models and stage counts, up to 4 epsilons each), the bounds of
flowing every candidate but the light ones, in less time (`scripts/bench_pipeline.py`
times the ILP with its receipts). Without tightening, before(s) is empty and every bound
is 0. On the 24- and 72-layer GPTs the bounds sum to
the optimum (16 MiB a stage); on a T5-large-sized encoder-decoder into 4 stages to 80 of
96 MiB, since a stage may hold one of its two streams alone (the least cut to any set of
instructions that fills stage 1, solved exactly as an ILP, is 16 MiB there too: more
needs the stages together).
"""

from __future__ import annotations

import numpy as np
from ortools.graph.python import max_flow  # type: ignore[import-untyped]

from rhino.search.pipeline.problem import StageProblem
from rhino.search.problem import Tuning

_SLACK = 1e-6
"""A stage may hold a little less than `floor` (the float tolerance `evaluate` allows)."""


def least_receipts(
    problem: StageProblem,
    lo: tuple[int, ...],
    hi: tuple[int, ...],
    light_share: float = Tuning().light_share,
) -> tuple[int, ...]:
    """least(s) of the module docstring for s = 0 .. d-1 (least(0) = 0), for windows
    [lo, hi] that hold every plan meeting (order) and (balance); candidates lighter
    together than `light_share` of the floor are not flowed."""
    edges = np.array(
        [(i, j) for i, cs in enumerate(problem.consumers) for j in cs], dtype=np.int64
    ).reshape(-1, 2)
    return (0,) + tuple(
        _least(problem, np.array(lo), np.array(hi), s, edges, light_share)
        for s in range(1, problem.stages)
    )


def _least(
    problem: StageProblem,
    lo: np.ndarray,
    hi: np.ndarray,
    s: int,
    edges: np.ndarray,
    light_share: float,
) -> int:
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
        np.concatenate(
            [
                np.where(lo[nodes] >= s, unbounded, sizes),
                np.full(len(links) + len(sources), unbounded, dtype=np.int64),
            ]
        ),
    )
    # the sink: fed by the instructions fixed on stage s (an empty arc when there are
    # none, so that it exists), and by one candidate at a time
    fixed = kept & (lo == s) & (hi == s)
    sink = source + 1
    flow.add_arcs_with_capacity(
        np.concatenate([2 * at[fixed], [source]]),
        np.full(int(fixed.sum()) + 1, sink),
        np.concatenate([np.full(int(fixed.sum()), unbounded, dtype=np.int64), [0]]),
    )
    if flow.solve(source, sink) != flow.OPTIMAL:
        return 0
    together = flow.optimal_flow()
    compute = problem.compute
    held = sum(compute[j] for j in np.flatnonzero(fixed).tolist())
    if held >= floor:
        return together  # F alone holds the floor
    # a candidate that the residual graph of this flow does not reach adds no path to
    # the sink: it is cut off by `together`; one that it reaches adds one, its cut is more
    reached = np.zeros(sink + 1, dtype=bool)
    reached[flow.get_source_side_min_cut()] = True
    candidates = []
    for j in np.flatnonzero(kept & ~fixed & (hi >= s)).tolist():
        if compute[j] > 0 and reached[2 * at[j]]:
            candidates.append(j)
        else:
            held += compute[j]
    if held >= floor:
        return together
    candidates.sort(key=lambda j: (-compute[j], j))
    pending = sum(compute[j] for j in candidates)  # not flowed yet
    separated: list[tuple[int, float]] = []
    for k, j in enumerate(candidates):
        if pending < light_share * floor:
            break
        if k & (k - 1) == 0:  # after 0, 1, 2, 4, ... flows: do the bounds on t(s) meet?
            low = _threshold(held + pending, floor, together, separated)
            if low == _threshold(held, floor, together, separated):
                return together if low is None else low
        arc = flow.add_arc_with_capacity(2 * int(at[j]), sink, unbounded)
        status = flow.solve(source, sink)
        flow.set_arc_capacity(arc, 0)
        if status != flow.OPTIMAL:
            return 0
        separated.append((flow.optimal_flow(), compute[j]))
        pending -= compute[j]
    # the unflowed candidates are taken as cut off by `together`
    found = _threshold(held + max(pending, 0.0), floor, together, separated)
    return together if found is None else found


def _threshold(
    held: float, floor: float, together: int, separated: list[tuple[int, float]]
) -> int | None:
    """t(s) of the module docstring when the stage holds `held` compute cut off by
    `together` (the least cut) and the flowed candidates (cut, compute); None when they
    do not make up the floor. Every candidate not flowed has a cut of at least
    `together`: taken at `together` they give a lower bound on the t(s) of flowing them
    all, left out an upper bound (more candidates reach the floor at a cut no higher)."""
    if held >= floor:
        return together
    for cut, work in sorted(separated):
        held += work
        if held >= floor:
            return cut
    return None
