"""`make_plan(module, mesh, ...)`: the SPMD search, from HLO to a `Plan`.

module --build_graph--> ShardingGraph --to_problem--> ShardingProblem
       --solve_merged (O2: cones, segments) | solve_ilp (O3: the whole graph)--> Solution
       --to_plan--> Plan
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import multiprocessing
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np

from rhino.hlo.collector import collector_paused, heap_frozen
from rhino.hlo.errors import ConfigError
from rhino.hlo.ir import Module
from rhino.hlo.printer import print_module
from rhino.hlo.shape import Shape
from rhino.search.cluster import Cluster
from rhino.search.heap import return_freed_memory
from rhino.search.mesh import DeviceMesh
from rhino.search.problem import (
    ProblemEdge,
    ProblemNode,
    ShardingProblem,
    Solution,
    SolveOptions,
    SolveStatus,
)
from rhino.search.spmd.budget import share_of, solve_within_budget
from rhino.search.spmd.builder import GraphNode, ShardingGraph, build_graph
from rhino.search.spmd.combine import combine, node_latencies, search_groups
from rhino.search.spmd.comm import COMBINE_THRESHOLD_BYTES, GroupKey
from rhino.search.spmd.lp import LpBasis, WarmStart
from rhino.search.spmd.merge import SearchMemo, solve_merged
from rhino.search.spmd.plan import (
    LEVELS,
    CombinedSearch,
    InstructionPlan,
    Plan,
    PlannedCollective,
    PlannedReshard,
    SolverReport,
    mesh_use_warnings,
    module_hash,
)
from rhino.search.spmd.replay import Recording
from rhino.search.spmd.reshard import reshard
from rhino.search.spmd.solver import PROVEN_GAP, check_budget, solve_ilp
from rhino.search.spmd.spec import ShardingSpec, SpecError
from rhino.search.workers import worker_context, workers_can_start

HEAVY_OPCODES = ("dot", "convolution")
HEAVY_SHARE = 0.005
"""Besides dots and convolutions, an instruction doing this share of the step's compute
(on one device) is compute-heavy (`ProblemNode.heavy`)."""
MEMORY_MODES = ("exact", "largest")
TRIAL_WORK = 1.0
"""CP-SAT's deterministic work limit in the combined-collectives search's later plans
(the first has the time limit only). Where a trial's LP is fractional CP-SAT ran until
the clock stopped it: 14-21 s on the zoo's tiny GPT on 1x4, and a plan that depended on
the machine's load; at 0.5-2 the search chose the same plan in a quarter to a third of
the time (24.7 s against 6.1-8.2 s)."""
APART_PAIRS = 100_000
"""The combined-collectives search makes its later plans in worker processes (not on
threads) where the first problem has at least this many strategy pairs over its edges
(the README demo: 296k), or where O2 searched by segments: each plan's Python then runs
beside the other's, not in turns, for the cost of sending what the plan changes."""


@dataclass(frozen=True)
class PlanRequest:
    """What to plan for, besides the module."""

    mesh: DeviceMesh
    cluster: Cluster
    level: str = "O2"
    budget_bytes: float | None = None
    pins: tuple[tuple[str, ShardingSpec], ...] = ()
    solve: SolveOptions = SolveOptions()
    max_strategies: int = 64
    state: bool = True
    """Updated state returns in its parameter's layout (see builder.state_pairs)."""
    strides: bool = True
    """Consider non-maximal strides where reshapes make them useful (Rhino §4.1)."""
    memory_mode: str = "exact"
    """How the budget is met: "exact", the liveness rows (O3: in the ILP; O2: relaxed into
    node costs, `rhino.search.spmd.budget`), or "largest" (Rhino §4.4: force the k largest
    parameters to be sharded, smallest feasible k)."""


def make_plan(
    module: Module, request: PlanRequest, progress: Callable[[str], None] | None = None
) -> Plan:
    """The best plan for `module` on the request's mesh (see module doc)."""
    if request.level not in LEVELS:
        raise ConfigError(
            f"optimization level {request.level!r} is not available; "
            f"choose one of {', '.join(LEVELS)}"
        )
    if request.memory_mode not in MEMORY_MODES:
        raise ConfigError(
            f"memory mode {request.memory_mode!r}: choose one of {', '.join(MEMORY_MODES)}"
        )
    say = progress or (lambda _msg: None)
    start = time.perf_counter()
    options = request.solve.started()  # one deadline for every phase
    phases: dict[str, float] = {}
    plan = _searched(module, request, options, say, phases)
    # what the search held (the graph's strategy tables, the windows, the LPs) goes back
    # to the system before the plan is printed: the 48-layer GPT-2's JSON document was
    # made on top of ~400 MiB that the search had freed and glibc still held
    return_freed_memory()
    return dataclasses.replace(
        plan,
        search_time_s=time.perf_counter() - start,
        warnings=plan.warnings + mesh_use_warnings(plan) + limit_warnings(plan, options),
    )


def _searched(
    module: Module,
    request: PlanRequest,
    options: SolveOptions,
    say: Callable[[str], None],
    phases: dict[str, float],
) -> Plan:
    """`make_plan`'s graph and search (what they hold is freed when this returns)."""
    say("building strategies")
    clock = time.perf_counter()
    graph = build_graph(
        module,
        request.mesh,
        request.cluster,
        pins=dict(request.pins),
        max_strategies=request.max_strategies,
        state=request.state,
        strides=request.strides,
    )
    phases["build"] = time.perf_counter() - clock
    memo = SearchMemo()  # O2's windows and critical path, found once for every plan made
    with heap_frozen():  # the module and the graph: never walked by the search's collections
        plan = plan_combined(
            graph,
            request,
            lambda p, warm, opts: _solve(graph, p, request, opts, memo, warm),
            options,
            say,
            phases,
            memo,
        )
    return plan


def limit_warnings(plan: Plan, options: SolveOptions) -> tuple[str, ...]:
    """What to say when the time limit cut the search short."""
    if options.left() > 0 or plan.solver.status is SolveStatus.OPTIMAL:
        return ()
    return (
        f"the time limit ({options.time_limit_s:g} s) was hit: this is the best plan found "
        f"by then (solver {plan.solver.status.value}), not a proven one; a longer "
        "`time_limit_s` may find a better one",
    )


def plan_combined(
    graph: ShardingGraph,
    request: PlanRequest,
    solve: Callable[[ShardingProblem, WarmStart, SolveOptions], Solution],
    options: SolveOptions,
    say: Callable[[str], None],
    phases: dict[str, float],
    memo: SearchMemo | None = None,
) -> Plan:
    """The plan `solve` finds for the graph, with the search over combined collectives
    (`rhino.search.spmd.combine`); `solve` is given `options`, with TRIAL_WORK for every
    plan after the first. `options.threads` plans are made at once: on threads
    where the first plan's search was one LP (each plan's LP starts from the basis of the
    plan it varies, `rhino.search.spmd.lp.WarmStart`; HiGHS releases the GIL), in worker
    processes where it was O2's level 3 (segments and windows, mostly Python, which
    threads would take turns at), given `memo` (the windows solved so far) and handing
    back the windows they solved. At level 3 the trials make no wide pass (windows of
    three segments: 33-61% of a trial's time on the real steps) and are weighed by their
    narrow passes; the plan the search chose makes it then, kept where no worse.
    `phases` gets "solve" and "plan" (solving the first problem and writing its plan,
    with the solver's own phases "solve.<phase>" inside "solve") and "combine" (the
    search over combined collectives after it, wall time), so that the phases add up to
    the search time."""
    spent: list[float] = []  # the first plan's seconds solving, seconds writing
    bases: dict[frozenset[GroupKey], LpBasis | None] = {}
    plans: dict[frozenset[GroupKey], tuple[int, ...]] = {}
    pool: ProcessPoolExecutor | None = None  # the later plans' workers, where they have any
    level3 = False
    first_problem: list[ShardingProblem] = []  # the one every later problem varies
    apart = (
        options.threads > 1
        and memo is not None
        and request.memory_mode != "largest"  # its search reads the graph
        and multiprocessing.parent_process() is None  # a worker of --devices: no more
        and workers_can_start()
    )
    if memo is not None:  # later plans made here replay the first one's reductions
        memo.record = not apart

    def plan_with(closed: frozenset[GroupKey], parent: frozenset[GroupKey] | None) -> Plan:
        clock = time.perf_counter()
        # a later plan is one trial of the combined search: its CP-SAT stops at TRIAL_WORK,
        # not at the clock, so that which trial wins does not depend on the machine's load
        trial = options if parent is None else options.working_at_most(TRIAL_WORK)
        finishing = parent == closed  # the plan chosen, made again with the wide passes
        if level3 and parent is not None and not finishing:  # a trial: narrow passes only
            trial = dataclasses.replace(
                trial, tuning=dataclasses.replace(trial.tuning, wide_passes=0)
            )
        problem = to_problem(graph, request.budget_bytes, closed)
        keys = ", ".join(f"{k} axis {','.join(map(str, a))}" for k, a in sorted(closed))
        say(
            (
                f"refining the plan chosen over wider windows ({request.level})"
                if finishing
                else f"solving ({request.level}): {problem.size[0]} nodes, {problem.size[1]} edges"
            )
            + (f", {keys} not combined" if closed else "")
        )
        solution = None
        # level 3 refines the plan this one varies instead of making first plans again
        start = plans.get(parent) if parent is not None and level3 else None
        if parent is None:
            first_problem.append(problem)
            # later plans go to workers by its size: they start while this one is solved,
            # where it is small enough to be sent at once (on T5-large's 13.9M pairs, sending
            # it would cost the first plan 1.7 s and 110 MB for a combined search it skips)
            if apart and APART_PAIRS <= problem.size[2] <= options.tuning.whole_core_pairs:
                started_pool(warm=True)
        basis = bases.get(parent) if parent is not None else None
        if pool is not None and memo is not None and parent is not None:
            remote = _solved_apart(
                pool, first_problem[0], problem, request, trial, memo, start, basis
            )
            if remote is not None:
                solution, bases[closed] = remote
        if solution is None:
            warm = WarmStart(start=basis, plan=start)
            solution = solve(problem, warm, trial)
            bases[closed] = warm.found
        plans[closed] = solution.choice
        solved = time.perf_counter()
        say("writing the plan")
        plan = to_plan(graph, problem, solution, request, 0.0)
        if parent is None:
            spent.extend((solved - clock, time.perf_counter() - solved))
        return_freed_memory()  # the solve's and the writing's, before the next plan's
        return dataclasses.replace(plan, solver=search_report(plan.solver, solution))

    def started_pool(warm: bool) -> None:
        nonlocal pool
        pool = ProcessPoolExecutor(
            options.threads,
            mp_context=worker_context(__name__),
            initializer=_remember_first,  # sent once to each worker, then only changes
            initargs=(first_problem[0],),
        )
        if warm:  # each worker started now, not at its first plan, and from a thread:
            # starting the fork server waits for it to import the planner (0.2 s)
            threading.Thread(target=_warmed, args=(pool, options.threads), daemon=True).start()

    try:
        first = plan_with(frozenset(), None)
        clock = time.perf_counter()
        level3 = first.solver.merge_level == 3
        if (level3 or first_problem[0].size[2] >= APART_PAIRS) and apart and pool is None:
            started_pool(warm=False)  # its workers start with the first plan they get
        # plans made apart: a worker idle at a round's end may start the next round's, or
        # the last plan's finish
        plan, closed, made = search_groups(
            first,
            plan_with,
            options.left,
            options.threads,
            speculate=pool is not None,
            finish=level3,  # the wide passes the trials leave out
        )
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    phases.update(solve=spent[0], plan=spent[1], combine=time.perf_counter() - clock)
    # the first problem leaves out the latency of every combined collective: its bound
    # is below every plan's objective_s, whichever problem found the plan
    combined = CombinedSearch(
        plans=made + 1,
        closed=tuple(f"{k} axis {','.join(map(str, a))}" for k, a in sorted(closed)),
        bound_s=min(float(first.solver.bound_s), plan.objective_s),
    )
    solver = dataclasses.replace(
        plan.solver,
        combined=combined,
        phases_s={
            **({"build": phases["build"]} if "build" in phases else {}),
            "solve": phases["solve"],
            **(first.solver.phases_s or {}),
            "combine": phases["combine"],
            "plan": phases["plan"],
        },
    )
    return dataclasses.replace(plan, solver=solver)


def _warmed(pool: ProcessPoolExecutor, workers: int) -> None:
    """Start `pool`'s `workers` processes (each given a task that does nothing)."""
    with contextlib.suppress(BrokenProcessPool, OSError, RuntimeError):  # broken or shut down
        for _ in range(workers):
            pool.submit(int)


def _solved_apart(
    pool: ProcessPoolExecutor,
    first: ShardingProblem,
    problem: ShardingProblem,
    request: PlanRequest,
    options: SolveOptions,
    memo: SearchMemo,
    start: tuple[int, ...] | None,
    basis: LpBasis | None,
) -> tuple[Solution, LpBasis | None] | None:
    """`_solve` on one of `pool`'s workers (level 3 refining `start`, an LP starting from
    `basis`), the windows it solved added to `memo`: the solution and the basis its LP
    ended with; None where the workers broke or could not start (killed, out of memory,
    no process left: the caller then solves here; where they would break as they start,
    the search does not start them, `workers_can_start`). The workers hold `first`
    (`_remember_first`): `problem` goes to them as its nodes and edges that are not
    `first`'s (a closed key's members), not whole (on the 48-layer GPT-2, 21 MB, 0.7 s
    to send and read)."""
    # copies: the pool pickles on its own thread while other plans add windows
    work = (
        _changes(first, problem),
        request,
        options,
        dict(memo.windows),
        dict(memo.structures),
        start,
        basis,
    )
    try:
        solution, windows, found = pool.submit(_solve_apart, work).result()
    except (BrokenProcessPool, OSError):  # OSError: no process could start (e.g. EAGAIN)
        return None
    memo.windows.update(windows)
    return solution, found


Changes = tuple[list[tuple[int, ProblemNode]], list[tuple[int, ProblemEdge]], float | None, float]
"""A problem as the nodes and edges where it differs from another of the same graph (by
position), its budget and its constant memory (`_changes`, `_changed`)."""


def _changes(first: ShardingProblem, problem: ShardingProblem) -> Changes:
    """`problem` as it differs from `first` (to_problem makes both from the same parts:
    what a closed key does not change is the same object)."""
    # one graph: as many nodes and edges in each
    nodes = [
        (i, n)
        for i, (a, n) in enumerate(zip(first.nodes, problem.nodes, strict=True))
        if a is not n
    ]
    edges = [
        (i, e)
        for i, (a, e) in enumerate(zip(first.edges, problem.edges, strict=True))
        if a is not e
    ]
    return nodes, edges, problem.budget, problem.constant_memory


def _changed(first: ShardingProblem, changes: Changes) -> ShardingProblem:
    """The problem `_changes(first, problem)` describes."""
    node_changes, edge_changes, budget, constant = changes
    nodes, edges = list(first.nodes), list(first.edges)
    for i, n in node_changes:
        nodes[i] = n
    for i, e in edge_changes:
        edges[i] = e
    return ShardingProblem(tuple(nodes), tuple(edges), budget, constant)


_FIRST: list[ShardingProblem] = []
"""In a worker process of `plan_combined`: the first problem, which later ones vary."""
_RECORDING: list[Recording | None] = [None]
"""In a worker process of `plan_combined`: the whole-graph reductions of the first
problem it solved, which the later ones replay (`SearchMemo.recording`; sending the
main process' would cost more than it saves: 75 MB and 1 s to pickle on the 48-layer
GPT-2)."""


def _remember_first(problem: ShardingProblem) -> None:
    _FIRST[:] = [problem]


def _solve_apart(
    work: tuple[
        Changes,
        PlanRequest,
        SolveOptions,
        dict[Any, tuple[int, ...]],
        dict[bytes, Any],
        tuple[int, ...] | None,
        LpBasis | None,
    ],
) -> tuple[Solution, dict[Any, tuple[int, ...]], LpBasis | None]:
    """`_solve` in a worker process (see `plan_combined`): the solution, the windows it
    solved that the memo it was given did not have, and the basis its LP ended with."""
    changes, request, options, windows, structures, start, basis = work
    problem = _changed(_FIRST[0], changes)
    memo = SearchMemo(
        windows=dict(windows), structures=dict(structures), record=True, recording=_RECORDING[0]
    )
    warm = WarmStart(start=basis, plan=start)
    solution = _solve(None, problem, request, options, memo, warm)
    _RECORDING[0] = memo.recording
    return_freed_memory()  # this worker's next plan starts from what this one left
    return solution, {k: v for k, v in memo.windows.items() if k not in windows}, warm.found


def _solve(
    graph: ShardingGraph | None,
    problem: ShardingProblem,
    request: PlanRequest,
    options: SolveOptions,
    memo: SearchMemo,
    warm: WarmStart | None = None,
) -> Solution:
    """The request's level and memory mode on `problem` (O2 without a budget: its LP from
    `warm`)."""
    merged = functools.partial(solve_merged, memo=memo)
    solve = merged if request.level == "O2" else solve_ilp
    if problem.budget is not None and request.memory_mode == "largest":
        assert graph is not None, "the largest-sharded search reads the graph"
        solution = solve_largest_sharded(graph, problem, options, solve)  # Rhino §4.4
    elif problem.budget is not None and request.level == "O2":
        # the budget's rows relaxed into node costs: O2 itself never sees a memory row
        solution = solve_within_budget(problem, options, merged)
    elif request.level == "O3":
        solution = solve_whole(problem, options, memo, warm)
    elif request.level == "O2":
        solution = solve_merged(problem, options, memo=memo, warm=warm)
    else:
        solution = solve(problem, options)
    stats = solution.stats
    if stats.sizes.nodes is None:  # the sizes O2 reports, for every path
        sizes = memo.structure(problem)[1].updated(stats.sizes)
        solution = dataclasses.replace(solution, stats=dataclasses.replace(stats, sizes=sizes))
    return solution


def search_report(report: SolverReport, solution: Solution) -> SolverReport:
    """`report` with what the search did: the level of merging it reached (O2: 1 cones
    only, 2 one ILP over the merged graph, 3 segments; O3: 0, the whole graph), the
    sizes of the coarsened graphs (not the merged nodes and core pairs), seconds per
    phase of the solver (as "solve.<phase>", its total left out), and how it met the
    budget."""
    stats = solution.stats
    return dataclasses.replace(
        report,
        budget_search=stats.budget,
        merge_level=stats.level or 0,
        sizes=dataclasses.replace(stats.sizes, merged=None, core_pairs=None),
        phases_s={f"solve.{k}": v for k, v in stats.phases_s.items() if k != "total"},
    )


def solve_whole(
    problem: ShardingProblem,
    options: SolveOptions,
    memo: SearchMemo | None = None,
    lp_start: WarmStart | None = None,
) -> Solution:
    """O3: the whole-graph ILP, started from O2's plan (given at most half the time), so
    it is never worse than O2. Where O2 itself solved the whole core by one ILP (its level
    2) that is O3's answer already (that LP from `lp_start`, as in `solve_merged`).

    With a budget, the problem without it comes first: a budget only removes plans, so
    that problem's optimum and bound are the budget's too where the plan fits. Where
    O2's plan fits, O3 goes on from it without the budget, and only if O3's plan does not
    fit does the ILP carry the memory rows, from O2's plan. Where O2's plan does not fit:
    - O3 without the budget (half the time left). Its bound is the budget's, and its
      plan is the answer where it fits and is proven optimal. The ILP with the rows
      proves little on large graphs (its core keeps what the budget bars the reductions
      from: on the 24-layer GPT on 2x8 under a tight budget its LP did not converge and
      bounded nothing, where the LP without the budget converged and bounded the plan
      closely; scripts/bench_o2.py measures it).
    - O2 within the budget (`solve_within_budget`, half the time left).
    - The ILP with the rows, from the cheaper of those two plans that fit. (From the
      smallest layouts, as before, O3 came out well behind O2 on the GPTs under a
      budget.)"""
    if problem.budget is not None:
        check_budget(problem)  # the clear message, before anything else
    budget = np.inf if problem.budget is None else float(problem.budget)
    free = ShardingProblem(problem.nodes, problem.edges, None, problem.constant_memory)
    warm = solve_merged(free, share_of(options, 0.5), memo=memo, warm=lp_start)
    if warm.peak_memory > budget:  # the budget binds: its bound, O2 within it, the rows
        unbound = solve_ilp(free, share_of(options, 0.5), start=warm.choice)
        fits = unbound.peak_memory <= budget
        if fits and unbound.status is SolveStatus.OPTIMAL:
            return _warm_started(unbound, warm.solve_time_s, warm.objective)
        fitted = solve_within_budget(
            problem, share_of(options, 0.5), functools.partial(solve_merged, memo=memo), first=warm
        )
        start = unbound if fits and unbound.objective < fitted.objective else fitted
        found = solve_ilp(problem, options, start=start.choice)
        bound = min(max(found.bound, unbound.bound), found.objective)
        proven = found.objective - bound <= PROVEN_GAP * abs(found.objective)
        found = dataclasses.replace(
            found, bound=bound, status=SolveStatus.OPTIMAL if proven else found.status
        )
        spent = warm.solve_time_s + fitted.solve_time_s
        return _warm_started(found, spent, start.objective, unbound.bound)
    if (warm.stats.level or 0) < 3 and warm.status is SolveStatus.OPTIMAL:
        return dataclasses.replace(warm, stats=dataclasses.replace(warm.stats, level=0))
    found = solve_ilp(free, options, start=warm.choice)
    if found.peak_memory > budget:  # O3's plan does not fit: the rows, from O2's plan
        found = solve_ilp(problem, options, start=warm.choice)
    if found.objective > warm.objective:  # the limit stopped the ILP before it caught up
        found = dataclasses.replace(warm, bound=max(warm.bound, found.bound))
    return _warm_started(found, warm.solve_time_s, warm.objective)


def _warm_started(
    found: Solution, seconds: float, cost: float, unbudgeted_bound: float | None = None
) -> Solution:
    """O3's `found` with its warm start in the stats: the seconds it took (a phase,
    "warm_start") and its objective `cost`."""
    stats = dataclasses.replace(
        found.stats,
        phases_s={**found.stats.phases_s, "warm_start": seconds},
        warm_start_cost=cost,
        unbudgeted_bound=unbudgeted_bound,
    )
    return dataclasses.replace(found, stats=stats)


def solve_largest_sharded(
    graph: ShardingGraph,
    problem: ShardingProblem,
    options: SolveOptions,
    solve: Callable[[ShardingProblem, SolveOptions], Solution] = solve_ilp,
) -> Solution:
    """Rhino §4.4: sort the parameters by size, force the k largest to be sharded (their
    replicated strategies removed), solve without a memory constraint (with `solve`),
    and keep the smallest k whose plan fits the budget (binary search; feasibility
    grows with k)."""
    entry = graph.module.entry
    params = sorted(  # those with a sharded layout (not scalars, not 1-element dims)
        (
            v
            for v, n in enumerate(graph.nodes)
            if n.inst.opcode.value == "parameter"
            and n.inst.parent is entry
            and any(not s.outs[0].is_replicated() for s in n.strategies)
        ),
        key=lambda v: (-graph.nodes[v].leaf_shapes[0].byte_size, graph.nodes[v].name),
    )
    free = ShardingProblem(problem.nodes, problem.edges, None, problem.constant_memory)

    def attempt(k: int) -> Solution | None:
        allowed = {
            v: [i for i, s in enumerate(graph.nodes[v].strategies) if not s.outs[0].is_replicated()]
            for v in params[:k]
        }
        sub, back = restrict(free, allowed)
        found = solve(sub, options)
        choice = [back[v][k2] for v, k2 in enumerate(found.choice)]
        if problem.peak_memory(choice)[0] > (problem.budget or 0.0):
            return None  # (evaluating it would raise)
        return lifted(found, problem, back)

    low, high = 0, len(params)
    best = attempt(high)
    if best is None:
        return solve_ilp(problem, options)  # sharding every parameter is not enough: say why
    while low < high:
        mid = (low + high) // 2
        found = attempt(mid)
        if found is not None:
            best, high = found, mid
        else:
            low = mid + 1
    return best


def restrict(
    problem: ShardingProblem, allowed: dict[int, list[int]]
) -> tuple[ShardingProblem, list[list[int]]]:
    """The problem with only `allowed` strategies at some nodes; and for each node, the
    original index of each remaining strategy."""
    back = [allowed.get(v, list(range(len(n.labels)))) for v, n in enumerate(problem.nodes)]
    nodes = tuple(
        ProblemNode(
            n.name,
            tuple(n.labels[k] for k in back[v]),
            n.cost[back[v]],
            n.memory[back[v]],
            n.live,
            n.heavy,
        )
        for v, n in enumerate(problem.nodes)
    )
    edges = tuple(
        ProblemEdge(e.u, e.v, e.cost[np.ix_(back[e.u], back[e.v])], e.backward)
        for e in problem.edges
    )
    return ShardingProblem(nodes, edges, problem.budget, problem.constant_memory), back


def lifted(found: Solution, problem: ShardingProblem, back: list[list[int]]) -> Solution:
    """`found`, a solution of `problem` restricted (`restrict`'s `back`), as a solution of
    `problem`: its choice in the original indices, evaluated there."""
    choice = tuple(back[v][k] for v, k in enumerate(found.choice))
    ev = problem.evaluate(choice)
    return dataclasses.replace(
        found,
        choice=choice,
        objective=ev.objective,
        bound=min(found.bound, ev.objective),
        peak_memory=ev.peak_memory,
    )


T = TypeVar("T")

_PER_GRAPH: dict[tuple[int, Callable[..., Any]], tuple[weakref.ref[ShardingGraph], Any]] = {}
"""(id of a graph, function) -> (the graph, weakly, and what the function made of it)."""


def _per_graph(make: Callable[[ShardingGraph], T], graph: ShardingGraph) -> T:
    """`make(graph)`, made once while the graph lives. The search over combined
    collectives makes up to 9 problems and plans of one graph (`plan_combined`); what
    does not depend on the closed keys or on the choice is the same for all of them."""
    key = (id(graph), make)
    found = _PER_GRAPH.get(key)
    if found is None or found[0]() is not graph:

        def forget(_: weakref.ref[ShardingGraph]) -> None:
            _PER_GRAPH.pop(key, None)

        found = _PER_GRAPH[key] = (weakref.ref(graph, forget), make(graph))
    return cast(T, found[1])


@dataclass(frozen=True)
class _ProblemParts:
    """What `to_problem` makes of a graph whatever the closed keys: the problem with no
    key closed, and what closing keys changes in it."""

    nodes: tuple[ProblemNode, ...]
    edges: tuple[ProblemEdge, ...]
    quiet: dict[int, tuple[np.ndarray, dict[GroupKey, np.ndarray]]]
    """Node with combinable collectives of its own -> its cost per strategy with their
    latency (unweighted), and their latency per key (`node_latencies`)."""
    combined: dict[tuple[int, int], int]
    """Edge of `graph.combined` -> its index in `edges`."""
    largest: tuple[int, ...]
    """Per node, its strategy of the largest results."""

    @functools.cached_property
    def largest_peak(self) -> float:
        """Peak memory with every tensor in its largest layout."""
        return ShardingProblem(self.nodes).peak_memory(self.largest)[0]


class _Kind(NamedTuple):
    """What `_problem_parts` reads of a kind of node (see `GraphNode.kind`)."""

    cost: np.ndarray
    """Seconds per strategy, unweighted."""
    memory: np.ndarray
    labels: tuple[str, ...]
    most: float
    """The largest compute of a strategy."""
    largest: int
    """The strategy of the largest results."""


def _problem_parts(graph: ShardingGraph) -> _ProblemParts:
    """The problem of `graph` with no key closed (see `to_problem`). Nodes of one kind
    share their strategies: costs, memory and labels are made once per kind, and so are
    the weighted costs of nodes alike in kind and weight (arrays no solver writes to)."""
    end = max((n.last_use for n in graph.nodes), default=0) + 1
    entry = graph.module.entry
    root = entry.root
    outputs = {id(root)} | ({id(op) for op in root.operands} if root is not None else set())
    per_kind: dict[int, _Kind] = {}  # a node of no kind (-1) has its own
    kinds = []
    for n in graph.nodes:
        if n.kind not in per_kind or n.kind < 0:
            memory = np.array([n.memory(k, graph.mesh) for k in range(len(n.strategies))])
            per_kind[n.kind] = _Kind(
                np.array([s.cost for s in n.strategies]),
                memory,
                tuple(s.label for s in n.strategies),
                max(s.compute for s in n.strategies),
                int(np.argmax(memory)),
            )
        kinds.append(per_kind[n.kind])
    work = np.array([kind.most * n.weight for kind, n in zip(kinds, graph.nodes, strict=True)])
    heavy_work = HEAVY_SHARE * float(work.sum())
    latencies = node_latencies(graph)
    weighted: dict[tuple[int, float], np.ndarray] = {}
    nodes = []
    quiet = {}
    for v, (n, kind, w) in enumerate(zip(graph.nodes, kinds, work.tolist(), strict=True)):
        cost = kind.cost
        if latencies[v]:  # XLA combines these: to_plan charges them
            quiet[v] = (cost, latencies[v])
            for alpha in latencies[v].values():
                cost = cost - alpha
            cost = cost * n.weight
        elif n.kind >= 0:
            if (n.kind, n.weight) not in weighted:
                weighted[(n.kind, n.weight)] = cost * n.weight
            cost = weighted[(n.kind, n.weight)]
        else:
            cost = cost * n.weight
        opcode = n.inst.opcode.value
        held = opcode == "parameter" and n.inst.parent is entry
        live = (0 if held else n.order, end if held or id(n.inst) in outputs else n.last_use)
        heavy = opcode in HEAVY_OPCODES or (w > 0 and w >= heavy_work)
        nodes.append(ProblemNode(n.name, kind.labels, cost, kind.memory, live, heavy))
    edges: list[ProblemEdge] = []
    combined = {}
    for (u, v), m in graph.edges.items():
        if (u, v) in graph.combined:
            combined[(u, v)] = len(edges)
        edges.append(ProblemEdge(u, v, m, backward=(u, v) in graph.backward))
    largest = tuple(kind.largest for kind in kinds)
    return _ProblemParts(tuple(nodes), tuple(edges), quiet, combined, largest)


@collector_paused()
def to_problem(
    graph: ShardingGraph, budget: float | None, closed: frozenset[GroupKey] = frozenset()
) -> ShardingProblem:
    """The graph as a `ShardingProblem`: the latency of collectives XLA combines left out,
    except for the `closed` keys' (see `rhino.search.spmd.combine`). The problem with no
    key closed is made once per graph (`_problem_parts`); closing keys changes the costs
    of the nodes and edges whose combined collectives have those keys."""
    parts = _per_graph(_problem_parts, graph)
    nodes, edges = list(parts.nodes), list(parts.edges)
    if closed:
        for v, (cost, latency) in parts.quiet.items():
            if closed.isdisjoint(latency):
                continue
            for key, alpha in latency.items():
                if key not in closed:
                    cost = cost - alpha
            nodes[v] = dataclasses.replace(nodes[v], cost=cost * graph.nodes[v].weight)
        for edge, i in parts.combined.items():
            if not closed.isdisjoint(graph.combined[edge]):
                cost = _closed_edge(graph, edge, edges[i].cost, closed)
                edges[i] = dataclasses.replace(edges[i], cost=cost)
    if budget is not None and parts.largest_peak <= budget:
        # every tensor in its largest layout fits: the budget cannot bind, and without
        # it the solver's exact reductions apply everywhere
        budget = None
    return ShardingProblem(tuple(nodes), tuple(edges), budget)


def _closed_edge(
    graph: ShardingGraph, edge: tuple[int, int], matrix: np.ndarray, closed: frozenset[GroupKey]
) -> np.ndarray:
    """The edge's cost with the latency of its `closed` keys' collectives put back."""
    for key, alpha in graph.combined.get(edge, {}).items():
        if key in closed:
            matrix = matrix + alpha
    return matrix


Use = tuple[int, int, str, int]
"""How node v reads a result leaf of node u: (leaf, slot, where, operand), `slot` -1 for v's
own result (v a loop-carried value, or a parameter its updated state returns into), else
the operand v reads it as; `where` and `operand` as in PlannedReshard."""


@dataclass(frozen=True)
class _PlanParts:
    """What `to_plan` reads of a graph whatever the choice, and what it has written of
    the graph's instructions so far."""

    module_hash: str
    uses: tuple[tuple[int, int, tuple[Use, ...]], ...]
    """(u, v, how v reads u's results) for each edge where v reads some, in the order of
    `graph.edges`."""
    mesh: DeviceMesh
    instructions: dict[tuple[int, int], InstructionPlan] = field(default_factory=dict)
    """(node, strategy) -> what the plan says of it."""
    shapes: dict[Shape, str] = field(default_factory=dict)
    """Shape -> its text (a module has a few dozen distinct shapes)."""
    layouts: dict[
        tuple[int, tuple[Shape, ...]], tuple[tuple[str, ...], tuple[str | None, ...], str | None]
    ] = field(default_factory=dict)
    """(id of a strategy of the graph, the leaf shapes of a node it runs) -> the texts of
    its result layouts, operand layouts and result HloSharding (nodes of a kind share
    their strategies)."""

    def instruction(self, v: int, n: GraphNode, k: int) -> InstructionPlan:
        """What the plan says of node v (`n`) run by its strategy k."""
        found = self.instructions.get((v, k))
        if found is not None:
            return found
        s = n.strategies[k]
        shape = self.shapes.get(n.inst.shape)
        if shape is None:
            shape = self.shapes[n.inst.shape] = str(n.inst.shape)
        layouts = self.layouts.get((id(s), n.leaf_shapes))
        if layouts is None:
            layouts = self.layouts[(id(s), n.leaf_shapes)] = (
                tuple(str(o) for o in s.outs),
                tuple(None if i is None else str(i) for i in s.ins),
                _sharding_text(s.outs, n.leaf_shapes, self.mesh),
            )
        outs, ins, sharding = layouts
        found = self.instructions[(v, k)] = InstructionPlan(
            n.name, n.inst.opcode_text, shape, s.label, outs, ins, sharding, s.compute, n.weight
        )
        return found


def _plan_parts(graph: ShardingGraph) -> _PlanParts:
    """The module's fingerprint, and how each node reads its producers' results."""
    reads = [  # how each node reads its producers' results (see `Use`)
        "own" if n.carried or n.inst.opcode.value == "parameter" else "operand" for n in graph.nodes
    ]
    operands: dict[tuple[int, int], list[Use]] = defaultdict(list)
    for v, j in sorted(graph.operand_sources):  # each reader's operands in order
        if reads[v] == "operand":
            u, leaf = graph.operand_sources[(v, j)]
            operands[(u, v)].append((leaf, j, "operand", j))
    found = []
    for u, v in graph.edges:
        if reads[v] == "operand":
            if (u, v) in operands:
                found.append((u, v, tuple(operands[(u, v)])))
            continue
        nu, nv = graph.nodes[u], graph.nodes[v]
        if len(nu.leaf_shapes) != 1:
            continue
        if nv.carried:  # the loop's initial value (produced before it) or the body's result
            found.append((u, v, ((0, -1, "init" if nu.order < nv.order else "loop", 0),)))
        else:  # state returning into its parameter's layout
            found.append((u, v, ((0, -1, "state", graph.state_leaf.get(nv.name, -1)),)))
    return _PlanParts(module_hash(print_module(graph.module)), tuple(found), graph.mesh)


@collector_paused()
def to_plan(
    graph: ShardingGraph,
    problem: ShardingProblem,
    solution: Solution,
    request: PlanRequest,
    search_time: float,
) -> Plan:
    """The plan `solution` chooses: each instruction's layouts, the collectives it runs
    and those of the conversions between them (readers wanting the same conversion of one
    value share it), grouped as XLA combines them (`combine`), and what they cost. What
    does not depend on the choice is read once per graph (`_plan_parts`)."""
    mesh = graph.mesh
    parts = _per_graph(_plan_parts, graph)
    chosen = [n.strategies[k] for n, k in zip(graph.nodes, solution.choice, strict=True)]
    instructions = []
    collectives: list[PlannedCollective] = []
    compute = 0.0
    combinable: list[tuple[int, int, int | None]] = []
    """(index in `collectives`, node it happens at, the edge's producer or None) of each
    collective XLA combines with others (see `combine`)."""
    for v, (n, s) in enumerate(zip(graph.nodes, chosen, strict=True)):
        compute += s.compute * n.weight
        for c in s.comm:
            if n.quiet and c.kind in COMBINE_THRESHOLD_BYTES:
                combinable.append((len(collectives), v, None))
            collectives.append(
                PlannedCollective(
                    c.kind, c.axes, c.nbytes, c.seconds, n.name, n.weight, "in the instruction"
                )
            )
        if not n.carried:
            instructions.append(parts.instruction(v, n, solution.choice[v]))
    reshards: list[PlannedReshard] = []
    converted: set[tuple[int, int, tuple[str, ...], float]] = set()
    for u, v, uses in parts.uses:
        su, sv = chosen[u], chosen[v]
        for leaf, slot, where, operand in uses:
            src = su.outs[leaf]
            dst = sv.outs[0] if slot < 0 else sv.ins[slot] if slot < len(sv.ins) else None
            if dst is None or dst is src or dst == src:
                # read whole, or as it is: no conversion (and none to share, as a
                # conversion's path ends in a layout other than `src`)
                continue
            nu, nv = graph.nodes[u], graph.nodes[v]
            shape = nu.leaf_shapes[leaf]
            steps = reshard(shape.dims, shape.element_bytes, src, dst, mesh, graph.cluster)
            path = tuple(str(step.dst) for step in steps.collectives())
            path = path if path and path[-1] == str(dst) else (*path, str(dst))
            reshards.append(PlannedReshard(nv.name, where, operand, nu.name, leaf, path))
            if (u, leaf, path, nv.weight) in converted:
                continue  # readers wanting the same conversion of one value share it
            converted.add((u, leaf, path, nv.weight))
            combined = (u, v) in graph.combined
            for step in steps.collectives():
                if combined and step.kind in COMBINE_THRESHOLD_BYTES:
                    combinable.append((len(collectives), v, u))
                collectives.append(
                    PlannedCollective(
                        step.kind,
                        tuple(step.axes),
                        step.nbytes,
                        step.seconds,
                        nv.name,
                        nv.weight,
                        f"reshard of %{nu.name} {src} -> {dst}",
                    )
                )
    collectives, combined_latency_s = combine(graph, collectives, combinable)
    carried = {
        n.name: str(s.outs[0]) for n, s in zip(graph.nodes, chosen, strict=True) if n.carried
    }
    by_kind: dict[str, float] = defaultdict(float)
    for collective in collectives:
        by_kind[f"{collective.kind} axis {','.join(map(str, collective.axes))}"] += (
            collective.seconds * collective.count
        )
    comm = sum(by_kind.values())
    return Plan(
        module=graph.module.name,
        module_hash=parts.module_hash,
        mesh=mesh,
        cluster=graph.cluster.name,
        level=request.level,
        objective_s=compute + comm,
        compute_s=compute,
        comm_s=comm,
        comm_by_kind=dict(sorted(by_kind.items())),
        peak_memory_bytes=solution.peak_memory,
        budget_bytes=request.budget_bytes,
        solver=SolverReport(
            status=solution.status,
            objective_s=solution.objective,
            bound_s=solution.bound,
            gap=solution.gap,
            time_s=solution.solve_time_s,
            variables=solution.variables,
            constraints=solution.constraints,
        ),
        search_time_s=search_time,
        instructions=tuple(instructions),
        collectives=tuple(collectives),
        warnings=tuple(graph.warnings),
        notes=tuple(graph.notes),
        state=len(graph.state),
        problem=dict(zip(("nodes", "edges", "pairs"), problem.size, strict=True)),
        carried=carried,
        reshards=tuple(reshards),
        combined_latency_s=combined_latency_s,
    )


def _sharding_text(
    outs: tuple[ShardingSpec, ...], shapes: tuple[Shape, ...], mesh: DeviceMesh
) -> str | None:
    parts = [
        _leaf_sharding(spec, shape.rank, mesh) for spec, shape in zip(outs, shapes, strict=False)
    ]
    known = [p for p in parts if p is not None]
    if len(known) < len(parts):
        return None
    if len(known) == 1:
        return known[0]
    return "{" + ", ".join(known) + "}"


@functools.lru_cache(maxsize=4096)
def _leaf_sharding(spec: ShardingSpec, rank: int, mesh: DeviceMesh) -> str | None:
    """The HloSharding text of one leaf (None where XLA has no form for it); many leaves
    share a spec and rank."""
    try:
        return str(spec.to_hlo_sharding(mesh, rank))
    except SpecError:
        return None
