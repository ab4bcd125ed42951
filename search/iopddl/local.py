"""A fast primal method for large problems under a memory budget: local search that
never leaves the budget.

Data
    c[v][k]         node cost (+inf: forbidden); C[u,v][k,l] edge cost (+inf: forbidden)
    m[v][k]         bytes v holds under k at every point p of its live range P(v)
    B               the budget
The rows (memory):   L_p(x) = sum_{v: p in P(v)} m[v][x_v] <= B      for every point p
Points are the steps where some interval starts (between two starts the live set only
shrinks, so the peak is always at one).

The search is a descent on the cost over plans that keep every row (a move that would
break one is not taken): v takes the k minimizing c[v][k] + sum_w C[v,w][k, x_w].
Everything starts from a plan that fits: every node at its smallest allowed usage,
settled by a descent. (Lagrangian prices on the rows, set from the moves the budget
blocked, were tried and scored worse than `rhino.search.iopddl.window`'s exact windows.)
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from rhino.hlo.errors import InfeasibleError
from rhino.search.problem import ShardingProblem

EPS = 1e-9
"""Relative improvement below which a move is not taken."""
DECAY = 0.5
"""Prices are multiplied by this each round."""
CHECK_EVERY = 512
"""Moves between two looks at the clock."""


@dataclass
class Graph:
    """A problem laid out for the local search: nodes' costs with the edges to nodes that
    have one strategy folded in, the other edges in both orientations per node."""

    cost: list[np.ndarray]
    usage: list[np.ndarray]
    lo: np.ndarray
    """Node v covers points lo[v] <= p < hi[v]."""
    hi: np.ndarray
    points: int
    limit: float
    """Budget per point (bytes; +inf for none), less the constant memory."""
    adj: list[list[tuple[np.ndarray, int]]]
    """Node -> (matrix [k_v, k_w], w) per neighbour w with a choice."""
    edges: list[tuple[int, int, np.ndarray]]
    fixed_edges: list[tuple[int, int, np.ndarray]] = field(default_factory=list)
    """Edges folded into costs (kept for the true cost)."""
    ties: list[bool] = field(default_factory=list)
    """Per edge of `edges`, is it one-to-one (`_one_to_one`: its ends are tied)?"""

    @property
    def size(self) -> int:
        return len(self.cost)


def build(problem: ShardingProblem) -> Graph:
    """The problem as a `Graph` (parallel edges summed; edges that touch a node with one
    strategy folded into the other end's cost)."""
    nodes = problem.nodes
    cost = [n.cost.astype(np.float64).copy() for n in nodes]
    usage = [n.memory.astype(np.float64) for n in nodes]
    first = np.array([n.live[0] if n.live is not None else -1 for n in nodes], dtype=np.int64)
    last = np.array([n.live[1] if n.live is not None else 2**62 for n in nodes], dtype=np.int64)
    spans = first <= last
    starts = np.unique(first[spans])
    lo = np.searchsorted(starts, first)
    hi = np.searchsorted(starts, last, "right")
    lo[~spans] = hi[~spans] = 0
    merged: dict[tuple[int, int], np.ndarray] = {}
    for e in problem.edges:
        key, m = ((e.u, e.v), e.cost) if e.u < e.v else ((e.v, e.u), e.cost.T)
        merged[key] = merged[key] + m if key in merged else m.astype(np.float64)
    adj: list[list[tuple[np.ndarray, int]]] = [[] for _ in nodes]
    edges, fixed = [], []
    for (u, v), m in merged.items():
        if len(cost[u]) == 1 or len(cost[v]) == 1:
            if len(cost[u]) == 1:
                cost[v] = cost[v] + m[0, :]
            else:
                cost[u] = cost[u] + m[:, 0]
            fixed.append((u, v, m))
            continue
        edges.append((u, v, m))
        adj[u].append((m, v))
        adj[v].append((np.ascontiguousarray(m.T), u))
    _forbid_unmatched(cost, adj)
    budget = math.inf if problem.budget is None else float(problem.budget)
    limit = budget * (1 + 1e-12) - problem.constant_memory
    ties = [_one_to_one(m) for _, _, m in edges]
    return Graph(cost, usage, lo, hi, len(starts), limit, adj, edges, fixed, ties)


def _forbid_unmatched(cost: list[np.ndarray], adj: list[list[tuple[np.ndarray, int]]]) -> None:
    """Forbid (cost +inf, in place) every strategy that is forbidden against each allowed
    strategy of some neighbour, until none is left; InfeasibleError when a node has no
    strategy left."""
    queue = deque(range(len(cost)))
    queued = np.ones(len(cost), dtype=bool)
    while queue:
        v = queue.popleft()
        queued[v] = False
        allowed = np.isfinite(cost[v])
        for m, w in adj[v]:
            allowed &= np.isfinite(m[:, np.isfinite(cost[w])]).any(axis=1)
        if not allowed.any():
            raise InfeasibleError(
                f"node {v}: every strategy is forbidden (alone or against a neighbour)"
            )
        if allowed.all() or np.isfinite(cost[v]).sum() == allowed.sum():
            continue
        cost[v] = np.where(allowed, cost[v], np.inf)
        for _, w in adj[v]:
            if not queued[w]:
                queued[w] = True
                queue.append(w)


def true_cost(g: Graph, x: np.ndarray) -> float:
    total = sum(float(c[k]) for c, k in zip(g.cost, x.tolist(), strict=True))
    return total + sum(float(m[x[u], x[v]]) for u, v, m in g.edges)


def levels(g: Graph, x: np.ndarray) -> np.ndarray:
    """Usage at every point under x."""
    held = np.array([g.usage[v][k] for v, k in enumerate(x.tolist())])
    delta = np.zeros(g.points + 1)
    np.add.at(delta, g.lo, held)
    np.add.at(delta, g.hi, -held)
    return np.cumsum(delta)[: g.points]


def lower_bound(g: Graph) -> float:
    """A valid lower bound: each edge counted with one end (the lower-numbered), which
    takes its cheapest strategy given the edge's best partner."""
    total = 0.0
    extra = [np.zeros(len(c)) for c in g.cost]
    for u, _, m in g.edges:
        extra[u] += m.min(axis=1)
    for c, e in zip(g.cost, extra, strict=True):
        total += float((c + e).min())
    return total


def fitting_start(g: Graph) -> np.ndarray:
    """`smallest_start`, checked against the budget: InfeasibleError (with the numbers)
    when even it does not fit, so no plan does."""
    x = smallest_start(g)
    level = levels(g, x)
    if len(level) and level.max() > g.limit:
        raise InfeasibleError(
            f"no plan fits the usage limit: with every node at its smallest usage the "
            f"peak is {level.max():.0f} > {g.limit:.0f} (at point {int(np.argmax(level))})"
        )
    return x


def tied(g: Graph) -> list[list[int]]:
    """Node -> the nodes it is tied to (itself included): the component of the edges
    that allow one strategy per row and per column (a one-to-one map: the two ends must
    move together, so a window takes all of them or none)."""
    root = list(range(g.size))

    def find(a: int) -> int:
        while root[a] != a:
            root[a] = root[root[a]]
            a = root[a]
        return a

    for (u, v, _), tie in zip(g.edges, g.ties, strict=True):
        if tie:
            root[find(u)] = find(v)
    groups: dict[int, list[int]] = {}
    for v in range(g.size):
        groups.setdefault(find(v), []).append(v)
    return [groups[find(v)] for v in range(g.size)]


def _one_to_one(m: np.ndarray) -> bool:
    finite = np.isfinite(m)
    return m.shape[0] == m.shape[1] and bool(
        (finite.sum(axis=0) == 1).all() and (finite.sum(axis=1) == 1).all()
    )


def follow_ties(g: Graph, x: np.ndarray) -> np.ndarray:
    """x with every node tied to another (see `tied`) set by its tie from the first node
    of its group, breadth first: a plan that keeps the one-to-one edges where it can."""
    x = x.copy()
    links: list[list[tuple[np.ndarray, int]]] = [[] for _ in range(g.size)]
    for (u, v, m), tie in zip(g.edges, g.ties, strict=True):
        if tie:
            links[u].append((np.argmax(np.isfinite(m), axis=1), v))  # u's k -> v's l
            links[v].append((np.argmax(np.isfinite(m), axis=0), u))
    done = np.zeros(g.size, dtype=bool)
    for r in range(g.size):
        if done[r] or not links[r]:
            continue
        done[r] = True
        queue = deque([r])
        while queue:
            a = queue.popleft()
            for to, b in links[a]:
                if not done[b]:
                    done[b] = True
                    x[b] = to[x[a]]
                    queue.append(b)
    return x


def legal_start(g: Graph) -> np.ndarray:
    """`fitting_start`, then, if it takes a forbidden pair, the ties followed
    (`follow_ties`) if that fits, then single moves that minimize
    usage among plans without one (edges cost 0, or +inf where forbidden; node cost is
    usage), so the search starts from a plan, not from a forbidden choice."""
    x = fitting_start(g)
    forbidden = any(not np.isfinite(m[x[u], x[v]]) for u, v, m in g.edges)
    if not forbidden:
        return x
    followed = follow_ties(g, x)
    if levels(g, followed).max(initial=0.0) <= g.limit:
        x = followed
        if all(np.isfinite(m[x[u], x[v]]) for u, v, m in g.edges):
            return x
    zero_one = Graph(
        [np.where(np.isfinite(c), m, np.inf) for c, m in zip(g.cost, g.usage, strict=True)],
        g.usage,
        g.lo,
        g.hi,
        g.points,
        g.limit,
        [[(np.where(np.isfinite(m), 0.0, np.inf), w) for m, w in row] for row in g.adj],
        [(u, v, np.where(np.isfinite(m), 0.0, np.inf)) for u, v, m in g.edges],
        [],
        g.ties,
    )
    s = Search(zero_one, x, deadline=math.inf)
    s.hard = False
    s.descend()
    level = levels(g, s.x)
    return s.x if level.max(initial=0.0) <= g.limit else x


def smallest_start(g: Graph) -> np.ndarray:
    """Every node at its smallest usage among allowed strategies (the first of those:
    nodes that an edge forces to take the same strategy, a tensor and its copy, have
    the same usages and so take the same one)."""
    x = np.zeros(g.size, dtype=np.int64)
    for v, (c, m) in enumerate(zip(g.cost, g.usage, strict=True)):
        allowed = np.isfinite(c)
        if not allowed.any():
            raise InfeasibleError(f"node {v}: every strategy is forbidden")
        low = m[allowed].min()
        x[v] = int(np.flatnonzero(allowed & (m == low))[0])
    return x


class Search:
    """The state of the local search: a plan that fits and its levels."""

    def __init__(self, g: Graph, x: np.ndarray, deadline: float) -> None:
        self.g = g
        self.x = x.copy()
        self.level = levels(g, x)
        self.deadline = deadline
        self.moves = 0
        self.hard = True
        """Do moves keep the budget? (False: memory is not looked at, for `legal_start`.)"""

    def out_of_time(self) -> bool:
        return time.perf_counter() >= self.deadline

    def local(self, v: int, skip: int = -1) -> np.ndarray:
        """Cost of each strategy of v given its neighbours (edge to `skip` left out)."""
        g, x = self.g, self.x
        total = g.cost[v]
        for m, w in g.adj[v]:
            if w != skip:
                total = total + m[:, x[w]]
        return total

    def room(self, v: int) -> float:
        lo, hi = self.g.lo[v], self.g.hi[v]
        return self.g.limit - float(self.level[lo:hi].max()) if hi > lo else math.inf

    def apply(self, v: int, k: int) -> None:
        g = self.g
        grow = g.usage[v][k] - g.usage[v][self.x[v]]
        if grow:
            self.level[g.lo[v] : g.hi[v]] += grow
        self.x[v] = k
        self.moves += 1

    def single(self, v: int) -> bool:
        """v's best strategy that fits; True when it moved."""
        total = self.local(v)
        cur = int(self.x[v])
        better = total < _threshold(float(total[cur]))
        if not better.any():
            return False
        grow = self.g.usage[v] - self.g.usage[v][cur]
        if self.hard and (grow[better] > 0).any():
            better = better & (grow <= self.room(v))
            if not better.any():
                return False
        k = int(np.argmin(np.where(better, total, np.inf)))
        self.apply(v, k)
        return True

    def descend(self, order: np.ndarray | None = None) -> None:
        """Single moves until none improves (or the deadline): a queue of nodes, a node
        queued again when a neighbour moves."""
        g = self.g
        movable = [v for v in range(g.size) if len(g.cost[v]) > 1]
        queue = deque(movable if order is None else order.tolist())
        queued = np.zeros(g.size, dtype=bool)
        queued[list(queue)] = True
        steps = 0
        while queue:
            v = queue.popleft()
            queued[v] = False
            steps += 1
            if steps % CHECK_EVERY == 0 and self.out_of_time():
                return
            if self.single(v):
                for _, w in g.adj[v]:
                    if not queued[w]:
                        queued[w] = True
                        queue.append(w)


def _threshold(current: float) -> float:
    """What a move must get below to count as better than `current` (any finite value
    beats a forbidden one)."""
    return current - EPS * (abs(current) + 1.0) if math.isfinite(current) else math.inf
