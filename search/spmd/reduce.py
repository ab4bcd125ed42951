"""Exact reductions of a `ShardingProblem` before the ILP, and how to undo them.

Every step keeps at least one optimal plan of the original problem (and, with a memory
budget, every step keeps the set of feasible plans' best cost), so the optimum of the
reduced core, expanded, is an optimum of the whole problem. The steps, applied until
none applies (a node at a time, in index order, so the result is deterministic):

- parallel edges (u, v) and (v, u) are summed into one matrix;
- forbidden strategies go: +inf node cost, or +inf against every strategy of a neighbour;
- dominated strategies go: k is dropped when some j is no worse in node cost, memory and
  every incident edge row (ties keep the lower index);
- separable edges, C[k, l] = a[k] + b[l] (all-zero ones included), fold into the two
  nodes' costs;
- a node left with one strategy becomes a constant;
- a node with one neighbour u (a leaf) folds into u: c_u[k] += min_l (C[k, l] + c_v[l]),
  remembering the best l for each k (Alpa's / XLA's "follower" merging, PBQP's RI);
- a node with two neighbours u, w (a chain link) becomes an edge between them:
  C'[k, m] = min_l (C_uv[k, l] + c_v[l] + C_vw[l, m]) (PBQP's RII);
- a node with no neighbours takes its cheapest strategy.

With a budget, memory makes the last three exact only when the cheapest l can always be
one of the node's smallest-memory strategies (then the node's memory is a constant);
otherwise the node stays in the core. Node memory is kept as a varying part (its
minimum subtracted) plus a constant `base`, which is all the ILP needs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from rhino.hlo.errors import InfeasibleError
from rhino.search.problem import ProblemNode, ShardingProblem
from rhino.search.spmd.identity import ByArray

SEPARABLE_RTOL = 1e-12
"""An edge is separable when C - (a + b) is within this of max |C| everywhere."""
WHOLE_BYTES = 1e-9
"""A memory term within this above a whole number of bytes (float sums of byte counts)
rounds down to it in the memory rows' integer terms."""
MAX_SERIES_WORK = 2_000_000
"""Largest s_u * s_v * s_w table for eliminating a chain link."""
K = TypeVar("K")
KEPT, FOLDED, FIXED, ISOLATED, LEAF, SERIES = range(6)
"""The kinds of step `Reduced.log` records: (KEPT, v, w) an edge found not separable from
v; (FOLDED, v, w, cost of v, cost of w) one folded; (FIXED, v, neighbours, their costs);
(ISOLATED, v, trail step, cost paid); (LEAF, v, u, table, cost of u); (SERIES, v, u, w,
table, matrix of (u, w))."""


@dataclass
class Reduced:
    """A reduced core of a problem plus the steps to expand a core choice back."""

    problem: ShardingProblem
    """The original problem."""
    alive: set[int]
    """Nodes still in the core (original indices)."""
    cost: dict[int, np.ndarray]
    """Core node -> cost of each remaining strategy (edge costs folded in)."""
    keep: dict[int, np.ndarray]
    """Core node -> original index of each remaining strategy."""
    edges: dict[tuple[int, int], np.ndarray]
    """(u, v) with u < v -> matrix over the remaining strategies of u (rows) and v."""
    neighbours: dict[int, set[int]]
    memory: dict[int, np.ndarray] = field(default_factory=dict)
    """Core node -> varying memory per remaining strategy (minimum 0); only with a
    budget, and only where it varies."""
    base: list[float] = field(default_factory=list)
    """Node -> bytes it holds whatever the (remaining) choice, over its live interval."""
    offset: float = 0.0
    """Seconds every plan pays that are no longer in the core's costs."""
    trail: list[tuple] = field(default_factory=list)
    """Eliminations in order: ("fixed", v, k), ("leaf", v, u, table[k_u]),
    ("series", v, u, w, table[k_u, k_w]), all in original strategy indices."""
    counts: dict[str, int] = field(default_factory=dict)
    unpruned: dict[int, tuple[np.ndarray | None, ...]] = field(default_factory=dict)
    """Node -> the arrays `_prune` read when it last found nothing to drop: while they are
    the same objects it finds nothing again (every change to a cost or an edge makes a
    new array)."""
    inseparable: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    """Edge -> its matrix when `_fold_separable` last found it not separable (likewise)."""
    dominance: bool = True
    """Are dominated strategies dropped (see `reduce_problem`)?"""
    finite: bool = False
    """Was every cost, memory and matrix finite to begin with, with no sum of them near
    overflow (so nothing is forbidden, and nothing the reductions make is infinite)?
    Found only where the dominance test is off: `_prune` then has nothing to do."""
    log: list[tuple] | None = None
    """Where the run is recorded (`rhino.search.spmd.replay`): each step as it is taken,
    with the arrays it made."""

    def matrix(self, a: int, b: int) -> np.ndarray:
        """The edge matrix oriented a (rows) x b (columns)."""
        return self.edges[(a, b)] if a < b else self.edges[(b, a)].T

    def expand(self, core_choice: dict[int, int]) -> tuple[int, ...]:
        """The full choice (original indices) from a core choice (remaining indices)."""
        choice = [-1] * len(self.problem.nodes)
        for v, k in core_choice.items():
            choice[v] = int(self.keep[v][k])
        for step in reversed(self.trail):
            kind, v = step[0], step[1]
            if kind == "fixed":
                choice[v] = step[2]
            elif kind == "leaf":
                choice[v] = int(step[3][choice[step[2]]])
            else:
                choice[v] = int(step[4][choice[step[2]], choice[step[3]]])
            if choice[v] < 0:
                raise AssertionError(f"reduction trail broken at node {v}")  # pragma: no cover
        if -1 in choice:
            raise AssertionError("expanded choice misses a node")  # pragma: no cover
        return tuple(choice)


def initial(problem: ShardingProblem) -> Reduced:
    """The problem as a core with no reduction but the summing of parallel edges."""
    n = len(problem.nodes)
    budget = problem.budget is not None
    # the problem's arrays themselves, not copies: a reduction writes new arrays, never
    # into these (and nodes of one strategy count share one range of indices)
    ranges: dict[int, np.ndarray] = {}
    keep = {}
    for v, node in enumerate(problem.nodes):
        size = len(node.labels)
        found = ranges.get(size)
        if found is None:
            found = ranges[size] = np.arange(size)
        keep[v] = found
    r = Reduced(
        problem=problem,
        alive=set(range(n)),
        cost={v: node.cost for v, node in enumerate(problem.nodes)},
        keep=keep,
        edges={},
        neighbours={v: set() for v in range(n)},
        base=[0.0] * n,
    )
    transposed: dict[int, np.ndarray] = {}  # one view per shared matrix: tested once
    for e in problem.edges:
        if e.u < e.v:
            key, m = (e.u, e.v), e.cost
        else:
            key, m = (e.v, e.u), transposed.setdefault(id(e.cost), e.cost.T)
        r.edges[key] = r.edges[key] + m if key in r.edges else m
        r.neighbours[e.u].add(e.v)
        r.neighbours[e.v].add(e.u)
    lows: dict[int, float] = {}  # nodes of a kind share their memory array
    for v, node in enumerate(problem.nodes):
        low = lows.get(id(node.memory))
        if low is None:
            low = lows[id(node.memory)] = float(node.memory.min())
        r.base[v] = low
        if budget and (node.memory > low).any():
            r.memory[v] = node.memory - low
    return r


Matrices = ByArray[tuple[bool, float]]
"""What `_find_inseparable` found of edge matrices, by array: is it far from separable,
and its largest |value|."""


def reduce_problem(
    problem: ShardingProblem,
    dominance: bool = True,
    far: Matrices | None = None,
    record: bool = False,
) -> Reduced:
    """Apply every exact reduction until none applies. InfeasibleError when a node has
    no allowed strategy left. Without `dominance`, dominated strategies stay (forbidden
    ones still go): on the small problems of O2's windows the ILP settles them faster
    than the test does, and O2's refinement of a large core does not need them gone
    (`reduce_further` drops them later if wanted). `far` remembers which edge matrices
    are far from separable, for problems that share their matrices (O2's windows). With
    `record`, the run's steps go to `Reduced.log` where it can be replayed (no dominance
    test, no budget, every value finite: `rhino.search.spmd.replay`)."""
    return reduce_core(initial(problem), dominance, far, record)


def reduce_core(
    r: Reduced, dominance: bool = True, far: Matrices | None = None, record: bool = False
) -> Reduced:
    """`reduce_problem` of the core `initial` made (in place)."""
    r.dominance = dominance
    peaks = _find_inseparable(r, far)
    r.finite = not dominance and _all_finite(r, peaks)
    if record and r.finite and r.problem.budget is None:
        r.log = []
    r.counts = dict.fromkeys(
        ("pruned", "separable", "fixed", "leaf", "series", "isolated", "memory_free"), 0
    )
    _run(r, range(len(r.problem.nodes)))
    return r


def reduce_further(r: Reduced) -> None:
    """Go on reducing `r` (in place) with the dominance test, if it ran without."""
    if r.dominance:
        return
    r.dominance = True
    r.log = None  # what is recorded is the run without the test
    r.unpruned.clear()  # found without the dominance test
    _run(r, sorted(r.alive))


OVERFLOW_GUARD = 1e300
"""Largest |value| times the number of costs and matrices (a bound on any sum the
reductions make of them) below which `Reduced.finite` holds for finite values."""


def _all_finite(r: Reduced, peaks: dict[int, float]) -> bool:
    """`Reduced.finite` of a core no reduction has run on yet (its arrays read a stack at a
    time: a whole copy of T5-large's would be 100 MB more peak memory). `peaks`: the
    largest |value| of edge matrices, by id, where `_find_inseparable` has it."""
    limit = overflow_limit(r)
    arrays = {id(a): a for a in r.cost.values()}
    arrays.update((id(a), a) for a in r.memory.values())
    for m in r.edges.values():
        peak = peaks.get(id(m))
        if peak is None:
            arrays[id(m)] = m
        elif not peak < limit:  # nan or inf: not below
            return False
    return finite_below(arrays.values(), limit)


def overflow_limit(r: Reduced) -> float:
    """The largest |value| a core's arrays may hold for `Reduced.finite`."""
    return OVERFLOW_GUARD / max(1, len(r.cost) + len(r.edges))


def finite_below(arrays: Iterable[np.ndarray], limit: float) -> bool:
    """Is every value of the arrays finite and below `limit` in magnitude?"""
    for _, stack in stacked((None, a) for a in arrays):
        if not float(np.abs(stack).max(initial=0.0)) < limit:  # nan or inf: not below
            return False
    return True


def _run(r: Reduced, nodes: Iterable[int]) -> None:
    """The reductions until none applies, starting from `nodes` in order."""
    queue = deque(nodes)
    queued = set(queue)

    def push(v: int) -> None:
        if v in r.alive and v not in queued:
            queued.add(v)
            queue.append(v)

    # inf - inf in `_fold_separable`'s test of a forbidden pair is nan, as it should be:
    # silenced here once, not per edge (numpy's errstate is slow to enter)
    with np.errstate(invalid="ignore"):
        while queue:
            while queue:
                v = queue.popleft()
                queued.discard(v)
                if v not in r.alive:
                    continue
                if v not in r.memory and len(r.neighbours[v]) <= 2:
                    # a leaf or chain link goes whatever its strategies: pruning them first
                    # would change nothing the elimination leaves behind
                    _eliminate(r, v, push)
                    if v not in r.alive:
                        continue
                while _prune(r, v, push) or _fold_separable(r, v, push):
                    pass
                _eliminate(r, v, push)
            for v in _memory_free(r):
                push(v)


def _memory_free(r: Reduced) -> list[int]:
    """Drop the memory of the nodes that are in no row that can bind (whatever they and
    everyone else choose, every step they are live at stays within the budget), so that
    the eliminations can take them; returns those nodes."""
    if not r.memory:
        return []
    rows = memory_rows(r)
    bound = set(rows.always)
    for members, _ in rows.rows:
        bound.update(members.tolist())
    free = [v for v in r.memory if v not in bound]
    for v in free:
        del r.memory[v]  # its `base` stays counted; the rest can never matter
    r.counts["memory_free"] += len(free)
    return free


# -- strategy pruning ------------------------------------------------------------------


def _prune(r: Reduced, v: int, push: Callable[[int], None]) -> bool:
    """Drop forbidden and dominated strategies of v; True if any went."""
    if r.finite and not r.dominance:
        return False  # nothing is forbidden, and nothing else is tested
    neighbours = sorted(r.neighbours[v])
    read = (r.cost[v], r.memory.get(v), *(r.edges[(min(v, w), max(v, w))] for w in neighbours))
    last = r.unpruned.get(v)
    if (
        last is not None
        and len(last) == len(read)
        and all(a is b for a, b in zip(last, read, strict=True))
    ):
        return False  # nothing it reads changed since it last found nothing
    s = len(r.keep[v])
    parts = [r.cost[v][:, None]]
    if v in r.memory:
        parts.append(r.memory[v][:, None])
    parts += [r.matrix(v, w) for w in neighbours]
    features = np.concatenate(parts, axis=1)
    if np.isfinite(features).all():
        if not r.dominance:  # nothing forbidden, and nothing else to test
            r.unpruned[v] = read
            return False
        allowed = np.ones(s, dtype=bool)
    else:
        allowed = np.isfinite(r.cost[v])
        for w in neighbours:
            allowed &= np.isfinite(r.matrix(v, w)).any(axis=1)
    if not allowed.any():
        node = r.problem.nodes[v]
        raise InfeasibleError(
            f"node %{node.name}: every strategy is forbidden (infinite cost, alone or "
            f"against every remaining strategy of a neighbour)"
        )
    keep = allowed.copy()
    if s > 1 and r.dominance:
        keep &= ~_dominated(features, parts, allowed)
    if keep.all():
        r.unpruned[v] = read
        return False
    r.counts["pruned"] += int(s - keep.sum())
    _restrict(r, v, np.flatnonzero(keep))
    for w in r.neighbours[v]:
        push(w)
    return True


DOMINANCE_BROADCAST = 20_000
"""Up to this many comparisons (strategies^2 x features) the dominance test compares
every pair at once; above it, pairs are filtered block by block."""


def _dominated(features: np.ndarray, parts: list[np.ndarray], allowed: np.ndarray) -> np.ndarray:
    """Strategies (rows of `features`, the `parts` side by side) that an allowed one
    dominates: no worse in every feature and better in one, or equal with a lower index
    (so one of equals stays)."""
    s = len(features)
    if s * features.size <= DOMINANCE_BROADCAST:
        # no_worse[j, i]: j is no worse than i everywhere
        no_worse = (features[:, None, :] <= features[None, :, :]).all(axis=2)
        index = np.arange(s)
        dominates = no_worse & (~no_worse.T | (index[:, None] < index[None, :]))
        dominates[index, index] = False
        return dominates[allowed].any(axis=0)
    # j no worse than i everywhere implies it for each block's row sum: the pairs that
    # pass on the sums are the only ones compared in full
    sums = np.stack([part.sum(axis=1) for part in parts], axis=1)
    if np.isfinite(sums).all():
        candidates = (sums[:, None, :] <= sums[None, :, :]).all(axis=2)
    else:  # inf - inf: no shortcut
        candidates = np.ones((s, s), dtype=bool)
    candidates &= allowed[:, None]
    np.fill_diagonal(candidates, False)
    j, i = np.nonzero(candidates)
    out = np.zeros(s, dtype=bool)
    if not len(j):
        return out
    ok = (features[j] <= features[i]).all(axis=1)
    j, i = j[ok], i[ok]
    equal_back = (features[i] <= features[j]).all(axis=1)  # i no worse than j too
    out[i[~equal_back | (j < i)]] = True
    return out


def _restrict(r: Reduced, v: int, rows: np.ndarray) -> None:
    r.cost[v] = r.cost[v][rows]
    r.keep[v] = r.keep[v][rows]
    for w in r.neighbours[v]:
        key = (min(v, w), max(v, w))
        r.edges[key] = r.edges[key][rows, :] if v < w else r.edges[key][:, rows]
    if v in r.memory:
        memory = r.memory[v][rows]
        low = float(memory.min())
        r.base[v] += low
        if (memory > low).any():
            r.memory[v] = memory - low
        else:
            del r.memory[v]


# -- edges -----------------------------------------------------------------------------


STACK_BYTES = 4 << 20
"""Bytes of arrays `stacked` puts in one stack (bounds its memory)."""


def stacked(arrays: Iterable[tuple[K, np.ndarray]]) -> Iterator[tuple[list[K], np.ndarray]]:
    """The arrays, of one dtype and shape at a time, stacked in runs of at most
    STACK_BYTES: (their keys, the stack), to test or digest many small arrays in one
    numpy call each."""
    groups: dict[tuple[np.dtype, tuple[int, ...]], list[tuple[K, np.ndarray]]] = {}
    for key, array in arrays:
        groups.setdefault((array.dtype, array.shape), []).append((key, array))
    for members in groups.values():
        step = max(1, STACK_BYTES // max(members[0][1].nbytes, 1))
        for i in range(0, len(members), step):
            run = members[i : i + step]
            yield [key for key, _ in run], np.stack([array for _, array in run])


def consecutive(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """starts[i], starts[i] + 1, ..., starts[i] + counts[i] - 1, for each i in turn."""
    offsets = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(starts, counts) + offsets


def _find_inseparable(r: Reduced, known: Matrices | None = None) -> dict[int, float]:
    """Mark in `r.inseparable` the edges whose matrix is far from separable, tested all at
    once, matrices of one shape stacked (`_fold_separable` tests them one by one, each
    oriented from the node it visits: the batch marks only edges that fail its test by
    ten times its tolerance or more, which no orientation's rounding can move); `known`
    has the answers for matrices tested before, and gets those for the others. Returns
    the largest |value| of each matrix tested or known, by id (`_all_finite` reads them:
    finding them again was 3% of T5-large's refinement)."""
    todo: dict[int, tuple[np.ndarray, list[tuple[int, int]]]] = {}  # one test per matrix
    peaks: dict[int, float] = {}
    for key, m in r.edges.items():
        if m.ndim != 2 or not m.size:
            continue
        found = known.get(m) if known is not None else None
        if found is None:
            todo.setdefault(id(m), (m, []))[1].append(key)
            continue
        peaks[id(m)] = found[1]
        if found[0]:
            r.inseparable[key] = m
    for batch, m in stacked((keys, m) for m, keys in todo.values()):
        with np.errstate(invalid="ignore"):
            a, b = m[:, :, :1], m[:, :1, :] - m[:, :1, :1]
            off = np.abs(m - a - b).max(axis=(1, 2))
            largest = np.abs(m).max(axis=(1, 2))
            far = (~np.isfinite(off) | (off > 10 * SEPARABLE_RTOL * largest)).tolist()
        for keys, is_far, peak in zip(batch, far, largest.tolist(), strict=True):
            matrix = r.edges[keys[0]]
            peaks[id(matrix)] = peak
            if is_far:
                r.inseparable.update(dict.fromkeys(keys, matrix))
            if known is not None:
                known.put(matrix, (is_far, peak))
    return peaks


def _fold_separable(r: Reduced, v: int, push: Callable[[int], None]) -> bool:
    """Fold every edge of v whose matrix is a[k] + b[l] into the two nodes' costs."""
    folded = False
    log = r.log
    for w in sorted(r.neighbours[v]):
        key = (min(v, w), max(v, w))
        if r.inseparable.get(key) is r.edges[key]:
            if log is not None:
                log.append((KEPT, v, w))
            continue  # found not separable before, and unchanged since
        terms = separable_terms(r.matrix(v, w))
        if terms is None:
            r.inseparable[key] = r.edges[key]
            if log is not None:
                log.append((KEPT, v, w))
            continue
        a, b = terms
        r.cost[v] = r.cost[v] + a
        r.cost[w] = r.cost[w] + b
        if log is not None:
            log.append((FOLDED, v, w, r.cost[v], r.cost[w]))
        _remove_edge(r, v, w)
        r.counts["separable"] += 1
        push(w)
        folded = True
    return folded


def separable_terms(m: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(a, b) with m[k, l] = a[k] + b[l] (within SEPARABLE_RTOL of max |m|), or None."""
    # C - (a + b), nan or inf where C is not finite (a forbidden pair: not separable;
    # `_run` silences numpy's warning of it)
    a, b = m[:, 0], m[0, :] - m[0, 0]
    off = float(np.abs(m - a[:, None] - b[None, :]).max())
    if off != 0.0 and not (math.isfinite(off) and off <= SEPARABLE_RTOL * float(np.abs(m).max())):
        return None
    return a, b


def _remove_edge(r: Reduced, a: int, b: int) -> None:
    del r.edges[(min(a, b), max(a, b))]
    r.neighbours[a].discard(b)
    r.neighbours[b].discard(a)


def _add_to_edge(r: Reduced, a: int, b: int, m: np.ndarray) -> None:
    """Add `m` (oriented a x b) to edge (a, b), creating it if needed."""
    key, m = ((a, b), m) if a < b else ((b, a), m.T)
    r.edges[key] = r.edges[key] + m if key in r.edges else m.copy()
    r.neighbours[a].add(b)
    r.neighbours[b].add(a)


# -- node elimination ------------------------------------------------------------------


def _smallest(r: Reduced, v: int) -> np.ndarray | None:
    """Strategies of v whose memory is the node's minimum; None for all of them (always
    so without a budget)."""
    if v not in r.memory:
        return None
    return np.flatnonzero(r.memory[v] == 0)


def cheapest(table: np.ndarray, small: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
    """Min over axis 1 of `table` and its argmin, taken among `small` only; None when that
    is dearer than the min over all (so memory would have to be traded for cost)."""
    if small is None:
        pick = table.argmin(axis=1)
        return table[np.arange(len(table)), pick], pick
    best_all = table.min(axis=1)
    sub = table[:, small]
    pick = sub.argmin(axis=1)
    best = sub[np.arange(len(sub)), pick]
    if not np.array_equal(best, best_all):
        return None
    return best_all, small[pick]


def _eliminate(r: Reduced, v: int, push: Callable[[int], None]) -> None:
    neighbours = sorted(r.neighbours[v])
    small = _smallest(r, v)
    cost = r.cost[v]
    log = r.log
    if len(cost) == 1:
        for w in neighbours:
            r.cost[w] = r.cost[w] + r.matrix(w, v)[:, 0]
            _remove_edge(r, v, w)
            push(w)
        if log is not None:
            log.append((FIXED, v, tuple(neighbours), tuple(r.cost[w] for w in neighbours)))
        _kill(r, v, ("fixed", v, int(r.keep[v][0])), cost[0], "fixed")
    elif not neighbours:
        found = cheapest(cost[None, :], small)
        if found is not None:
            best, pick = found
            step = ("fixed", v, int(r.keep[v][pick[0]]))
            if log is not None:
                log.append((ISOLATED, v, step, best[0]))
            _kill(r, v, step, best[0], "isolated")
    elif len(neighbours) == 1:
        (u,) = neighbours
        leaf = leaf_terms(r, u, v, small)
        if leaf is None:
            return
        best, table = leaf
        r.cost[u] = r.cost[u] + best
        if log is not None:
            log.append((LEAF, v, u, table, r.cost[u]))
        _remove_edge(r, u, v)
        _kill(r, v, ("leaf", v, u, table), 0.0, "leaf")
        push(u)
    elif len(neighbours) == 2:
        u, w = neighbours
        a, b = r.matrix(u, v), r.matrix(v, w)
        if a.shape[0] * a.shape[1] * b.shape[1] > MAX_SERIES_WORK:
            return
        series = series_terms(r, u, v, w, small)
        if series is None:
            return
        best, table = series
        _remove_edge(r, u, v)
        _remove_edge(r, v, w)
        _add_to_edge(r, u, w, best)
        if log is not None:
            log.append((SERIES, v, u, w, table, r.edges[(u, w)]))
        _kill(r, v, ("series", v, u, w, table), 0.0, "series")
        push(u)
        push(w)


def leaf_terms(
    r: Reduced, u: int, v: int, small: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Leaf v folded into its one neighbour u: what u's costs gain, and v's best strategy
    (original index) for each of u's (-1 where u's was pruned); None where memory would
    have to be traded for cost (see `cheapest`)."""
    found = cheapest(r.matrix(u, v) + r.cost[v][None, :], small)
    if found is None:
        return None
    best, pick = found
    table = np.full(len(r.problem.nodes[u].labels), -1)
    table[r.keep[u]] = r.keep[v][pick]
    return best, table


def series_terms(
    r: Reduced, u: int, v: int, w: int, small: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Chain link v (neighbours u < w) eliminated: the matrix between u and w it leaves
    (u's strategies rows), and v's best strategy (original index) for each pair of
    theirs; None as `leaf_terms`."""
    a, b = r.matrix(u, v), r.matrix(v, w)
    su, sw = a.shape[0], b.shape[1]
    # [k_u, l, k_w], each term (a + c) + b as a[:, :, None] + c + b sums it
    joint = (a + r.cost[v][None, :])[:, :, None] + b[None, :, :]
    found = cheapest(joint.transpose(0, 2, 1).reshape(su * sw, -1), small)
    if found is None:
        return None
    best, pick = found
    picked = r.keep[v][pick].reshape(su, sw)
    shape = (len(r.problem.nodes[u].labels), len(r.problem.nodes[w].labels))
    if (su, sw) == shape:  # nothing pruned: original indices are remaining ones
        table = picked
    else:
        table = np.full(shape, -1)
        table[np.ix_(r.keep[u], r.keep[w])] = picked
    return best.reshape(su, sw), table


def _kill(r: Reduced, v: int, step: tuple, paid: float, kind: str) -> None:
    r.trail.append(step)
    r.offset += float(paid)
    r.alive.discard(v)
    r.memory.pop(v, None)
    del r.cost[v]
    del r.keep[v]
    del r.neighbours[v]
    r.counts[kind] += 1


# -- memory rows -----------------------------------------------------------------------


@dataclass
class MemoryRows:
    """The memory constraints of a core: for each row, sum over `always` and the row's
    members of terms[v][k_v] <= rhs (whole bytes, rounded up, above each node's base)."""

    terms: dict[int, np.ndarray]
    """Core node -> varying bytes per remaining strategy (int64, minimum 0)."""
    always: list[int]
    """Nodes with varying memory live at every step: in every row."""
    rows: list[tuple[np.ndarray, int]]
    """(timed member nodes, right-hand side) of each row that can bind."""


def memory_rows(r: Reduced) -> MemoryRows:
    """The rows needed for the budget: one at each step that starts some interval and is
    followed by the end of one before the next start (a locally largest live set, the
    only steps where the peak can be); one row over everything without liveness. Rows
    that cannot bind even with every node at its largest are left out, and of
    neighbouring rows over the same members only the tightest is kept. Built with numpy:
    a node covers a range of those steps, so sums over a step's members are prefix sums.
    """
    problem = r.problem
    nodes = problem.nodes
    budget = float(problem.budget) if problem.budget is not None else math.inf
    terms = {v: np.ceil(r.memory[v] - WHOLE_BYTES).astype(np.int64) for v in sorted(r.memory)}
    always = [v for v in terms if nodes[v].live is None]
    if not math.isfinite(budget):
        return MemoryRows(terms, always, [])
    always_const = problem.constant_memory + sum(
        r.base[v] for v, n in enumerate(nodes) if n.live is None
    )
    head_max = sum(int(terms[v].max()) for v in always)
    timed = np.array([v for v in terms if _spans(nodes[v].live)], dtype=np.int64)
    const = [v for v, n in enumerate(nodes) if _spans(n.live) and r.base[v]]
    t_first, t_last = _live_arrays(nodes, timed)
    c_first, c_last = _live_arrays(nodes, const)
    c_size = np.array([r.base[v] for v in const], dtype=np.float64)
    t_max = np.array([int(terms[v].max()) for v in timed.tolist()], dtype=np.int64)
    starts = np.unique(np.concatenate([t_first, c_first]))
    if not len(starts):  # nothing timed: one row over everything
        whole = math.floor(budget - always_const + 1e-6)
        return MemoryRows(terms, always, [(timed, whole)] if head_max > whole else [])
    ends = np.sort(np.concatenate([t_last, c_last]))
    # a start t is a point when the first end at or after t comes before the next start
    j = np.searchsorted(ends, starts)
    after = np.append(starts[1:], np.iinfo(np.int64).max)
    first_end = ends[np.minimum(j, len(ends) - 1)]
    points = starts[(j < len(ends)) & (first_end < after)]
    points = np.union1d(points, starts[-1:])
    # node v is a member of points lo[v] <= i < hi[v]
    t_lo, t_hi = np.searchsorted(points, t_first), np.searchsorted(points, t_last, "right")
    c_lo, c_hi = np.searchsorted(points, c_first), np.searchsorted(points, c_last, "right")
    held = always_const + _range_sums(len(points), c_lo, c_hi, c_size)
    largest = _range_sums(len(points), t_lo, t_hi, t_max.astype(np.float64))
    rhs = np.floor(budget - held + 1e-6)
    binding = np.flatnonzero(head_max + largest > rhs)
    if not len(binding):
        return MemoryRows(terms, always, [])
    # neighbouring binding points with no member starting or ending between them share
    # their members: one row, the smallest right-hand side
    changes = np.zeros(len(points) + 1, dtype=np.int64)
    np.add.at(changes, t_lo, 1)
    np.add.at(changes, t_hi, 1)
    seen = np.cumsum(changes)
    new_group = np.ones(len(binding), dtype=bool)
    new_group[1:] = seen[binding[1:]] != seen[binding[:-1]]
    group = np.cumsum(new_group) - 1
    kept = binding[new_group]
    group_rhs = np.full(len(kept), np.inf)
    np.minimum.at(group_rhs, group, rhs[binding])
    members = _members(kept, timed, t_lo, t_hi)
    return MemoryRows(
        terms, always, [(m, int(b)) for m, b in zip(members, group_rhs.tolist(), strict=True)]
    )


def _spans(live: tuple[int, int] | None) -> bool:
    """Is the node live at some step (an interval, not empty)?"""
    return live is not None and live[0] <= live[1]


def _live_arrays(
    nodes: tuple[ProblemNode, ...], ids: Iterable[int]
) -> tuple[np.ndarray, np.ndarray]:
    first = np.array([nodes[v].live[0] for v in ids], dtype=np.int64)
    last = np.array([nodes[v].live[1] for v in ids], dtype=np.int64)
    return first, last


def _range_sums(n: int, lo: np.ndarray, hi: np.ndarray, value: np.ndarray) -> np.ndarray:
    """For i in 0..n-1, the sum of value[j] over the j with lo[j] <= i < hi[j]."""
    delta = np.zeros(n + 1, dtype=np.float64)
    np.add.at(delta, lo, value)
    np.add.at(delta, hi, -value)
    return np.cumsum(delta)[:n]


def _members(kept: np.ndarray, ids: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[np.ndarray]:
    """For each point index in `kept` (sorted), the ids whose [lo, hi) holds it (sorted)."""
    a, b = np.searchsorted(kept, lo), np.searchsorted(kept, hi)
    count = b - a
    node = np.repeat(ids, count)
    row = consecutive(a, count)  # of each (node, row) pair: a[v], ..., b[v] - 1 for each v
    order = np.lexsort((node, row))
    node, row = node[order], row[order]
    return np.split(node, np.searchsorted(row, np.arange(1, len(kept))))
