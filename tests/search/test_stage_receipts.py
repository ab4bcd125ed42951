"""The stages' least receipts: below what every balanced plan receives, and the end of the
search where a start plan reaches them."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import networkx as nx

from rhino.hlo.errors import InfeasibleError
from rhino.search.pipeline.ilp import Windows, solve_stages, solve_stages_brute_force, tighten
from rhino.search.pipeline.problem import StageProblem
from rhino.search.pipeline.receipts import least_receipts
from rhino.search.problem import SolveOptions, SolveStatus
from tests.search.test_stages_ilp import random_problem, sparse_problem

OPTIONS = SolveOptions(time_limit_s=30)


def received(problem: StageProblem, plan: tuple[int, ...]) -> list[int]:
    """Bytes each stage receives under `plan` (each result once per receiving stage)."""
    got = [0] * problem.stages
    for i, s in enumerate(plan):
        for t in {plan[j] for j in problem.consumers[i]} - {s}:
            got[t] += problem.bytes[i]
    return got


def seeded(
    count: int, n: int, d: int, eps: float
) -> Iterator[tuple[int, StageProblem, Windows, tuple[int, ...]]]:
    """(seed, problem, its windows, its least receipts) for the seeded random problems
    that bound tightening leaves a stage for every instruction."""
    for seed in range(count):
        problem = (random_problem if seed % 2 else sparse_problem)(seed, n=n, d=d, eps=eps)
        try:
            windows = tighten(problem)
        except InfeasibleError:
            continue
        yield seed, problem, windows, least_receipts(problem, windows.lo, windows.hi)


def test_every_balanced_plan_receives_at_least_the_bound_on_each_stage() -> None:
    bounded = 0
    for seed, problem, _, least in seeded(60, n=7, d=3, eps=0.2):
        assert least[0] == 0
        bounded += any(least)
        for plan in itertools.product(range(problem.stages), repeat=len(problem.names)):
            try:
                problem.evaluate(plan)
            except InfeasibleError:
                continue
            got = received(problem, plan)
            assert all(g >= b for g, b in zip(got, least, strict=True)), (seed, plan, got, least)
    assert bounded >= 10  # the check is not vacuous


def chain(n: int, d: int) -> StageProblem:
    """n equal instructions in a line, each result 10 bytes."""
    return StageProblem(
        tuple(f"v{i}" for i in range(n)),
        (1.0,) * n,
        (10,) * n,
        tuple((i + 1,) if i + 1 < n else () for i in range(n)),
        d,
        0.1,
    )


def test_a_chain_needs_a_result_per_boundary_and_the_start_plan_is_proven_without_solver() -> None:
    problem = chain(12, 4)
    windows = tighten(problem)
    assert least_receipts(problem, windows.lo, windows.hi) == (0, 10, 10, 10)
    start = tuple(i // 3 for i in range(12))
    plan = solve_stages(problem, OPTIONS, hint=start)
    assert (plan.stage, plan.cut_bytes, plan.bound) == (start, 30, 30.0)
    assert plan.status is SolveStatus.OPTIMAL and plan.method == "hint"
    assert plan.stats.cpsat_s == 0.0 and plan.stats.receipt_bound == 30
    assert not plan.stats.ran_cpsat


def test_two_streams_are_cut_together_on_the_stage_that_merges_them() -> None:
    # a0 -> a1 -> a2 -> m -> m2 and b0 -> b1 -> b2 -> m: m and m2 are fixed on stage 1,
    # and each of m's operands alone is cut by 10 or 20 bytes, both together by 30
    names = ("a0", "a1", "a2", "b0", "b1", "b2", "m", "m2")
    consumers = ((1,), (2,), (6,), (4,), (5,), (6,), (7,), ())
    problem = StageProblem(names, (1.0,) * 8, (10, 10, 10, 20, 20, 20, 10, 10), consumers, 2, 0.0)
    windows = tighten(problem)
    best = solve_stages_brute_force(problem)
    assert best is not None and best[1] == 30
    assert least_receipts(problem, windows.lo, windows.hi) == (0, 30)
    plan = solve_stages(problem, OPTIONS, hint=best[0])
    assert plan.method == "hint" and plan.status is SolveStatus.OPTIMAL


def test_where_the_bound_is_below_the_optimum_the_solver_closes_the_gap() -> None:
    problem = random_problem(25, n=7, d=3, eps=0.2)
    windows = tighten(problem)
    best = solve_stages_brute_force(problem)
    assert best is not None
    assert 0 < sum(least_receipts(problem, windows.lo, windows.hi)) < best[1]
    plan = solve_stages(problem, OPTIONS)
    assert plan.status is SolveStatus.OPTIMAL and plan.cut_bytes == best[1] == plan.bound


def test_without_tightening_there_is_no_receipt_bound() -> None:
    problem = chain(12, 4)
    plan = solve_stages(problem, OPTIONS, tightening=False, hint=tuple(i // 3 for i in range(12)))
    assert plan.stats.receipt_bound == 0 and plan.stats.ran_cpsat
    assert plan.cut_bytes == 30 and plan.status is SolveStatus.OPTIMAL


def separation(
    problem: StageProblem, lo: tuple[int, ...], hi: tuple[int, ...], s: int, sink_set: set[int]
) -> int:
    """sep(s, X) of `rhino.search.pipeline.receipts`, from networkx on the whole graph."""
    graph = nx.DiGraph()
    for i in range(len(problem.names)):
        capacity = problem.bytes[i] if lo[i] < s else None  # None: unbounded
        graph.add_edge(
            ("in", i), ("out", i), **({} if capacity is None else {"capacity": capacity})
        )
        if hi[i] < s:
            graph.add_edge("source", ("in", i))
        if i in sink_set:
            graph.add_edge(("in", i), "sink")
        for j in problem.consumers[i]:
            graph.add_edge(("out", i), ("in", j))
    if "source" not in graph or "sink" not in graph:
        return 0
    return int(nx.maximum_flow_value(graph, "source", "sink"))


def oracle(problem: StageProblem, lo: tuple[int, ...], hi: tuple[int, ...], s: int) -> int:
    """least(s) of `rhino.search.pipeline.receipts` by its definition, flowing every candidate."""
    floor = problem.floor * (1 - 1e-6)
    if not any(h < s for h in hi) or floor <= 0:
        return 0
    fixed = {i for i in range(len(lo)) if lo[i] == hi[i] == s}
    together = separation(problem, lo, hi, s, fixed)
    held = sum(problem.compute[i] for i in fixed)
    if held >= floor:
        return together
    candidates = [
        j
        for j in range(len(lo))
        if lo[j] <= s <= hi[j] and j not in fixed and problem.compute[j] > 0
    ]
    for cut, j in sorted((separation(problem, lo, hi, s, fixed | {j}), j) for j in candidates):
        held += problem.compute[j]
        if held >= floor:
            return cut
    return together


def test_the_bounds_equal_flowing_every_candidate() -> None:
    """With no light share, the early stop (the bounds on t(s) meet) changes nothing."""
    compared = 0
    for seed, problem, windows, _ in seeded(40, n=12, d=4, eps=0.3):
        least = least_receipts(problem, windows.lo, windows.hi, light_share=0.0)
        expected = tuple(oracle(problem, windows.lo, windows.hi, s) for s in range(problem.stages))
        assert least == expected, seed
        compared += any(expected)
    assert compared >= 10


def test_light_candidates_that_fill_the_floor_bound_the_stage_by_the_least_cut() -> None:
    # A must be on stage 0 and F on stage 1 (8.6 of the 8.82 floor). Stage 1 may fill its
    # floor with L, which reads nothing, and take H's 1-byte result: it receives 1 byte,
    # not the 1000 of A that it would receive holding H.
    names = ("A", "H", "F", "L")
    problem = StageProblem(
        names, (9.5, 1.0, 8.6, 0.5), (1000, 1, 1, 1), ((1,), (2,), (), ()), 2, 0.1
    )
    windows = tighten(problem)
    assert (windows.lo[2], windows.hi[2]) == (1, 1)
    assert least_receipts(problem, windows.lo, windows.hi) == (0, 1)
    best = solve_stages_brute_force(problem)
    assert best == ((0, 0, 1, 1), 1)
    plan = solve_stages(problem, OPTIONS)
    assert plan.cut_bytes == 1 and plan.status is SolveStatus.OPTIMAL
