"""The whole-graph reductions of `rhino.search.spmd.reduce` made again for a problem that
differs from one reduced before in a few nodes' costs and edges' matrices: the plans of
the combined-collectives search after the first (a closed key's members cost more).

Without the dominance test, without a budget and with every value finite, which steps
the reductions take depends on the graph and on one test of values only: is this edge
separable? So the first run is recorded (`recorded`: each step and the arrays it made),
and a later problem of the same graph replays it (`replayed`): a step whose inputs are
all as they were takes the arrays it made then; one that reads a changed array is made
again, by the same functions on the same values in the same order as a run of its own
would, and an array it makes that comes out the same, bit for bit, counts as unchanged
again. Each separability test whose matrix changed is made again, and where one comes
out otherwise, the replay gives up (None): the caller then reduces the problem whole.
So a replayed reduction is, to the bit, what `reduce_problem(tie_broken(problem),
dominance=False)` gives, in a fraction of its time where little changed (every plan of
the 48-layer GPT-2's search has the same 43k steps, most of them unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rhino.search.problem import ShardingProblem
from rhino.search.spmd.reduce import (
    FIXED,
    FOLDED,
    ISOLATED,
    KEPT,
    LEAF,
    Reduced,
    cheapest,
    finite_below,
    initial,
    leaf_terms,
    overflow_limit,
    reduce_core,
    separable_terms,
    series_terms,
)
from rhino.search.spmd.solver import tie_broken

CHANGED_SHARE = 0.25
"""A problem with more than this share of its nodes changed is reduced whole: a replay
would make most steps again, and more slowly."""


@dataclass(frozen=True)
class Start:
    """A core as `initial` made it: the arrays its dicts held (not copies)."""

    cost: dict[int, np.ndarray]
    edges: dict[tuple[int, int], np.ndarray]
    keep: dict[int, np.ndarray]
    base: list[float]
    parallel: dict[tuple[int, int], tuple[int, ...]]
    """Core key -> the problem's edges summed into it, where there are two or more."""


@dataclass(frozen=True)
class Recording:
    """A run of the reductions (see module doc)."""

    base: ShardingProblem
    """The problem reduced, before its tie break: later problems differ from it where
    their nodes and edges are other objects."""
    broken: ShardingProblem
    """`base` with its tie break."""
    start: Start
    steps: list[tuple]
    """`Reduced.log`: the steps in order, with the arrays they made."""
    alive: frozenset[int]
    neighbours: dict[int, frozenset[int]]
    counts: dict[str, int]
    inseparable: frozenset[tuple[int, int]]
    """The core's edges found not separable."""


def recorded(problem: ShardingProblem) -> tuple[Reduced, Recording | None]:
    """`reduce_problem(tie_broken(problem), dominance=False)`, and its recording where it
    can be replayed (else None)."""
    broken = tie_broken(problem)
    r = initial(broken)
    parallel: dict[tuple[int, int], list[int]] = {}
    for i, e in enumerate(problem.edges):
        parallel.setdefault((min(e.u, e.v), max(e.u, e.v)), []).append(i)
    start = Start(
        dict(r.cost),
        dict(r.edges),
        dict(r.keep),
        list(r.base),
        {k: tuple(i) for k, i in parallel.items() if len(i) > 1},
    )
    reduce_core(r, dominance=False, record=True)
    steps, r.log = r.log, None
    if steps is None:
        return r, None
    return r, Recording(
        base=problem,
        broken=broken,
        start=start,
        steps=steps,
        alive=frozenset(r.alive),
        neighbours={v: frozenset(n) for v, n in r.neighbours.items()},
        counts=dict(r.counts),
        inseparable=frozenset(k for k, m in r.inseparable.items() if r.edges.get(k) is m),
    )


def replayed(recording: Recording, problem: ShardingProblem) -> Reduced | None:
    """`reduce_problem(tie_broken(problem), dominance=False)` from `recording` of the same
    graph, or None where it cannot be replayed (see module doc)."""
    changed = _changed(recording.base, problem)
    if changed is None:
        return None
    nodes, edge_keys = changed
    r = _started(recording, problem, nodes, edge_keys)
    arrays = [r.cost[v] for v in nodes] + [r.edges[k] for k in edge_keys]
    if not finite_below(arrays, overflow_limit(r)):
        return None
    run = _Replay(r, set(nodes), set(edge_keys))
    if not run.steps(recording.steps):
        return None
    r.alive = set(recording.alive)
    r.neighbours = {v: set(n) for v, n in recording.neighbours.items()}
    r.counts = dict(recording.counts)
    r.finite = True
    r.dominance = False
    kept = {k: r.edges[k] for k in recording.inseparable if k not in run.dirty_edges}
    kept.update((k, m) for k, m in run.inseparable.items() if r.edges.get(k) is m)
    r.inseparable = kept
    return r


def _started(
    recording: Recording,
    problem: ShardingProblem,
    nodes: list[int],
    keys: dict[tuple[int, int], int],
) -> Reduced:
    """`initial(tie_broken(problem))` (its neighbours left out) from the recording's start:
    only the changed `nodes` and edge `keys` made again."""
    broken = tie_broken(problem, like=(recording.base, recording.broken))
    start = recording.start
    r = Reduced(
        problem=broken,
        alive=set(),
        cost=dict(start.cost),
        keep=dict(start.keep),
        edges=dict(start.edges),
        neighbours={},
        base=list(start.base),
    )
    for v in nodes:
        node = broken.nodes[v]
        r.cost[v] = node.cost
        r.base[v] = float(node.memory.min())
    edges = problem.edges
    for key, at in keys.items():
        summed = None
        for i in start.parallel.get(key, (at,)):
            e = edges[i]
            m = e.cost if e.u < e.v else e.cost.T
            summed = m if summed is None else summed + m
        assert summed is not None
        r.edges[key] = summed
    return r


def _changed(
    base: ShardingProblem, problem: ShardingProblem
) -> tuple[list[int], dict[tuple[int, int], int]] | None:
    """The nodes and the edges (core key -> one of the problem's edges into it) where
    `problem` differs from `base` (other objects), or None where it is not the same graph,
    has a budget, or changed too much."""
    if (
        problem.budget is not None
        or len(problem.nodes) != len(base.nodes)
        or len(problem.edges) != len(base.edges)
    ):
        return None
    nodes = [
        v for v, (a, b) in enumerate(zip(base.nodes, problem.nodes, strict=True)) if a is not b
    ]
    if len(nodes) > CHANGED_SHARE * len(problem.nodes):
        return None
    if any(len(problem.nodes[v].labels) != len(base.nodes[v].labels) for v in nodes):
        return None
    keys = {}
    for i, (a, b) in enumerate(zip(base.edges, problem.edges, strict=True)):
        if a is not b:
            if (a.u, a.v) != (b.u, b.v) or a.cost.shape != b.cost.shape:
                return None
            keys[(min(a.u, a.v), max(a.u, a.v))] = i
    return nodes, keys


class _Replay:
    """The recorded steps made again on `r` (from `initial`), with the core nodes whose
    costs and the edges whose matrices are not those of the recording."""

    def __init__(self, r: Reduced, dirty_costs: set[int], dirty_edges: set[tuple[int, int]]):
        self.r = r
        self.dirty_costs = dirty_costs
        self.dirty_edges = dirty_edges
        self.inseparable: dict[tuple[int, int], np.ndarray] = {}
        """Changed edges found not separable here, by the matrix tested."""

    def steps(self, steps: list[tuple]) -> bool:
        """Make every step; False where a separability test comes out otherwise."""
        r = self.r
        cost, edges, keep = r.cost, r.edges, r.keep
        changed_costs, changed_edges = self.dirty_costs, self.dirty_edges
        for step in steps:
            kind, v = step[0], step[1]
            if kind == KEPT or kind == FOLDED:
                w = step[2]
                key = (min(v, w), max(v, w))
                if kind == KEPT:
                    if key in changed_edges and self._terms(key, v, w) is not None:
                        return False
                    continue
                if key in changed_edges or v in changed_costs or w in changed_costs:
                    terms = self._terms(key, v, w)
                    if terms is None:
                        return False
                    cost[v] = self._cost(v, cost[v] + terms[0], step[3])
                    cost[w] = self._cost(w, cost[w] + terms[1], step[4])
                else:
                    cost[v], cost[w] = step[3], step[4]
                self._drop(key)
            elif kind == FIXED:
                for w, made in zip(step[2], step[3], strict=True):
                    key = (min(v, w), max(v, w))
                    if key in changed_edges or w in changed_costs:
                        cost[w] = self._cost(w, cost[w] + r.matrix(w, v)[:, 0], made)
                    else:
                        cost[w] = made
                    self._drop(key)
                self._kill(v, ("fixed", v, int(keep[v][0])), cost[v][0])
            elif kind == ISOLATED:
                trail_step, paid = step[2], step[3]
                if v in changed_costs:
                    best, pick = cheapest(cost[v][None, :], None)  # type: ignore[misc]
                    trail_step, paid = ("fixed", v, int(keep[v][pick[0]])), best[0]
                self._kill(v, trail_step, paid)
            elif kind == LEAF:
                u, table = step[2], step[3]
                key = (min(u, v), max(u, v))
                if key in changed_edges or v in changed_costs or u in changed_costs:
                    best, table = leaf_terms(r, u, v)  # type: ignore[misc]
                    cost[u] = self._cost(u, cost[u] + best, step[4])
                else:
                    cost[u] = step[4]
                self._drop(key)
                self._kill(v, ("leaf", v, u, table), 0.0)
            else:  # SERIES
                u, w, table = step[2], step[3], step[4]
                first, second = (min(u, v), max(u, v)), (min(v, w), max(v, w))
                joined = (u, w)  # u < w
                old = edges.get(joined)
                remade = (
                    first in changed_edges
                    or second in changed_edges
                    or v in changed_costs
                    or (old is not None and joined in changed_edges)
                )
                if remade:
                    best, table = series_terms(r, u, v, w)  # type: ignore[misc]
                self._drop(first)
                self._drop(second)
                if remade:
                    made = old + best if old is not None else best.copy()
                    edges[joined] = self._matrix(joined, made, step[5])
                else:
                    edges[joined] = step[5]
                    changed_edges.discard(joined)
                self._kill(v, ("series", v, u, w, table), 0.0)
        return True

    def _terms(self, key: tuple[int, int], v: int, w: int) -> tuple[np.ndarray, np.ndarray] | None:
        """`separable_terms` of edge `key` oriented from v (None: not separable). A changed
        matrix found not separable is not tested again while it stays, as
        `reduce._fold_separable` does."""
        matrix = self.r.edges[key]
        if self.inseparable.get(key) is matrix:
            return None
        terms = separable_terms(self.r.matrix(v, w))
        if terms is None and key in self.dirty_edges:
            self.inseparable[key] = matrix
        return terms

    def _cost(self, v: int, made: np.ndarray, recorded: np.ndarray) -> np.ndarray:
        """v's new cost `made`: the recorded array where it is the same, bit for bit."""
        if _same(made, recorded):
            self.dirty_costs.discard(v)
            return recorded
        self.dirty_costs.add(v)
        return made

    def _matrix(self, key: tuple[int, int], made: np.ndarray, recorded: np.ndarray) -> np.ndarray:
        if _same(made, recorded):
            self.dirty_edges.discard(key)
            return recorded
        self.dirty_edges.add(key)
        return made

    def _drop(self, key: tuple[int, int]) -> None:
        del self.r.edges[key]
        self.dirty_edges.discard(key)

    def _kill(self, v: int, trail_step: tuple, paid: float) -> None:
        r = self.r
        r.trail.append(trail_step)
        r.offset += float(paid)
        del r.cost[v]
        del r.keep[v]
        self.dirty_costs.discard(v)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """The same shape, type and bits."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
