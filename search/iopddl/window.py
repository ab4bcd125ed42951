"""Large neighbourhood search: the exact solver (`solve_ilp`: reductions, LP, CP-SAT) on
windows of a few hundred nodes, everything outside held at the current plan.

Data (for a window W of nodes, the plan x outside it)
    c'[v][k]   = c[v][k] + sum_{w not in W} C[v,w][k, x_w]              for v in W
    O_p        = L_p(x) - sum_{v in W live at p} m[v][x_v]            usage outside W
Model
    the problem on W with edges inside W, and for every point p some node of W is live at:
    (memory)   sum_{v in W live at p} m[v][k_v] + O_p <= B
Points where the same nodes of W are live form one group; its row is the one with the
largest O_p. The group's O_p is a node with one strategy, live at one point of the
group, so the window is an ordinary `ShardingProblem` under the budget B. The current
plan of W fits and `solve_ilp` starts from it; a window's answer that costs more (a
solve stopped by its time limit may return its fallback) is not taken.
Windows grow breadth-first from a random seed node over the edges.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from rhino.hlo.errors import InfeasibleError
from rhino.search.iopddl.local import Graph, Search, tied, true_cost
from rhino.search.problem import (
    ProblemEdge,
    ProblemNode,
    ShardingProblem,
    SolveOptions,
    SolveStatus,
)
from rhino.search.spmd.solver import solve_ilp

WINDOW_NODES = 300
"""Nodes in a window."""
WINDOW_TIME_S = 2.0
"""Time limit of one window's solve."""
MIN_WINDOW_S = 0.1
"""A window's solve gets at least this long, even past the deadline."""
FIRST_WINDOW_S = 0.5
"""What a window is taken to last before one has been timed (a first window started
just before the deadline would otherwise end well past it)."""
WINDOW_MAX_STRATEGIES = 128
"""Nodes with more strategies stay out of windows (their edges' pair variables would
make one window's LP as large as a whole problem); single moves still change them."""


@dataclass(frozen=True)
class LnsResult:
    choice: np.ndarray
    cost: float
    windows: int
    improved: int
    history: list[tuple[float, float]]


def grow(
    g: Graph, seed: int, size: int, rng: np.random.Generator, ties: list[list[int]] | None = None
) -> list[int]:
    """About `size` nodes, breadth first from `seed` (neighbours in random order), each
    with the nodes tied to it (`tied`); a node whose ties alone pass `size` is left out."""
    seen = {seed}
    queue = deque([seed])
    out: list[int] = []
    taken: set[int] = set()
    while queue and len(out) < size:
        v = queue.popleft()
        group = ties[v] if ties is not None else [v]
        if v in taken or len(group) > size:
            continue
        out += group
        taken.update(group)
        seen.update(group)
        nbrs = [w for u in group for _, w in g.adj[u] if w not in seen]
        rng.shuffle(nbrs)
        for w in nbrs:
            seen.add(w)
            queue.append(w)
    return out


def _seed(g: Graph, s: Search, rng: np.random.Generator, movable: np.ndarray) -> int:
    """A window's first node: half the time an end of an edge drawn by its current cost
    (where a plan is dear, a window is likely to help), else any node; an end of a
    forbidden pair while the plan has one."""
    if g.edges:
        paid = np.array([m[s.x[u], s.x[v]] for u, v, m in g.edges])
        forbidden = np.flatnonzero(~np.isfinite(paid))
        if len(forbidden):  # a forbidden pair first: the plan is no plan until it goes
            u, v, _ = g.edges[int(rng.choice(forbidden))]
            return int(u if rng.random() < 0.5 else v)
    if rng.random() < 0.5 and g.edges:
        if paid.sum() > 0:
            u, v, _ = g.edges[int(rng.choice(len(paid), p=paid / paid.sum()))]
            return int(u if rng.random() < 0.5 else v)
    return int(rng.choice(movable))


def mixed(
    g: Graph, s: Search, seed: int, size: int, rng: np.random.Generator, movable: np.ndarray
) -> list[int]:
    """Half the window breadth first from `seed`, half nodes live at the fullest point
    of the seed's live range (they are who can trade memory with it)."""
    nodes = [v for v in grow(g, seed, size // 2, rng) if len(g.cost[v]) > 1]
    lo, hi = int(g.lo[seed]), int(g.hi[seed])
    if hi > lo:
        p = lo + int(np.argmax(s.level[lo:hi]))
        live = movable[(g.lo[movable] <= p) & (g.hi[movable] > p)]
        taken = set(nodes)
        live = np.array([v for v in live.tolist() if v not in taken], dtype=np.int64)
        if len(live):
            pick = rng.choice(live, size=min(len(live), size - len(nodes)), replace=False)
            nodes += pick.tolist()
    return nodes


def window_problem(g: Graph, s: Search, nodes: list[int]) -> ShardingProblem:
    """The window's problem of the module doc (its nodes first, in `nodes` order, then
    one node per group of points for the usage outside)."""
    x, inside = s.x, {v: i for i, v in enumerate(nodes)}
    problem_nodes, edges = [], []
    for i, v in enumerate(nodes):
        cost = g.cost[v].copy()
        for m, w in g.adj[v]:
            if w not in inside:
                cost += m[:, x[w]]
            elif inside[w] > i:
                edges.append(ProblemEdge(i, inside[w], m))
        live = (int(g.lo[v]), int(g.hi[v]) - 1)
        problem_nodes.append(
            ProblemNode(str(v), tuple(map(str, range(len(cost)))), cost, g.usage[v], live)
        )
    lo = np.array([g.lo[v] for v in nodes])
    hi = np.array([g.hi[v] for v in nodes])
    held = np.array([g.usage[v][x[v]] for v in nodes])
    cuts = np.unique(np.concatenate([lo, hi]))
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        members = (lo <= a) & (hi > a)
        if not members.any():
            continue
        outside = s.level[a:b] - held[members].sum()
        p = a + int(np.argmax(outside))
        problem_nodes.append(
            ProblemNode(
                f"outside@{p}",
                ("held",),
                np.zeros(1),
                np.array([max(0.0, float(outside.max()))]),
                (p, p),
            )
        )
    return ShardingProblem(tuple(problem_nodes), tuple(edges), g.limit)


def lns(
    g: Graph,
    start: np.ndarray,
    deadline: float,
    seed: int = 0,
    threads: int = 1,
    size: int = WINDOW_NODES,
    most: int | None = None,
) -> LnsResult:
    """Windows until `deadline` (or `most` of them), from `start` (a plan that fits);
    the best plan."""
    begin = time.perf_counter()
    rng = np.random.default_rng(seed)
    s = Search(g, start, deadline)
    cost = true_cost(g, s.x)
    history = [(0.0, cost)]
    movable = np.flatnonzero([1 < len(c) <= WINDOW_MAX_STRATEGIES for c in g.cost])
    windows = improved = 0
    ties = tied(g)
    # the longest window so far: none is started that would end past the deadline
    longest = FIRST_WINDOW_S
    while deadline - time.perf_counter() > longest and len(movable) and windows != most:
        opened = time.perf_counter()
        nodes = grow(g, _seed(g, s, rng, movable), size, rng, ties)
        nodes = [v for v in nodes if 1 < len(g.cost[v]) <= WINDOW_MAX_STRATEGIES]
        windows += 1
        problem = window_problem(g, s, nodes)
        before = tuple(int(s.x[v]) for v in nodes) + (0,) * (len(problem.nodes) - len(nodes))
        left = deadline - time.perf_counter()
        options = SolveOptions(
            time_limit_s=max(MIN_WINDOW_S, min(WINDOW_TIME_S, left)), threads=threads, seed=windows
        )
        try:
            solved = solve_ilp(problem, options, start=before)
        except InfeasibleError:
            continue
        finally:
            longest = max(longest, time.perf_counter() - opened)
        for i, v in enumerate(nodes):
            if solved.choice[i] != s.x[v]:
                s.apply(v, int(solved.choice[i]))
        new = true_cost(g, s.x)
        if new > cost:  # a solve stopped by its time limit may hand back a worse plan
            for i, v in enumerate(nodes):
                s.apply(v, before[i])
            continue
        if new < cost - 1e-9 * abs(cost):
            improved += 1
            history.append((time.perf_counter() - begin, new))
        cost = new
        if len(nodes) == len(movable) and solved.status == SolveStatus.OPTIMAL:
            break  # the window was the whole problem: its plan is optimal
    return LnsResult(s.x.copy(), cost, windows, improved, history)
