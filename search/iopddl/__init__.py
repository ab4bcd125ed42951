"""The IOPDDL problem format (google/iopddl, the ASPLOS 2025 contest): read it, turn it
into a `ShardingProblem`, and check an answer against the format's own rules.

A file is `{"problem": {"name", "nodes": {"intervals", "costs", "usages"}, "edges":
{"nodes", "costs"}, "usage_limit"}}` (optionally gzipped). Node v has strategies
0..len(costs[v])-1; it holds usages[v][k] while live, at the times t with s <= t < e for
intervals[v] = [s, e). An edge (u, v) costs costs[i][k * len(S_v) + l] when u takes k and
v takes l; edges may repeat and point either way. A cost of 1e18 (or more) means
forbidden. The answer is one strategy per node, written as `[s0, s1, ...]`.

`check` recomputes cost and peak usage from the file's own numbers, in exact integers,
with nothing shared with the solvers: it is the independent judge of every answer.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import multiprocessing
import multiprocessing.context
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rhino.hlo.errors import InfeasibleError, RhinoError
from rhino.search.iopddl import groups, lagrange, local, window
from rhino.search.problem import (
    ProblemEdge,
    ProblemNode,
    ShardingProblem,
    SolveOptions,
    SolveStatus,
)
from rhino.search.spmd.solver import solve_ilp

FORBIDDEN = 10**18
"""A cost of this much or more forbids the strategy (or pair of strategies)."""


class IopddlFormatError(RhinoError):
    """A file that is not a valid IOPDDL problem."""


@dataclass(frozen=True, eq=False)
class Instance:
    """One IOPDDL problem, as the file gives it."""

    name: str
    intervals: np.ndarray
    """[n, 2] int64: node v is live at s <= t < e."""
    costs: tuple[np.ndarray, ...]
    """Per node, int64 cost per strategy (FORBIDDEN and more: forbidden)."""
    usages: tuple[np.ndarray, ...]
    """Per node, int64 usage per strategy."""
    edges: np.ndarray
    """[m, 2] int64 (u, v) per edge, as given (repeats and both directions allowed)."""
    edge_costs: tuple[np.ndarray, ...]
    """Per edge, the flat int64 cost list, index k * len(S_v) + l."""
    limit: int
    """The usage limit (inclusive)."""

    @property
    def size(self) -> tuple[int, int]:
        return len(self.costs), len(self.edge_costs)


@dataclass(frozen=True)
class Check:
    """An answer judged by the format's rules."""

    cost: int
    """Sum of the chosen node and edge costs (exact)."""
    peak: int
    """Highest total usage at any time."""
    feasible: bool
    reason: str = ""
    """Why it is not feasible ("" when it is)."""


def load(path: str | Path) -> Instance:
    """Read an IOPDDL file (.json or .json.gz); IopddlFormatError when it is not one."""
    path = Path(path)
    try:
        opener: Any = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            doc = json.load(f)
    except FileNotFoundError as e:
        raise IopddlFormatError(f"{path}: no such file") from e
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise IopddlFormatError(f"{path}: not readable as JSON: {e}") from e
    return parse(doc, str(path))


def parse(doc: Any, where: str = "<problem>") -> Instance:
    """An Instance from the parsed JSON document; IopddlFormatError naming what is wrong."""

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise IopddlFormatError(f"{where}: {what}")

    need(
        isinstance(doc, dict) and isinstance(doc.get("problem"), dict),
        'expected an object with a "problem" object',
    )
    p = doc["problem"]
    for key in ("nodes", "edges", "usage_limit"):
        need(key in p, f'problem has no "{key}"')
    nodes, edges = p["nodes"], p["edges"]
    need(isinstance(nodes, dict) and isinstance(edges, dict), '"nodes" and "edges" must be objects')
    for key in ("intervals", "costs", "usages"):
        need(isinstance(nodes.get(key), list), f'nodes has no list "{key}"')
    n = len(nodes["costs"])
    need(
        len(nodes["intervals"]) == n and len(nodes["usages"]) == n,
        f"nodes: {len(nodes['intervals'])} intervals, {n} cost lists, "
        f"{len(nodes['usages'])} usage lists (expected equal)",
    )
    try:
        intervals = np.array(nodes["intervals"], dtype=np.int64).reshape(n, 2)
        costs = tuple(np.array(c, dtype=np.float64) for c in nodes["costs"])
        usages = tuple(np.array(u, dtype=np.int64) for u in nodes["usages"])
        pairs = np.array(edges.get("nodes", []), dtype=np.int64).reshape(-1, 2)
        edge_costs = tuple(np.array(c, dtype=np.float64) for c in edges.get("costs", []))
        limit = int(p["usage_limit"])
    except (TypeError, ValueError, OverflowError) as e:
        raise IopddlFormatError(
            f"{where}: a value is not a number of the expected shape: {e}"
        ) from e
    backwards = np.flatnonzero(intervals[:, 0] > intervals[:, 1])
    if len(backwards):
        v = int(backwards[0])
        need(
            False,
            f"node {v}: interval [{intervals[v, 0]}, {intervals[v, 1]}] ends before it "
            "starts (an interval is [start, end) with start <= end)",
        )
    for v in range(n):
        need(costs[v].ndim == 1 and len(costs[v]) > 0, f"node {v}: no strategies")
        need(
            usages[v].shape == costs[v].shape,
            f"node {v}: {len(costs[v])} costs but {usages[v].size} usages",
        )
    need(
        len(edge_costs) == len(pairs),
        f"edges: {len(pairs)} node pairs, {len(edge_costs)} cost lists",
    )
    need(bool(((pairs >= 0) & (pairs < n)).all()), f"edges: a node index outside 0..{n - 1}")
    for i, (u, v) in enumerate(pairs.tolist()):
        expected = len(costs[u]) * len(costs[v])
        need(
            edge_costs[i].shape == (expected,),
            f"edge {i} ({u}, {v}): {edge_costs[i].size} costs, "
            f"expected {len(costs[u])} x {len(costs[v])} = {expected}",
        )
    for array in (*costs, *edge_costs):
        need(bool((array >= 0).all()), "a negative cost")
    return Instance(
        str(p.get("name", where)), intervals, _ints(costs), usages, pairs, _ints(edge_costs), limit
    )


def _ints(arrays: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Costs as int64, anything at or above FORBIDDEN as FORBIDDEN."""
    return tuple(np.minimum(a, FORBIDDEN).astype(np.int64) for a in arrays)


def to_problem(instance: Instance) -> ShardingProblem:
    """The instance as a `ShardingProblem`: forbidden costs are +inf (the solvers' hard
    constraint), live [s, e) becomes the inclusive steps (s, e - 1), the budget is the
    limit. Costs stay in the file's units."""
    nodes = tuple(
        ProblemNode(
            str(v),
            tuple(map(str, range(len(c)))),
            _forbid(c),
            u.astype(np.float64),
            (int(s), int(e) - 1),
        )
        for v, (c, u, (s, e)) in enumerate(
            zip(instance.costs, instance.usages, instance.intervals.tolist(), strict=True)
        )
    )
    edges = tuple(
        ProblemEdge(
            int(u), int(v), _forbid(c).reshape(len(instance.costs[u]), len(instance.costs[v]))
        )
        for (u, v), c in zip(instance.edges.tolist(), instance.edge_costs, strict=True)
    )
    return ShardingProblem(nodes, edges, float(instance.limit))


def _forbid(costs: np.ndarray) -> np.ndarray:
    out = costs.astype(np.float64)
    out[costs >= FORBIDDEN] = np.inf
    return out


def check(instance: Instance, choice: list[int] | tuple[int, ...]) -> Check:
    """Judge `choice` by the format's rules, in exact integers: its cost, its peak usage,
    and whether it is feasible (every strategy in range, nothing forbidden, usage within
    the limit at every time)."""
    n = len(instance.costs)
    if len(choice) != n:
        return Check(0, 0, False, f"{len(choice)} strategies for {n} nodes")
    terms = []
    for v, k in enumerate(choice):
        if not 0 <= k < len(instance.costs[v]):
            return Check(0, 0, False, f"node {v}: strategy {k} of {len(instance.costs[v])}")
        terms.append(int(instance.costs[v][k]))
    for (u, v), c in zip(instance.edges.tolist(), instance.edge_costs, strict=True):
        terms.append(int(c[choice[u] * len(instance.costs[v]) + choice[v]]))
    total = sum(terms)
    used = np.array([int(instance.usages[v][k]) for v, k in enumerate(choice)], dtype=np.int64)
    start, end = instance.intervals[:, 0], instance.intervals[:, 1]
    live = end > start
    times = int(end.max(initial=0)) + 1
    delta = np.zeros(times + 1, dtype=np.int64)
    np.add.at(delta, start[live], used[live])
    np.add.at(delta, end[live], -used[live])
    level = np.cumsum(delta)
    peak = int(level.max(initial=0))
    if max(terms, default=0) >= FORBIDDEN:
        return Check(total, peak, False, "a forbidden strategy or pair (cost 1e18)")
    if peak > instance.limit:
        t = int(np.argmax(level))
        return Check(total, peak, False, f"usage {peak} > limit {instance.limit} at time {t}")
    return Check(total, peak, True)


def answer_line(choice: list[int] | tuple[int, ...]) -> str:
    """The contest's answer: `[s0, s1, ...]`."""
    return "[" + ", ".join(str(int(k)) for k in choice) + "]"


GROUP_SHARE = 0.25
"""The group search's share of the time after the model is built (small or large)."""
PASSING_SHARE = 0.5
"""The Lagrangian rounds with message passing: their share of the time after the group
search (they stop early when they stop finding)."""
ROUNDS_SHARE = {"small": 0.5, "large": 1.0}
"""The Lagrangian rounds' (`rhino.search.iopddl.lagrange`) share of the time after the rounds with
message passing; on a large problem a group search from their plan has what they leave (they
stop early when the limit does not bind), as a large problem's windows on single nodes
find little and a late one can end well past the deadline."""
ILP_SHARE = 0.6
"""On a small problem, the whole-problem solve's share of the time after the group
search."""


@dataclass(frozen=True)
class Solved:
    """An answer to an instance, judged by `check`."""

    choice: tuple[int, ...]
    check: Check
    bound: float
    """A proven lower bound on the cost of any feasible plan."""
    phases: dict[str, float]
    """Seconds per phase (model, start, groups, rounds, ilp, windows, check)."""
    windows: int = 0
    """Windows solved by the large neighbourhood search."""
    helped: bool = False
    """The plan is (or was searched from) the toulbar2 helper's (`_Helper`)."""


def _search_groups(
    merged: groups.Groups,
    y: np.ndarray,
    options: SolveOptions,
    kind: str,
    lap: Callable[[str], None],
) -> tuple[np.ndarray, bool, float]:
    """The group search from y (GROUP_SHARE of the time left), the Lagrangian rounds
    with message passing from its plan (PASSING_SHARE; where message passing gains
    nothing, the group search goes on for that time instead: IOPDDL N, no tied nodes,
    scored 0.878 with half the time in the group search and 0.80 with a quarter), the
    rounds with the group search alone (ROUNDS_SHARE), then on a large problem the group
    search again until the deadline, from the cheaper of their plan and the helper's
    (`_Helper`: on a large problem with two threads or more, the rounds with toulbar2 run
    beside all this from y). The cheapest group plan that fits, whether it is the
    helper's, and the helper's lower bound (-inf: none)."""
    helper = None
    if (
        kind == "large"
        and options.threads > 1
        and "fork" in multiprocessing.get_all_start_methods()
    ):
        helper = _Helper(merged, y, options)
    try:
        search = groups.GroupSearch(
            merged, y, time.perf_counter() + options.left() * GROUP_SHARE, seed=options.seed
        )
        search.run()
        lap("groups")
        passing_deadline = time.perf_counter() + options.left() * PASSING_SHARE
        best = lagrange.rounds(
            merged, search.y, passing_deadline, seed=options.seed, relax="passing"
        )
        y = best.y
        if best.rounds == 0:  # message passing gained nothing: its time goes to the group search
            more = groups.GroupSearch(merged, y, passing_deadline, seed=options.seed + 2)
            more.run()
            y = more.y
        best = lagrange.rounds(
            merged, y, time.perf_counter() + options.left() * ROUNDS_SHARE[kind], seed=options.seed
        )
        lap("rounds")
        if kind == "small":
            return best.y, False, -math.inf
        y, cost, helped = best.y, best.cost, False
        if helper is not None and helper.take() < cost:
            y, cost, helped = helper.y, helper.cost, True
        if options.left() > lagrange.MIN_ROUND_S:
            again = groups.GroupSearch(merged, y, options.deadline or 0.0, seed=options.seed + 1)
            again.run()
            lap("groups")
            if again.cost < cost:
                y, cost = again.y, again.cost
        if helper is None:
            return y, helped, -math.inf
        helper.finish()
        if helper.take() < cost:
            y, helped = helper.y, True
        return y, helped, helper.bound
    finally:
        if helper is not None:
            helper.finish()


HELPER_MARGIN_S = 0.5
"""The helper ends this long before the deadline (its plans have to reach the search)."""
HELPER_JOIN_S = 1.0
"""How long the search waits for the helper to end before it stops it."""


class _Helper:
    """The Lagrangian rounds with toulbar2 (`lagrange.rounds(relax="wcsp")`) from y, in a
    process of their own on a second core until the deadline; each cheaper plan that fits
    is put in a slot of shared memory as it is found (never blocking the rounds), where
    the search takes it. The process is forked, so the groups are not copied up front;
    its standard output (toulbar2 writes there) goes nowhere.

    Where the plans without the limit hold many times it, these rounds alone find
    cheaper plans than the rounds with the group search; where a solve takes long, few
    rounds fit and they alone do worse (`scripts/bench_iopddl.py`), so they run beside
    the search, not in its place."""

    def __init__(self, merged: groups.Groups, y: np.ndarray, options: SolveOptions) -> None:
        self.merged = merged
        self.y = y.copy()
        self.cost = math.inf
        self.bound = -math.inf
        """The best lower bound the helper found (its Lagrangian rounds' `Best.bound`)."""
        context = multiprocessing.get_context("fork")
        self.slot = _Slot(context, merged.size)
        self.seen = 0
        deadline = (options.deadline or time.perf_counter()) - HELPER_MARGIN_S
        self.process = context.Process(
            target=_help, args=(merged, y, deadline, options.seed + 7, self.slot), daemon=True
        )
        self.process.start()

    def take(self) -> float:
        """The cost of the cheapest plan the helper found so far (`self.y`), checked
        against the groups; inf when none."""
        version, y, self.bound = self.slot.get()
        if version != self.seen:
            self.seen = version
            cost = self.merged.total(y)
            if cost < self.cost and self.merged.fits(y):
                self.y, self.cost = y, cost
        return self.cost

    def finish(self) -> None:
        """Wait for the process to end (HELPER_JOIN_S at most), then stop it."""
        if self.process.exitcode is not None:
            return
        self.process.join(HELPER_JOIN_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class _Slot:
    """A group plan in shared memory, with a count of the plans put there."""

    def __init__(self, context: multiprocessing.context.BaseContext, size: int) -> None:
        self.plan = context.Array("q", max(size, 1))  # int64, with a lock
        self.size = size
        self.version = context.RawValue("q", 0)
        self.bound = context.RawValue("d", -math.inf)

    def put(self, y: np.ndarray, bound: float) -> None:
        with self.plan.get_lock():
            self._view()[: self.size] = y
            self.version.value += 1
            self.bound.value = bound

    def _view(self) -> np.ndarray:
        return np.ctypeslib.as_array(self.plan.get_obj())

    def get(self) -> tuple[int, np.ndarray, float]:
        """(puts so far, the last plan put, the last bound put)."""
        with self.plan.get_lock():
            plan = self._view()[: self.size].copy()
            return self.version.value, plan, self.bound.value


def _help(merged: groups.Groups, y: np.ndarray, deadline: float, seed: int, slot: _Slot) -> None:
    """The helper process: rounds with toulbar2, each cheaper plan put in the slot."""
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    lagrange.rounds(merged, y, deadline, seed=seed, relax="wcsp", report=slot.put)


def solve(instance: Instance, options: SolveOptions) -> Solved:
    """The cheapest feasible plan found within the options' time limit (every phase
    counted): a plan that fits (`local.legal_start`), the group search of
    `rhino.search.iopddl.groups` from it (tied nodes moved together: single and pair moves,
    then kicks) and the Lagrangian rounds of `rhino.search.iopddl.lagrange` (`_search_groups`),
    then on a small problem the exact solver from there, then (unless it proved its
    plan optimal) windows until the deadline.
    InfeasibleError when no plan fits the limit."""
    options = options.started()
    phases: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - clock
        clock = now

    problem = to_problem(instance)
    g = local.build(problem)
    merged = groups.merge(g)
    bound = max(local.lower_bound(g), merged.lower_bound())
    lap("model")
    x = local.legal_start(g)
    lap("start")
    small = g.size <= options.tuning.small_nodes
    y = merged.contract(x)
    helped = False
    if y is not None:
        y, helped, helper_bound = _search_groups(
            merged, y, options, "small" if small else "large", lap
        )
        bound = max(bound, helper_bound)
        x = merged.expand(y)
    else:  # the start breaks a tie: single moves on the nodes
        descent = local.Search(g, x, options.deadline or 0.0)
        descent.descend()
        x = descent.x
        lap("groups")
    proven = False
    if small and options.left() > 0:
        solved = solve_ilp(
            problem,
            dataclasses.replace(options, deadline=time.perf_counter() + options.left() * ILP_SHARE),
            start=tuple(int(k) for k in x),
        )
        bound = max(bound, solved.bound)
        if solved.objective < local.true_cost(g, x):
            x = np.array(solved.choice, dtype=np.int64)
        lap("ilp")
        proven = solved.status == SolveStatus.OPTIMAL
    windows = 0
    if not proven:
        found = window.lns(
            g, x, options.deadline or 0.0, seed=options.seed, threads=options.threads
        )
        x, windows = found.choice, found.windows
        lap("windows")
    choice = tuple(int(k) for k in x)
    judged = check(instance, choice)
    lap("check")
    if judged.feasible is False and judged.peak <= instance.limit and judged.cost >= FORBIDDEN:
        raise InfeasibleError(
            "no plan found that avoids every forbidden strategy and pair within the time limit"
        )
    if not judged.feasible:  # a bug in a solver, never a plan to hand out
        raise AssertionError(f"the solver's plan is infeasible: {judged.reason}")
    return Solved(choice, judged, min(bound, float(judged.cost)), phases, windows, helped)
