"""O2 under a memory budget: the budget's rows relaxed into node costs (Lagrange).

Data
    c[v][k], C[u,v][k,l]   node and edge costs (seconds), as in rhino.search.spmd.solver
    m[v][k]                bytes per device of v's results under k; live[v] = [a_v, b_v]
    B                      the per-device budget
The rows the exact ILP holds (memory): for every program step t,
    sum_{v live at t} m[v][k_v] <= B.
Relaxed with a multiplier lam_t >= 0 per row, they move into the node costs:
    c'[v][k] = c[v][k] + m[v][k] * sum_{t in live[v]} lam_t          (penalty)
and the relaxed problem has no budget, so O2 solves it as it solves any other: exact
reductions, one ILP or segments, refinement. Nothing here builds a memory row, which
is what made O2 under a budget run out of memory on large graphs.

The multipliers: lam_t = lam / |T| on the steps T where some plan so far went over the
budget (the union over the search, so a penalty never vanishes once it was needed),
zero elsewhere; so sum_{t in live[v]} lam_t is lam times the share of those steps that
v is live at. One scalar lam is searched:
    0                         the plan without a budget; if it fits, it is the answer
    lam_0 = objective / peak  then x GROWTH until a plan fits (at most LADDER steps)
    bisection (geometric) between the largest lam that did not fit and the smallest that did
Each relaxed solve starts from the plan before it. The cheapest plan that fits (at the
true costs) is kept, then improved node by node by a local search that never leaves the
budget (`improve_within`). When no relaxed plan fits in time, every node's smallest
layout (it fits: the budget is checked against it first) is where that search starts.

The lower bound reported is the plan without a budget's: any plan within the budget is
a plan without one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from rhino.search.problem import (
    FEASIBILITY,
    BudgetStats,
    ShardingProblem,
    Solution,
    SolveOptions,
    SolveStatus,
    Usage,
)
from rhino.search.spmd.solver import check_budget, fold_single_edges, improve

FREE_SHARE = 0.75
"""Of the time, the plan without a budget may take this much; the search over lam, which
runs only when that plan does not fit, has the rest. The budget a user gives usually
does not bind (the default is the device's memory), and on the largest GPTs half the
time for that plan cost a few percent of the step time against the full time."""
GROWTH = 8.0
"""lam grows by this factor until a plan fits."""
LADDER = 12
"""At most this many growth steps (lam_0 * GROWTH**12 makes a byte dearer than the whole
step time several million times over: past that, the smallest layouts are the answer)."""
BISECTIONS = 4
"""Geometric bisection steps between the lam that does not fit and the one that does."""
STEP_SHARE = 0.5
"""One relaxed solve may take this share of the time left."""
RELAXED_WORK = 1.0
"""And CP-SAT in it at most this much deterministic work: a relaxed plan only steers the
search over lam, and proving it optimal took CP-SAT 22-27 s on the zoo's tiny GPT on 1x8
under a budget (the same final plan at 1 and 2, in a third of the time)."""

Solver = Callable[[ShardingProblem, SolveOptions, "tuple[int, ...] | None"], Solution]


def solve_within_budget(
    problem: ShardingProblem, options: SolveOptions, solve: Solver, first: Solution | None = None
) -> Solution:
    """The cheapest plan within the problem's budget that O2 (`solve`, on problems without
    a budget, from a start) finds by the relaxation of the module doc; `first`, when
    given, is O2's plan of the problem without the budget (not solved again)."""
    if problem.budget is None:
        raise ValueError("solve_within_budget needs a budget")
    check_budget(problem)  # the clear message when nothing can fit
    options = options.started()
    begin = time.perf_counter()
    budget = float(problem.budget)
    free = ShardingProblem(problem.nodes, problem.edges, None, problem.constant_memory)
    if first is None:
        first = solve(free, share_of(options, FREE_SHARE), None)
    if first.peak_memory <= budget * (1 + FEASIBILITY):  # the budget does not bind
        unbound = BudgetStats(free_peak=first.peak_memory, solves=1)
        return _final(problem, first.choice, first, begin, unbound)
    search = _LagrangeSearch(problem, free, options, solve, first)
    found = search.run()
    choice = found if found is not None else smallest(problem)
    choice = improve_within(problem, choice, budget, options)
    met = BudgetStats(
        free_peak=first.peak_memory,
        solves=search.solves,
        lam=search.fitted or 0.0,
        fallback=found is None,
    )
    return _final(problem, choice, first, begin, met)


class _LagrangeSearch:
    """The search over lam (see module doc)."""

    def __init__(
        self,
        problem: ShardingProblem,
        free: ShardingProblem,
        options: SolveOptions,
        solve: Solver,
        first: Solution,
    ) -> None:
        self.problem, self.free, self.options, self.solve = problem, free, options, solve
        self.budget = float(problem.budget or 0.0)
        self.marked = np.zeros(0, dtype=np.int64)
        self.last = first.choice
        self.best: tuple[float, tuple[int, ...]] | None = None
        self.fitted: float | None = None
        """The smallest lam whose plan fit."""
        self.solves = 1
        self.first_step = np.array([n.live[0] for n in free.nodes], dtype=np.int64)
        self.last_step = np.array([n.live[1] for n in free.nodes], dtype=np.int64)
        self._mark(first.choice)
        self.lam0 = first.objective / max(first.peak_memory, 1.0)

    def run(self) -> tuple[int, ...] | None:
        """The cheapest plan that fit, or None."""
        low, lam = 0.0, self.lam0
        for _ in range(LADDER):
            if self.options.left() <= 0:
                return self._best()
            if self._try(lam):
                break
            low, lam = lam, lam * GROWTH
        else:
            return self._best()
        high = lam
        for _ in range(BISECTIONS):
            if self.options.left() <= 0:
                break
            mid = float(np.sqrt(max(low, self.lam0 / GROWTH) * high))
            if self._try(mid):
                high = mid
            else:
                low = mid
        return self._best()

    def _try(self, lam: float) -> bool:
        """Solve the relaxed problem at lam from the last plan; did its plan fit?"""
        relaxed = penalized(self.free, self._shares(), lam)
        options = share_of(self.options, STEP_SHARE).working_at_most(RELAXED_WORK)
        found = self.solve(relaxed, options, self.last)
        self.solves += 1
        self.last = found.choice
        if found.peak_memory > self.budget * (1 + FEASIBILITY):  # the relaxed problem's too
            self._mark(found.choice)
            return False
        cost = self.problem.evaluate(found.choice).objective
        if self.best is None or cost < self.best[0]:
            self.best = (cost, found.choice)
        self.fitted = lam if self.fitted is None else min(self.fitted, lam)
        return True

    def _mark(self, choice: tuple[int, ...]) -> None:
        self.marked = np.union1d(self.marked, Usage(self.free, choice).over(self.budget))

    def _shares(self) -> np.ndarray:
        """Per node, the share of the marked steps it is live at."""
        inside = np.searchsorted(self.marked, self.last_step, "right") - np.searchsorted(
            self.marked, self.first_step
        )
        return inside / max(len(self.marked), 1)

    def _best(self) -> tuple[int, ...] | None:
        return None if self.best is None else self.best[1]


def penalized(problem: ShardingProblem, share: np.ndarray, lam: float) -> ShardingProblem:
    """The problem with c'[v][k] = c[v][k] + lam * share[v] * m[v][k] (no budget)."""
    nodes = tuple(
        dataclasses.replace(n, cost=n.cost + lam * float(s) * n.memory) if s > 0 else n
        for n, s in zip(problem.nodes, share.tolist(), strict=True)
    )
    return ShardingProblem(nodes, problem.edges, None, problem.constant_memory)


def smallest(problem: ShardingProblem) -> tuple[int, ...]:
    """Every node in its smallest layout (the cheapest of equals)."""
    out = []
    for n in problem.nodes:
        low = np.flatnonzero(n.memory == n.memory.min())
        out.append(int(low[np.argmin(n.cost[low])]))
    return tuple(out)


def improve_within(
    problem: ShardingProblem,
    choice: tuple[int, ...],
    budget: float,
    options: SolveOptions,
    sweeps: int = 10,
) -> tuple[int, ...]:
    """`rhino.search.spmd.solver.improve` at the true costs, never leaving the budget: each node
    in turn takes the cheapest strategy given its neighbours' that keeps every step it is
    live at within `budget` (or `sweeps` passes, or the deadline). `choice` must fit."""
    node_cost = [n.cost.astype(float) for n in problem.nodes]
    fold_single_edges(problem, node_cost)  # improve reads the other edges itself
    within = (Usage(problem, choice), budget, options)
    return tuple(improve(problem, node_cost, list(choice), sweeps, within))


def share_of(options: SolveOptions, share: float) -> SolveOptions:
    """The options with `share` of the time left (their deadline moved in)."""
    return dataclasses.replace(options, deadline=time.perf_counter() + options.left() * share)


def _final(
    problem: ShardingProblem,
    choice: tuple[int, ...],
    free: Solution,
    begin: float,
    met: BudgetStats,
) -> Solution:
    """The plan `choice`, with the stats of the plan without the budget (`free`) and how
    the budget was met."""
    evaluation = problem.evaluate(choice)  # raises if it does not fit
    optimal = free.status is SolveStatus.OPTIMAL and choice == free.choice
    return Solution(
        choice=choice,
        objective=evaluation.objective,
        bound=min(free.bound, evaluation.objective),
        status=SolveStatus.OPTIMAL if optimal else SolveStatus.FEASIBLE,
        solve_time_s=time.perf_counter() - begin,
        peak_memory=evaluation.peak_memory,
        variables=free.variables,
        constraints=free.constraints,
        stats=dataclasses.replace(free.stats, budget=met),
    )
