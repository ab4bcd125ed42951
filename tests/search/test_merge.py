"""O2 (rhino.search.spmd.merge) against O3 and brute force; critical nodes, cones, segments."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rhino.hlo.parser import parse_file
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.problem import ProblemEdge, ProblemNode, ShardingProblem, SolveOptions, Tuning
from rhino.search.spmd import merge
from rhino.search.spmd.builder import build_graph
from rhino.search.spmd.planner import PlanRequest, make_plan, to_problem
from rhino.search.spmd.solver import min_peak_memory, solve_brute_force, solve_ilp
from tests.hlo.corpus import ROOT
from tests.search.test_solver import random_problem
from tests.solving import TO_THE_END

EXAMPLES = ROOT / "examples"
BY_SEGMENTS = dataclasses.replace(TO_THE_END, tuning=Tuning(whole_core_pairs=0, segment_nodes=12))
"""O2 forced to level 3 (no whole-core ILP), with small segments."""


def node(name: str, k: int, rng: np.random.Generator, heavy: bool = False) -> ProblemNode:
    return ProblemNode(
        name, tuple(f"s{i}" for i in range(k)), rng.random(k).round(4), np.ones(k), (0, 0), heavy
    )


def series_parallel(seed: int, blocks: int = 24) -> ShardingProblem:
    """A training-step-like problem, series-parallel in its forward part: a chain of
    blocks (a heavy node, then two parallel branches joining again), a backward chain
    mirroring it that reads each forward block again, and per-block state nodes read
    forward and backward and written back (backward edges). The cross edges keep the
    exact reductions from solving it alone."""
    rng = np.random.default_rng(seed)
    k = 4
    nodes: list[ProblemNode] = []
    edges: list[ProblemEdge] = []

    def add(name: str, heavy: bool = False) -> int:
        nodes.append(node(name, k, rng, heavy))
        return len(nodes) - 1

    def link(u: int, v: int, backward: bool = False) -> None:
        cost = rng.random((k, k)).round(4) * float(rng.uniform(0.5, 3.0))
        np.fill_diagonal(cost, 0.0)  # staying in one layout is free, as in resharding
        edges.append(ProblemEdge(u, v, cost, backward))

    params = [add(f"param{b}") for b in range(blocks)]
    forward, lefts = [], []
    last = add("input")
    for b in range(blocks):
        dot = add(f"dot{b}", heavy=True)
        link(last, dot)
        link(params[b], dot)
        left, right = add(f"left{b}"), add(f"right{b}")
        link(dot, left)
        link(dot, right)
        last = add(f"join{b}")
        link(left, last)
        link(right, last)
        forward.append(dot)
        lefts.append(left)
    for b in reversed(range(blocks)):
        grad = add(f"grad{b}", heavy=True)
        link(last, grad)
        link(forward[b], grad)  # the saved activations
        link(lefts[b], grad)
        link(params[b], grad)  # the weight, read again
        last = grad
        update = add(f"update{b}")
        link(grad, update)
        link(params[b], update)
        link(update, params[b], backward=True)  # the updated state returns
    return ShardingProblem(tuple(nodes), tuple(edges))


def test_critical_nodes_are_the_heavy_nodes_with_no_slack() -> None:
    rng = np.random.default_rng(0)
    # 0 -> 1 -> 3, 0 -> 2 -> 3 (a diamond), and 0 -> 4 (a side branch with slack)
    nodes = (
        node("a", 2, rng),
        node("b", 2, rng, heavy=True),
        node("c", 2, rng),
        node("d", 2, rng, heavy=True),
        node("e", 2, rng, heavy=True),
    )
    z = np.zeros((2, 2))
    edges = tuple(ProblemEdge(u, v, z) for u, v in ((0, 1), (0, 2), (1, 3), (2, 3), (0, 4)))
    crit = merge.critical_nodes(ShardingProblem(nodes, edges))
    assert crit.earliest.tolist() == [0, 1, 1, 2, 1]
    assert crit.latest.tolist() == [0, 1, 1, 2, 2]
    assert crit.backbone.tolist() == [0, 1, 2, 3]
    assert crit.critical.tolist() == [1, 3]  # e is heavy but off the critical path
    assert merge.count_cones(ShardingProblem(nodes, edges)) == 3  # a (3 users), d, e (none)


def test_a_forward_edge_against_program_order_is_refused() -> None:
    rng = np.random.default_rng(0)
    nodes = (node("a", 2, rng), node("b", 2, rng))
    with pytest.raises(ValueError, match="mark it backward"):
        merge.critical_nodes(ShardingProblem(nodes, (ProblemEdge(1, 0, np.zeros((2, 2))),)))
    # marked backward, it is left out of the forward program
    backward = ShardingProblem(nodes, (ProblemEdge(1, 0, np.zeros((2, 2)), backward=True),))
    assert merge.critical_nodes(backward).earliest.tolist() == [0, 0]


@pytest.mark.parametrize("seed", range(30))
def test_o2_equals_brute_force_on_small_random_problems(seed: int) -> None:
    problem = random_problem(seed)
    o2 = merge.solve_merged(problem)
    assert o2.objective == pytest.approx(solve_brute_force(problem).objective, rel=1e-9, abs=1e-12)
    assert o2.stats.level in (1, 2)


@pytest.mark.parametrize("seed", range(3))
def test_segments_come_close_to_o3_on_series_parallel_problems(seed: int) -> None:
    problem = series_parallel(seed)
    o3 = solve_ilp(problem, TO_THE_END)
    o2 = merge.solve_merged(problem, BY_SEGMENTS)
    assert o2.stats.level == 3
    assert (o2.stats.sizes.segments or 0) > 4
    assert o2.stats.sizes.critical == 2 * 24  # every dot and grad lies on the one long path
    ratio = o2.objective / o3.objective
    print(f"series-parallel seed {seed}: O2/O3 = {ratio:.4f}")
    assert ratio >= 1 - 1e-9  # O3 is optimal here
    assert ratio <= 1.05
    assert problem.evaluate(o2.choice).objective == o2.objective
    again = merge.solve_merged(problem, BY_SEGMENTS)
    assert again.choice == o2.choice  # deterministic


def test_level_3_refines_the_plan_it_is_handed_instead_of_making_first_plans() -> None:
    """The combined-collectives search hands each plan after the first the plan it varies
    (`WarmStart.plan`): level 3 refines that one alone, and never ends above it."""
    from rhino.search.spmd.lp import WarmStart

    problem = series_parallel(0)
    fresh = merge.solve_merged(problem, BY_SEGMENTS)
    assert {"start_forward", "start_backward", "start_replicated"} <= set(fresh.stats.plan_costs)
    # the given plan: every node at its first strategy, far from refined
    given = tuple(0 for _ in problem.nodes)
    handed = merge.solve_merged(problem, BY_SEGMENTS, warm=WarmStart(plan=given))
    assert handed.stats.level == 3
    assert [k for k in handed.stats.plan_costs if k.startswith("start_")] == ["start_given"]
    assert handed.objective <= problem.evaluate(given).objective
    again = merge.solve_merged(problem, BY_SEGMENTS, warm=WarmStart(plan=fresh.choice))
    assert again.objective <= fresh.objective


@pytest.mark.parametrize("seed", range(4))
def test_going_on_from_the_plan_held_solves_no_window_again_and_plans_the_same(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its first pass, level 3 goes on from the best start's plan
    (`_SegmentSearch.restart`). Where that is the plan the search holds (one start: the
    plan handed to it), the search keeps what it knows, so a window none of whose nodes
    or neighbours changed since it was solved is not visited again: fewer windows, and
    the very plan a search that forgets gives."""
    from rhino.search.spmd.lp import WarmStart

    problem = series_parallel(seed)
    fresh = merge.solve_merged(problem, BY_SEGMENTS)
    handed = tuple(fresh.choice[:-7]) + (0,) * 7  # near the refined plan, not at it
    visits: list[int] = []
    refine = merge._SegmentSearch.refine

    def counted(self: merge._SegmentSearch, *args: object) -> int:
        before = self.tick
        passes = refine(self, *args)  # type: ignore[arg-type]
        visits.append(self.tick - before)
        return passes

    monkeypatch.setattr(merge._SegmentSearch, "refine", counted)
    kept = merge.solve_merged(problem, BY_SEGMENTS, warm=WarmStart(plan=handed))
    kept_visits = sum(visits)
    visits.clear()

    def forgetful(self: merge._SegmentSearch, choice: dict[int, int]) -> None:
        self.choice, self.seen, self.early = dict(choice), {}, {}

    monkeypatch.setattr(merge._SegmentSearch, "restart", forgetful)
    forgot = merge.solve_merged(problem, BY_SEGMENTS, warm=WarmStart(plan=handed))
    assert kept.choice == forgot.choice
    assert kept.objective == forgot.objective
    assert kept_visits < sum(visits)


def test_restart_from_another_plan_forgets_the_windows_solved() -> None:
    """A window's last answer stands only for the plan it was solved in: going on from
    another plan forgets them all, from the same plan none."""
    problem = series_parallel(0)
    search = merge._SegmentSearch(problem, merge.reduce_problem(problem), BY_SEGMENTS, {})
    segments = merge._segments(search.r, sorted(search.r.alive), merge.critical_nodes(problem), 12)
    search.start("forward", segments)
    assert search.seen
    seen = dict(search.seen)
    search.restart(dict(search.choice))
    assert search.seen == seen
    other = dict(search.choice)
    v = next(iter(other))
    other[v] = (other[v] + 1) % len(search.r.keep[v])
    search.restart(other)
    assert search.seen == {} and search.choice == other


def repeated_blocks(blocks: int) -> ShardingProblem:
    """Blocks alike to the bit (a layer's forward, backward and update, its parameter read
    again) and a hub every block's heavy node reads (a shared constant's broadcast), which
    every other block's update reads too: windows alike inside but not outside."""
    nodes: list[ProblemNode] = []
    edges: list[ProblemEdge] = []
    k = 3

    def add(name: str, rng: np.random.Generator, heavy: bool = False) -> int:
        nodes.append(node(name, k, rng, heavy))
        return len(nodes) - 1

    def link(u: int, v: int, rng: np.random.Generator, backward: bool = False) -> None:
        cost = rng.random((k, k)).round(4)
        np.fill_diagonal(cost, 0.0)
        edges.append(ProblemEdge(u, v, cost, backward))

    hub = add("hub", np.random.default_rng(99))
    last = add("input", np.random.default_rng(98))
    for b in range(blocks):
        rng = np.random.default_rng(7)  # every block the same
        param, dot = add(f"param{b}", rng), add(f"dot{b}", rng, heavy=True)
        link(last, dot, rng)
        link(param, dot, rng)
        link(hub, dot, rng)
        left, right, join = add(f"left{b}", rng), add(f"right{b}", rng), add(f"join{b}", rng)
        for u, v in ((dot, left), (dot, right), (left, join), (right, join)):
            link(u, v, rng)
        grad, update = add(f"grad{b}", rng, heavy=True), add(f"update{b}", rng)
        for u, v in ((join, grad), (dot, grad), (param, grad), (grad, update)):
            link(u, v, rng)
        if b % 2:  # windows alike inside, unlike outside
            link(hub, update, rng)
        link(param, update, rng)
        link(update, param, rng, backward=True)
        last = join
    return ShardingProblem(tuple(nodes), tuple(edges))


def test_windows_share_a_digest_exactly_when_they_are_the_same_problem() -> None:
    """A window's digest is its answer's key across windows and plans: windows alike in
    everything but node names (repeated layers) share one, and no two other windows do.
    "Alike" read off the windows themselves: their nodes' costs in the window's order,
    the edges inside by position, the edges outside by position and matrix."""
    from rhino.search.spmd.reduce import initial

    problem = repeated_blocks(12)
    reduced = initial(problem)  # the windows of the whole graph (reductions make blocks differ)
    search = merge._SegmentSearch(problem, reduced, BY_SEGMENTS, {})
    segments = merge._segments(reduced, sorted(reduced.alive), merge.critical_nodes(problem), 4)
    halves = [(s[: len(s) // 2], s[len(s) // 2 :]) for s in segments]
    listing = segments + search.coupled(segments, 1) + search.coupled(segments, 2)
    listing += [halves[i][1] + halves[i + 1][0] for i in range(len(halves) - 1)]
    windows = list({tuple(nodes): search._window(nodes) for nodes in listing}.values())

    def content(w: merge._Window) -> tuple:
        def matrix(m: np.ndarray) -> tuple:
            return (m.shape, np.round(m, 15).tobytes())

        return (
            tuple(np.round(reduced.cost[v], 15).tobytes() for v in w.nodes),
            tuple((i, j, matrix(m)) for i, j, m in w.inside),
            tuple((i, matrix(m)) for i, _, m in w.outside),
        )

    for w in windows:
        assert sorted(w.nodes) == sorted(set(w.nodes))
        assert w.around == tuple(o for _, o, _ in w.outside)
        assert not set(w.around) & set(w.nodes)
    shared = 0
    for a in range(len(windows)):
        for b in range(a + 1, len(windows)):
            same = content(windows[a]) == content(windows[b])
            assert (windows[a].digest == windows[b].digest) == same
            shared += same
    assert shared >= 10  # the repeated layers' windows were found alike


def plan(name: str, mesh: str, level: str, **kw):
    request = PlanRequest(
        parse_mesh(mesh), load_cluster("m8"), level, **{"solve": TO_THE_END, **kw}
    )
    return make_plan(parse_file(EXAMPLES / name), request)


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.hlo")))
def test_o2_equals_o3_on_the_examples(name: str) -> None:
    o3 = plan(name, "1x8", "O3")
    o2 = plan(name, "1x8", "O2")
    assert o3.solver.status.value == "optimal"
    assert o2.solver.objective_s == pytest.approx(o3.solver.objective_s, rel=1e-9)
    assert o2.solver.merge_level in (1, 2)
    assert o3.solver.merge_level == 0
    for p in (o2, o3):
        assert set(p.solver.phases_s or {}) >= {"build", "solve", "plan"}
        # one objective: what the plan reports never exceeds what the ILP optimized plus
        # the latency of the ops XLA combines collectives into, which the ILP leaves out
        # (readers wanting the same conversion of a value share it in the plan)
        assert p.objective_s <= (p.solver.objective_s + p.combined_latency_s) * (1 + 1e-9)


def test_o2_meets_a_budget_by_sharding_the_largest_parameters() -> None:
    free = plan("gpt_tiny.hlo", "1x8", "O2", budget_bytes=None)
    graph = build_graph(
        parse_file(EXAMPLES / "gpt_tiny.hlo"), parse_mesh("1x8"), load_cluster("m8")
    )
    smallest = min_peak_memory(to_problem(graph, None))[0]
    assert smallest < free.peak_memory_bytes
    budget = (smallest + free.peak_memory_bytes) / 2  # binds, and some plan fits
    tight = plan("gpt_tiny.hlo", "1x8", "O2", budget_bytes=budget)
    assert tight.peak_memory_bytes <= budget
    assert tight.objective_s >= free.objective_s * (1 - 1e-9)


def test_o2_tries_no_whole_core_ilp_whose_lp_would_run_on_the_first_order_method(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first-order LP proves nothing and its rounding is a poor start: O2 goes to
    level 3 at once where the whole core's LP has `lp_first_order_variables` or more
    columns (counted as the LP counts them, equal rows of an edge grouped)."""
    from rhino.search.spmd import lp

    base = series_parallel(3, blocks=4)
    edges = list(base.edges)
    for i in range(0, len(edges), 3):  # rows the LP groups into one
        cost = edges[i].cost.copy()
        cost[1] = cost[0]
        edges[i] = dataclasses.replace(edges[i], cost=cost)
    problem = ShardingProblem(base.nodes, tuple(edges))
    columns: list[int] = []
    run_highs = lp._run_highs
    monkeypatch.setattr(
        lp,
        "_run_highs",
        lambda cost, *a, **kw: columns.append(len(cost)) or run_highs(cost, *a, **kw),
    )
    whole: list[int] = []
    monkeypatch.setattr(merge, "solve_ilp", lambda *a, **kw: whole.append(1) or solve_ilp(*a, **kw))
    found = merge.solve_merged(problem, TO_THE_END)
    assert whole and found.stats.level == 2
    core_columns = columns[0]
    assert core_columns < sum(e.cost.size for e in problem.edges)  # some rows grouped
    for limit, tried in ((core_columns, False), (core_columns + 1, True)):
        whole.clear()
        options = dataclasses.replace(TO_THE_END, tuning=Tuning(lp_first_order_variables=limit))
        found = merge.solve_merged(problem, options)
        assert bool(whole) is tried
        assert found.stats.level == (2 if tried else 3)


def test_the_whole_core_ilp_stops_at_a_work_limit_not_only_at_the_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Level 2's ILP gets CP-SAT's deterministic work limit WHOLE_WORK besides its share
    of the time, so that the plan it hands level 3 does not depend on the machine's load;
    a tighter limit the caller set stays."""
    problem = series_parallel(3, blocks=4)
    limits: list[float | None] = []

    def whole(p: ShardingProblem, options: SolveOptions, **kw: object) -> object:
        limits.append(options.work_limit)
        return solve_ilp(p, options, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(merge, "solve_ilp", whole)
    for given, expected in ((None, merge.WHOLE_WORK), (merge.WHOLE_WORK / 4, merge.WHOLE_WORK / 4)):
        limits.clear()
        merge.solve_merged(problem, dataclasses.replace(TO_THE_END, work_limit=given))
        assert limits == [expected]


def test_one_deadline_is_shared_by_every_phase() -> None:
    options = SolveOptions(time_limit_s=5.0).started()
    assert options.deadline is not None
    assert options.started() is options  # a started search keeps its deadline
    assert 0.0 < options.left() <= 5.0
    past = SolveOptions(time_limit_s=0.0).started()
    assert past.left() == 0.0
    # out of time, both levels still return a valid plan
    problem = series_parallel(1, blocks=4)
    for solve in (solve_ilp, merge.solve_merged):
        found = solve(problem, past)
        assert problem.evaluate(found.choice).objective == found.objective


def test_o3_starts_from_o2_and_is_never_worse() -> None:
    from rhino.search.spmd.planner import solve_whole

    problem = series_parallel(2)
    o2 = merge.solve_merged(problem, BY_SEGMENTS)
    o3 = solve_whole(problem, BY_SEGMENTS)
    assert o3.objective <= o2.objective * (1 + 1e-12)
    assert o3.stats.warm_start_cost == pytest.approx(o2.objective)
    assert o3.status.value == "optimal"
