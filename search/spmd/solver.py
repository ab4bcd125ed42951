"""Exact solvers for a `ShardingProblem`: the ILP of Rhino §4.2 on OR-tools CP-SAT, and
brute force for tests.

Data
    c[v][k]        cost of node v under strategy k (seconds)
    C[u,v][k,l]    cost of edge (u, v) when u takes k and v takes l
    m[v][k]        bytes per device of v's results under k; live[v] = [first, last] step
    B              per-device budget (optional)
Variables
    s[v][k] in {0,1}         v takes strategy k
    e[u,v][g,h] in {0,1}     u's layout group g meets v's layout group h on edge (u, v)
Model
    min   sum_v sum_k c[v][k] s[v][k] + sum_(u,v) sum_(g,h) C[u,v][g,h] e[u,v][g,h]
    (one)     sum_k s[v][k] = 1                                         for every v
    (rows)    sum_h e[u,v][g,h] = sum_{k in g} s[u][k]                  for every edge, g
    (cols)    sum_g e[u,v][g,h] = sum_{l in h} s[v][l]                  for every edge, h
    (memory)  sum_{v live at t} sum_k m[v][k] s[v][k] <= B              for every step t

The paper linearizes each product s[u][k] s[v][l] with A >= s_u + s_v - 1; the
row/column form above is exact too and its LP relaxation is much tighter. Strategies of
a node whose rows (columns) of C are equal form one group g (h): a dot with 64
strategies usually reads an operand in at most 16 layouts, so the edge needs 16 x 16
pair variables, not 64 x 64. Edges from or to a node with one strategy fold into the
other node's costs. Costs are scaled to integers (picoseconds, or coarser for huge
totals); the reported objective is always the float `evaluate` of the chosen plan.

Before CP-SAT, the LP relaxation of the same model runs on HiGHS (`rhino.search.spmd.lp`).
Its optimum is usually integral, and then it is an optimal plan, proven by the LP (where
CP-SAT alone may stop at a gap; scripts/bench_search.py measures both). Otherwise the
rounded LP optimum is CP-SAT's starting point, and CP-SAT gets the time that remains.
Where the LP is too large for the simplex (`Tuning.lp_first_order_variables`), CP-SAT,
too large to build (`Tuning.cpsat_max_variables`), is skipped: the start (or the
rounding) is the plan, optimal when the LP's bound meets it. CP-SAT is skipped in the
same way where the LP leaves no time: the time limit is kept, not overrun by building a
model.

`_solve` goes in named steps: `solve_lp`; where the LP is not integral, `_starts` (the
plan to fall back on and CP-SAT's hint); `_cpsat_model`; `_run_cpsat` (the solve and the
read-back).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # CP-SAT is imported where it runs: most plans never need it (0.4 s)
    from ortools.sat.python import cp_model

from rhino.hlo.errors import InfeasibleError
from rhino.search.problem import (
    FEASIBILITY,
    ProblemEdge,
    ProblemNode,
    ShardingProblem,
    Sizes,
    Solution,
    SolveOptions,
    SolveStats,
    SolveStatus,
    Usage,
)
from rhino.search.spmd.lp import (
    MIN_CPSAT_S,
    TIE_BREAK_S_PER_BYTE,
    CoreRows,
    LpNames,
    LpResult,
    WarmStart,
    groups,
    solve_lp,
)
from rhino.search.spmd.reduce import Reduced, memory_rows, reduce_problem
from rhino.search.units import format_bytes

COST_SCALE = 1e12
"""CP-SAT takes integer costs: seconds times this (picoseconds)..."""
COST_SUM_MAX = 1e15
"""...unless their sum would pass this, where the scale shrinks to keep it there."""
MEMORY_COEFFICIENT_MAX = 2**40
"""Memory rows' coefficients are bytes divided down to at most this (int64 room to spare)."""
MIN_GAIN_S = 1e-15
"""A change counts as a gain when it saves more than this many seconds (float noise)."""
PROVEN_GAP = 1e-7
"""A plan within this share of a lower bound counts as proven optimal (the LP solvers'
own tolerance is 1e-7)."""


def solve_ilp(
    problem: ShardingProblem,
    options: SolveOptions | None = None,
    start: tuple[int, ...] | None = None,
    reduced: Reduced | None = None,
    warm: WarmStart | None = None,
) -> Solution:
    """Minimize the problem's cost within its budget; the best plan found by the time
    limit when the search is not finished (status FEASIBLE). `start`, a plan of the
    problem, is where the search starts when it beats the LP's rounding: the answer is
    never worse than it (with a budget: when it fits and the reductions kept its
    strategies; it is then CP-SAT's hint).

    The exact reductions of `rhino.search.spmd.reduce` (leaves folded into their neighbour,
    chain links into an edge, dominated strategies dropped; with a budget, only where
    memory allows) shrink the problem to a core first; the core's optimum, expanded, is
    an optimum of the whole. With a budget, the core keeps only the memory rows that
    can bind (`rhino.search.spmd.reduce.memory_rows`). `reduced`, when the caller has it
    already, is `reduce_problem(tie_broken(problem))`. `warm` carries the LP's basis from
    a solve of the same graph at other costs to this one, and this one's to the next
    (`rhino.search.spmd.lp.WarmStart`).
    """
    options = (options or SolveOptions()).started()
    begin = time.perf_counter()
    if problem.budget is not None:
        check_budget(problem)  # the clear message, before anything else
    if reduced is None:
        reduced = reduce_problem(tie_broken(problem))
    core_ids = sorted(reduced.alive)
    if not core_ids:
        choice = reduced.expand({})
        evaluation = problem.evaluate(choice)
        return Solution(
            choice,
            evaluation.objective,
            evaluation.objective,
            SolveStatus.OPTIMAL,
            time.perf_counter() - begin,
            evaluation.peak_memory,
            0,
            0,
            stats=SolveStats(sizes=Sizes(core_nodes=0)),
        )
    position = {v: i for i, v in enumerate(core_ids)}
    core = core_problem(problem, reduced)
    rows = None
    if problem.budget is not None:
        found = memory_rows(reduced)
        rows = CoreRows(
            {position[v]: t for v, t in found.terms.items()},
            [
                (
                    np.array(
                        sorted(position[v] for v in [*found.always, *members.tolist()]),
                        dtype=np.int64,
                    ),
                    rhs,
                )
                for members, rhs in found.rows
            ],
        )
    core_start = None
    if start is not None:
        on_core = core_choice(reduced, start)
        if on_core is not None:
            core_start = tuple(on_core[v] for v in core_ids)
    names = LpNames(
        np.array(core_ids, dtype=np.int64),
        [reduced.keep[v] for v in core_ids],
        len(problem.nodes),
        max(len(n.labels) for n in problem.nodes),
    )
    solved = _solve(core, options, rows, core_start, names, warm)
    choice = reduced.expand({v: solved.choice[position[v]] for v in core_ids})
    evaluation = problem.evaluate(choice)
    gap_s = solved.objective - solved.bound  # the core's gap is the whole problem's
    return Solution(
        choice=choice,
        objective=evaluation.objective,
        bound=max(0.0, evaluation.objective - gap_s),
        status=solved.status,
        solve_time_s=time.perf_counter() - begin,
        peak_memory=evaluation.peak_memory,
        variables=solved.variables,
        constraints=solved.constraints,
        stats=dataclasses.replace(
            solved.stats,
            sizes=Sizes(
                core_nodes=len(core_ids),
                core_edges=len(core.edges),
                memory_rows=len(rows.rows) if rows is not None else None,
            ),
        ),
    )


def core_problem(problem: ShardingProblem, reduced: Reduced) -> ShardingProblem:
    """The core `reduced` (of `tie_broken(problem)`) left, as a problem of its own: its
    nodes in index order, costs without the tie break (the solvers add it back)."""
    core_ids = sorted(reduced.alive)
    position = {v: i for i, v in enumerate(core_ids)}
    nodes = []
    for v in core_ids:
        node, keep = problem.nodes[v], reduced.keep[v]
        memory = node.memory[keep]
        labels = node.labels
        nodes.append(
            ProblemNode(
                node.name,
                tuple([labels[k] for k in keep.tolist()]),
                reduced.cost[v] - TIE_BREAK_S_PER_BYTE * memory,
                memory,
                node.live,
            )
        )
    return ShardingProblem(
        tuple(nodes),
        tuple(ProblemEdge(position[a], position[b], m) for (a, b), m in reduced.edges.items()),
        None,
    )


def core_choice(
    reduced: Reduced, choice: tuple[int, ...], nearest: bool = False
) -> dict[int, int] | None:
    """A plan of the whole problem as a choice of the core `reduced` left (core node ->
    index among its remaining strategies); None when it uses a strategy the reductions
    dropped, or, with `nearest`, that node's cheapest remaining strategy instead."""
    picks = {}
    for v in reduced.alive:
        found = np.flatnonzero(reduced.keep[v] == choice[v])
        if len(found):
            picks[v] = int(found[0])
        elif nearest:
            picks[v] = int(np.argmin(reduced.cost[v]))
        else:
            return None
    return picks


def tie_broken(
    problem: ShardingProblem, like: tuple[ShardingProblem, ShardingProblem] | None = None
) -> ShardingProblem:
    """The problem where ties go to less memory (see _solve). `like`: a problem of the
    same graph and its tie-broken one, whose nodes are taken where `problem` has the
    same node objects."""
    # nodes alike in kind and weight share their arrays (`rhino.search.spmd.planner`), and
    # then their tie-broken costs: made once, never written to (the problem holds the
    # arrays whose ids key it while it runs)
    broken: dict[tuple[int, int], np.ndarray] = {}
    nodes = []
    for v, n in enumerate(problem.nodes):
        if like is not None and like[0].nodes[v] is n:
            nodes.append(like[1].nodes[v])
            continue
        key = (id(n.cost), id(n.memory))
        cost = broken.get(key)
        if cost is None:
            cost = broken[key] = n.cost + TIE_BREAK_S_PER_BYTE * n.memory
        # the constructor itself: dataclasses.replace costs 3x as much per node
        nodes.append(ProblemNode(n.name, n.labels, cost, n.memory, n.live, n.heavy))
    return ShardingProblem(tuple(nodes), problem.edges, problem.budget, problem.constant_memory)


@dataclass(frozen=True)
class _Starts:
    """Where CP-SAT starts (`_starts`)."""

    fallback: tuple[int, ...] | None
    """The best plan known before CP-SAT (the answer when it finds none better)."""
    hint: tuple[int, ...]
    """CP-SAT's hint: a strategy per node."""


def _solve(
    problem: ShardingProblem,
    options: SolveOptions,
    memory: CoreRows | None = None,
    start_choice: tuple[int, ...] | None = None,
    names: LpNames | None = None,
    warm: WarmStart | None = None,
) -> Solution:
    """The LP relaxation, then CP-SAT (see module doc), within `memory`'s rows, from
    `start_choice` when it beats the LP's rounding; the LP from `warm` (see `solve_lp`)."""
    start = time.perf_counter()
    options = options.started()
    # ties go to the plan holding less memory: 1 GiB weighs ~10 ns, a secondary objective
    # (it must exceed the LP solver's tolerance to act); `evaluate` and the reported
    # objective do not include it
    node_cost = [n.cost.astype(float) + TIE_BREAK_S_PER_BYTE * n.memory for n in problem.nodes]
    pair_edges = fold_single_edges(problem, node_cost)
    lp = solve_lp(problem, node_cost, pair_edges, options, memory, names, warm)
    if lp.choice is not None:  # the relaxation's optimum is integral: a proven optimum
        flag = SolveStats(lp_integral=True)
        return _answer(problem, lp.choice, SolveStatus.OPTIMAL, start, lp, flag)
    starts = _starts(problem, node_cost, lp, memory, start_choice)
    too_large = lp.variables > options.tuning.cpsat_max_variables
    if (too_large or options.left() <= 0) and starts.fallback is not None:
        # CP-SAT would spend minutes and gigabytes building the model and not come near
        # the start it is given (on the largest GPTs it reached a gap of a fifth, or ran
        # out of memory under a budget), or the time is out (building the model alone
        # took 6 s of a corpus step's `--time-limit 2`): the start is the answer, with a
        # budget the smallest layouts; it is proven optimal when the LP's bound meets it
        gap = problem.evaluate(starts.fallback).objective - lp.bound
        within = gap <= PROVEN_GAP * abs(lp.bound)
        proven = SolveStatus.OPTIMAL if within else SolveStatus.FEASIBLE
        flag = SolveStats(cpsat_skipped=True)
        return _answer(problem, starts.fallback, proven, start, lp, flag)
    built = _cpsat_model(problem, node_cost, pair_edges, memory)
    return _run_cpsat(problem, built, options, lp.bound, starts, start)


def _run_cpsat(
    problem: ShardingProblem,
    built: _CpsatModel,
    options: SolveOptions,
    lp_bound: float,
    starts: _Starts,
    start: float,
) -> Solution:
    """CP-SAT on the model from the hint, for the time left (at least MIN_CPSAT_S); the
    plan it finds, or the fallback where that is cheaper or CP-SAT found none. The bound
    is the better of CP-SAT's and the LP's (`lp_bound`); `start` is when `_solve` began."""
    from ortools.sat.python import cp_model

    for v, row in enumerate(built.s):
        for k, var in enumerate(row):
            built.model.add_hint(var, k == starts.hint[v])
    solver = cpsat_solver(options, max(MIN_CPSAT_S, options.left()))
    status = solver.solve(built.model)
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if status == cp_model.INFEASIBLE:  # proven: a fallback here breaks a forbidden pair
        raise InfeasibleError("no plan fits the memory budget and avoids every forbidden choice")
    if not found and starts.fallback is None:
        raise InfeasibleError(
            f"the solver found no plan within {options.time_limit_s:g} s "
            f"(status {solver.status_name(status)})"
        )
    bound = max(lp_bound, solver.best_objective_bound / built.scale if found else 0.0)
    choice = starts.fallback
    if found:
        choice = tuple(
            next(k for k, var in enumerate(row) if solver.boolean_value(var)) for row in built.s
        )
        if (
            starts.fallback is not None
            and problem.evaluate(starts.fallback).objective < problem.evaluate(choice).objective
        ):
            choice = starts.fallback
    assert choice is not None
    evaluation = problem.evaluate(choice)
    proto = built.model.proto
    return Solution(
        choice=choice,
        objective=evaluation.objective,
        bound=min(evaluation.objective, bound),
        status=SolveStatus.OPTIMAL if status == cp_model.OPTIMAL else SolveStatus.FEASIBLE,
        solve_time_s=time.perf_counter() - start,
        peak_memory=evaluation.peak_memory,
        variables=len(proto.variables),
        constraints=len(proto.constraints),
    )


def _starts(
    problem: ShardingProblem,
    node_cost: list[np.ndarray],
    lp: LpResult,
    memory: CoreRows | None,
    start_choice: tuple[int, ...] | None,
) -> _Starts:
    """A plan to fall back on, so the solver always has one, and CP-SAT's hint. Without
    a budget any choice is valid: the LP's rounding (each node's cheapest where the LP
    had no time), improved node by node, or the given plan improved where it beats that.
    With one, the smallest layouts fit (check_budget): a plan, if a poor one; then the
    LP's rounding and the given plan, where they fit and cost less."""
    if memory is None:
        rounded = (
            list(lp.rounded) if lp.rounded is not None else [int(np.argmin(c)) for c in node_cost]
        )
        improved = improve(problem, node_cost, rounded)
        if start_choice is not None:
            given = improve(problem, node_cost, list(start_choice))
            if problem.evaluate(given).objective < problem.evaluate(improved).objective:
                improved = given
        return _Starts(tuple(improved), tuple(improved))
    smallest = tuple(
        int(np.argmin(np.where(np.isfinite(c), n.memory, np.inf)))
        for n, c in zip(problem.nodes, node_cost, strict=True)
    )
    fallback: tuple[int, ...] | None = None
    for candidate in (smallest, lp.rounded, start_choice):
        if (
            candidate is not None
            and memory.fits(candidate)
            and (
                fallback is None
                or problem.evaluate(candidate).objective < problem.evaluate(fallback).objective
            )
        ):
            fallback = tuple(candidate)
    if lp.rounded is not None:
        return _Starts(fallback, lp.rounded)
    return _Starts(fallback, fallback if fallback is not None else smallest)


@dataclass(frozen=True)
class _CpsatModel:
    """The model of the module doc on CP-SAT (`_cpsat_model`)."""

    model: cp_model.CpModel
    s: list[list[cp_model.IntVar]]
    """s[v][k]."""
    scale: float
    """Integer cost per second."""


def _cpsat_model(
    problem: ShardingProblem,
    node_cost: list[np.ndarray],
    pair_edges: list[ProblemEdge],
    memory: CoreRows | None,
) -> _CpsatModel:
    """The model of the module doc on CP-SAT, costs with the tie break (`node_cost`),
    edges with one side of one strategy folded (`pair_edges` the others). Written as the
    text of its proto (`_ModelText`), which CP-SAT parses in one call: the same model,
    field for field, as the calls of its Python API make (`new_bool_var` per variable,
    `add` per row, `minimize` over the sum: 0.4-1.7 s a model on the zoo's tiny VGG, a
    third of a combined search's trials there), in a fraction of their time."""
    total = sum(_finite_max(c) for c in node_cost) + sum(_finite_max(e.cost) for e in pair_edges)
    scale = COST_SCALE if total * COST_SCALE < COST_SUM_MAX else COST_SUM_MAX / max(total, 1e-30)
    from ortools.sat.python import cp_model

    text = _ModelText(scale)
    first = text.strategies([len(n.labels) for n in problem.nodes])
    # (one)
    for v, costs in enumerate(node_cost):
        text.exactly_one(first[v], len(costs))
        text.price(first[v] + np.arange(len(costs)), costs)
    # (rows), (cols) on grouped layouts
    for e in pair_edges:
        rows, _ = groups(e.cost)
        cols, _ = groups(e.cost.T)
        if len(rows) == 1 or len(cols) == 1:  # the cost depends on one side only: fold it
            if len(rows) == 1:
                text.price(first[e.v] + np.arange(e.cost.shape[1]), e.cost[0, :])
            else:
                text.price(first[e.u] + np.arange(e.cost.shape[0]), e.cost[:, 0])
            continue
        pair = text.pairs(e.u, e.v, len(rows), len(cols))  # [g, h] -> variable
        for g, members in enumerate(rows):
            text.equal(pair[g, :], first[e.u] + np.array(members))
        for h, members in enumerate(cols):
            text.equal(pair[:, h], first[e.v] + np.array(members))
        firsts = np.ix_([r[0] for r in rows], [c[0] for c in cols])
        text.price(pair.ravel(), e.cost[firsts].ravel())
    model = cp_model.CpModel()
    model.proto.parse_text_format(text.finished())
    s = [
        [model.get_bool_var_from_proto_index(i) for i in range(first[v], first[v] + len(n.labels))]
        for v, n in enumerate(problem.nodes)
    ]
    # (memory)
    if memory is not None:
        _add_memory(model, memory, s)
    return _CpsatModel(model, s, scale)


class _ModelText:
    """A CP-SAT model as the text of its proto, written as `CpModel`'s calls would make
    it: variables named and numbered in the order made, each row's terms by variable
    (as the API sorts them), the objective's terms summed per variable and in variable
    order (as `minimize` of a sum leaves them)."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.variables: list[str] = []
        self.rows: list[str] = []
        self.terms: list[tuple[np.ndarray, np.ndarray]] = []  # (variables, coefficients)

    def strategies(self, sizes: list[int]) -> list[int]:
        """Variables s[v][k] for nodes of these numbers of strategies; node v's first."""
        first = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
        self.variables += [
            f'variables {{ name: "s[{v}][{k}]" domain: [0, 1] }}'
            for v, size in enumerate(sizes)
            for k in range(size)
        ]
        return [int(f) for f in first[:-1]]

    def pairs(self, u: int, v: int, rows: int, cols: int) -> np.ndarray:
        """Variables e[u,v][g,h] for g < rows, h < cols: their numbers as a rows x cols
        array."""
        base = len(self.variables)
        self.variables += [
            f'variables {{ name: "e[{u},{v}][{g},{h}]" domain: [0, 1] }}'
            for g in range(rows)
            for h in range(cols)
        ]
        return base + np.arange(rows * cols).reshape(rows, cols)

    def exactly_one(self, first: int, count: int) -> None:
        literals = ", ".join(map(str, range(first, first + count)))
        self.rows.append(f"constraints {{ exactly_one {{ literals: [{literals}] }} }}")

    def equal(self, plus: np.ndarray, minus: np.ndarray) -> None:
        """sum(plus) == sum(minus) for pairs `plus` and strategies `minus` (ascending), as
        `add` writes it: plus - minus in [0, 0], its terms by variable (the strategies
        are numbered before every pair)."""
        signs = np.concatenate([np.full(len(minus), -1), np.ones(len(plus), np.int64)])
        self._linear(np.concatenate([minus, plus]), signs)

    def price(self, variables: np.ndarray, costs: np.ndarray) -> None:
        """`costs * variables` into the objective, scaled to integers; a forbidden (+inf)
        cost makes its variable 0 instead (a row, in the order of `variables`)."""
        costs = np.asarray(costs, dtype=np.float64)
        forbidden = ~np.isfinite(costs)
        for i in variables[forbidden].tolist():
            self._linear(np.array([i]), np.array([1]))
        priced = ~forbidden & (costs != 0)
        coefficients = np.array([int(round(c * self.scale)) for c in costs[priced].tolist()])
        self.terms.append((variables[priced], coefficients.astype(np.int64)))

    def _linear(self, variables: np.ndarray, coefficients: np.ndarray) -> None:
        terms = f"vars: {_listed(variables)} coeffs: {_listed(coefficients)}"
        self.rows.append(f"constraints {{ linear {{ {terms} domain: [0, 0] }} }}")

    def finished(self) -> str:
        """The model's text, with its objective (`minimize`)."""
        variables = np.concatenate([v for v, _ in self.terms] + [np.zeros(0, np.int64)])
        coefficients = np.concatenate([c for _, c in self.terms] + [np.zeros(0, np.int64)])
        used, at = np.unique(variables, return_inverse=True)
        summed = np.zeros(len(used), dtype=np.int64)
        np.add.at(summed, at, coefficients)
        kept = summed != 0
        objective = f"vars: {_listed(used[kept])} coeffs: {_listed(summed[kept])}"
        objective += " scaling_factor: 1"
        return "\n".join([*self.variables, *self.rows, f"objective {{ {objective} }}"])


def _listed(values: np.ndarray) -> str:
    """Integers as a text-format list: [1, 2, 3]."""
    return f"[{', '.join(map(str, values.tolist()))}]"


def _finite_max(costs: np.ndarray) -> float:
    finite = costs[np.isfinite(costs)]
    return float(finite.max()) if finite.size else 0.0


def cpsat_solver(options: SolveOptions, time_limit_s: float) -> cp_model.CpSolver:
    """CP-SAT set up from `options` (threads, seed, gap, deterministic work limit), run
    for at most `time_limit_s`."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    if options.work_limit is not None:
        solver.parameters.max_deterministic_time = options.work_limit
    solver.parameters.num_workers = max(1, options.threads)
    solver.parameters.random_seed = options.seed
    solver.parameters.interleave_search = True  # deterministic with several workers
    solver.parameters.relative_gap_limit = options.relative_gap
    return solver


def _answer(
    problem: ShardingProblem,
    choice: tuple[int, ...],
    status: SolveStatus,
    start: float,
    lp: LpResult,
    stats: SolveStats,
) -> Solution:
    """`choice` as the solution, before CP-SAT ran (`stats` say why), with the LP's
    bound and size."""
    evaluation = problem.evaluate(choice)
    return Solution(
        choice=choice,
        objective=evaluation.objective,
        bound=min(evaluation.objective, lp.bound),
        status=status,
        solve_time_s=time.perf_counter() - start,
        peak_memory=evaluation.peak_memory,
        variables=lp.variables,
        constraints=lp.constraints,
        stats=stats,
    )


def improve(
    problem: ShardingProblem,
    node_cost: list[np.ndarray],
    choice: list[int],
    sweeps: int = 20,
    within: tuple[Usage, float, SolveOptions] | None = None,
) -> list[int]:
    """Local search from `choice`: each node in turn takes the strategy that is cheapest
    given its neighbours' current ones, until no node changes (or `sweeps` passes). Never
    worse than `choice`; the rounded LP optimum often gains a lot. `within` = (the usage
    of `choice`, which fits, a budget, options whose deadline ends the sweeps): only
    strategies that keep every step the node is live at within the budget are taken."""
    choice = list(choice)
    incident: list[list[tuple[np.ndarray, int, bool]]] = [[] for _ in problem.nodes]
    for e in problem.edges:  # edges to a node with one strategy are in node_cost already
        if e.cost.any() and min(e.cost.shape) > 1:
            incident[e.u].append((e.cost, e.v, True))
            incident[e.v].append((e.cost, e.u, False))
    # a node whose neighbours kept their strategies since it was last weighed would keep
    # its own again: only the others are weighed (without a budget, where nothing else
    # moves the answer), the same sweeps as weighing every node
    stale = [len(c) > 1 for c in node_cost]
    for _ in range(sweeps):
        changed = False
        for v in range(len(problem.nodes)):
            if not stale[v]:
                continue
            stale[v] = within is not None
            total = node_cost[v].copy()
            for cost, w, outgoing in incident[v]:
                total += cost[:, choice[w]] if outgoing else cost[choice[w], :]
            best = int(np.argmin(total))
            if total[best] >= total[choice[v]] - MIN_GAIN_S:
                continue
            if within is not None:
                best = _best_within(problem.nodes[v].memory, total, choice[v], v, within)
                if best < 0:
                    continue
                within[0].move(
                    v, float(problem.nodes[v].memory[best] - problem.nodes[v].memory[choice[v]])
                )
            choice[v] = best
            changed = True
            for _, w, _ in incident[v]:
                stale[w] = len(node_cost[w]) > 1
        if not changed or (within is not None and within[2].left() <= 0):
            break
    return choice


def _best_within(
    memory: np.ndarray, total: np.ndarray, k: int, v: int, within: tuple[Usage, float, SolveOptions]
) -> int:
    """The cheapest strategy of v better than k whose memory fits (-1 if none)."""
    usage, budget, _ = within
    better = np.flatnonzero(total < total[k] - MIN_GAIN_S)
    grow = memory[better] - memory[k]
    room = budget * (1 + FEASIBILITY) - usage.highest(v) if (grow > 0).any() else 0.0
    fits = better[grow <= np.maximum(room, 0.0)]
    return int(fits[np.argmin(total[fits])]) if len(fits) else -1


def fold_single_edges(problem: ShardingProblem, node_cost: list[np.ndarray]) -> list[ProblemEdge]:
    """Add the edges from or to a node with one strategy into the other node's cost (in
    `node_cost`, in place); the edges left that cost something."""
    pair_edges = []
    for e in problem.edges:
        if not e.cost.any():
            continue
        if len(problem.nodes[e.u].labels) == 1:
            node_cost[e.v] += e.cost[0, :]
        elif len(problem.nodes[e.v].labels) == 1:
            node_cost[e.u] += e.cost[:, 0]
        else:
            pair_edges.append(e)
    return pair_edges


def _add_memory(model: cp_model.CpModel, memory: CoreRows, s: list[list[cp_model.IntVar]]) -> None:
    largest = max((abs(rhs) for _, rhs in memory.rows), default=1)
    unit = max(1, -(-largest // MEMORY_COEFFICIENT_MAX))
    for members, rhs in memory.rows:
        terms = [
            -(-int(m) // unit) * s[v][k]
            for v in members.tolist()
            if v in memory.terms
            for k, m in enumerate(memory.terms[v])
            if m > 0
        ]
        if terms:
            model.add(sum(terms) <= rhs // unit)


def min_peak_memory(problem: ShardingProblem) -> tuple[float, int, str]:
    """The smallest peak any plan can have: every node in its smallest layout (exact, as
    nodes' memory does not depend on each other). (bytes, step, largest node then)."""
    best = [int(np.argmin(n.memory)) for n in problem.nodes]
    peak, step, (name, _) = problem.peak_memory(best)
    return peak, step, name


def check_budget(problem: ShardingProblem) -> None:
    peak, step, name = min_peak_memory(problem)
    if problem.budget is not None and peak > problem.budget:
        raise InfeasibleError(
            f"no plan fits the memory budget of {format_bytes(problem.budget, 2)} per device: "
            f"the smallest possible peak is {format_bytes(peak, 2)} (at step {step}, largest "
            f"tensor then: %{name}); set `budget_bytes` to "
            f"{format_bytes(peak, 2, up=True).replace(' ', '')} or more, or use a larger mesh"
        )


def solve_brute_force(problem: ShardingProblem) -> Solution:
    """Try every choice (tiny problems only)."""
    start = time.perf_counter()
    best: tuple[float, tuple[int, ...]] | None = None
    for choice in itertools.product(*(range(len(n.labels)) for n in problem.nodes)):
        try:
            value = problem.evaluate(choice).objective
        except InfeasibleError:
            continue
        if best is None or value < best[0] - MIN_GAIN_S:
            best = (value, choice)
    if best is None:
        raise InfeasibleError("no plan fits the memory budget")
    ev = problem.evaluate(best[1])
    return Solution(
        best[1],
        ev.objective,
        ev.objective,
        SolveStatus.OPTIMAL,
        time.perf_counter() - start,
        ev.peak_memory,
    )
