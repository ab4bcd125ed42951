"""The stage ILP against brute force, bound tightening's soundness, and the baselines."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import numpy as np
import pytest

from rhino.hlo.errors import InfeasibleError
from rhino.search.pipeline.baselines import best_split, best_split_late, equal_count, late_order
from rhino.search.pipeline.ilp import (
    closure_compute,
    solve_stages,
    solve_stages_brute_force,
    tighten,
)
from rhino.search.pipeline.problem import StageProblem
from rhino.search.pipeline.reduce import reduce_stages
from rhino.search.problem import SolveOptions, SolveStatus

OPTIONS = SolveOptions(time_limit_s=30)


def random_problem(seed: int, n: int = 8, d: int = 3, eps: float = 0.3) -> StageProblem:
    r = random.Random(seed)
    consumers = []
    for i in range(n):
        later = list(range(i + 1, n))
        consumers.append(tuple(sorted(r.sample(later, min(len(later), r.randint(0, 3))))))
    return StageProblem(
        names=tuple(f"v{i}" for i in range(n)),
        compute=tuple(float(r.randint(1, 10)) for _ in range(n)),
        bytes=tuple(r.randint(1, 100) for _ in range(n)),
        consumers=tuple(consumers),
        stages=d,
        epsilon=eps,
    )


@pytest.mark.parametrize("seed", range(30))
def test_ilp_equals_brute_force(seed: int) -> None:
    problem = random_problem(seed, d=2 + seed % 2)
    best = solve_stages_brute_force(problem)
    assert best is not None
    for tightening in (True, False):
        plan = solve_stages(problem, OPTIONS, tightening=tightening)
        assert plan.status is SolveStatus.OPTIMAL
        assert plan.cut_bytes == best[1]
        assert problem.evaluate(plan.stage).cut_bytes == plan.cut_bytes


def sparse_problem(seed: int, n: int = 9, d: int = 3, eps: float = 0.4) -> StageProblem:
    """Like `random_problem`, with most instructions computing nothing and few readers."""
    r = random.Random(seed)
    consumers = []
    for i in range(n):
        later = list(range(i + 1, n))
        consumers.append(tuple(sorted(r.sample(later, min(len(later), r.choice([1, 1, 1, 2, 3]))))))
    compute = [float(r.choice([0, 0, 1, 3, 5])) for _ in range(n)]
    compute[-1] = compute[-1] or 1.0
    return StageProblem(
        tuple(f"v{i}" for i in range(n)),
        tuple(compute),
        tuple(r.randint(1, 100) for _ in range(n)),
        tuple(consumers),
        d,
        eps,
    )


@pytest.mark.parametrize("seed", range(40))
def test_reduction_keeps_the_optimum_and_expands_to_equal_cut(seed: int) -> None:
    problem = sparse_problem(seed)
    reduction = reduce_stages(problem)
    assert len(reduction.problem.names) <= len(problem.names)
    best, reduced_best = (
        solve_stages_brute_force(problem),
        solve_stages_brute_force(reduction.problem),
    )
    assert (best is None) == (reduced_best is None)
    if best is not None and reduced_best is not None:
        assert reduced_best[1] == best[1]
        assert problem.evaluate(reduction.expand(reduced_best[0])).cut_bytes == best[1]
        assert solve_stages(problem, OPTIONS).cut_bytes == best[1]


def test_reduction_folds_a_zero_compute_chain() -> None:
    # w (a weight, no compute) -> t (a transpose, no compute) -> dot -> loss
    problem = StageProblem(
        ("w", "t", "dot", "loss"),
        (0.0, 0.0, 4.0, 1.0),
        (16, 16, 8, 4),
        ((1,), (2,), (3,), ()),
        2,
        1.0,
    )
    reduction = reduce_stages(problem)
    assert reduction.problem.names == ("dot", "loss")
    assert reduction.node_of == (0, 0, 0, 1)


@pytest.mark.parametrize("seed", range(30))
def test_tightened_windows_hold_every_balanced_plan(seed: int) -> None:
    problem = random_problem(seed, n=7, d=3, eps=0.4)
    windows = tighten(problem)
    for plan in itertools.product(range(problem.stages), repeat=len(problem.names)):
        try:
            problem.evaluate(plan)
        except InfeasibleError:
            continue
        for i, s in enumerate(plan):
            assert windows.lo[i] <= s <= windows.hi[i]


@pytest.mark.parametrize("seed", range(20))
def test_closure_sums_are_the_ancestors_and_descendants_compute(seed: int) -> None:
    r = random.Random(seed)
    n = 60
    consumers = [
        sorted(r.sample(range(i + 1, n), min(n - i - 1, r.choice([0, 1, 1, 2, 4]))))
        for i in range(n)
    ]
    compute = np.array([r.choice([0.0, 0.5, 1.0, 3.0]) for _ in range(n)])
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((i, j) for i in range(n) for j in consumers[i])
    operands = [list(graph.predecessors(v)) for v in range(n)]
    ancestors = closure_compute(operands, range(n), compute)
    descendants = closure_compute(consumers, range(n - 1, -1, -1), compute)
    for v in range(n):
        assert ancestors[v] == pytest.approx(sum(compute[a] for a in nx.ancestors(graph, v)))
        assert descendants[v] == pytest.approx(sum(compute[a] for a in nx.descendants(graph, v)))


def test_bytes_are_counted_once_per_receiving_stage() -> None:
    # a -> b, a -> c with b, c on stage 1: a's 100 bytes are sent once; d on stage 2 again
    problem = StageProblem(
        ("a", "b", "c", "d"),
        (1.0, 1.0, 1.0, 1.0),
        (100, 1, 1, 1),
        ((1, 2, 3), (), (3,), ()),
        3,
        2.0,
    )
    assert problem.evaluate((0, 1, 1, 2)).cut_bytes == 100 + 100 + 1
    assert problem.evaluate((0, 1, 1, 1)).cut_bytes == 100


def test_evaluate_refuses_a_backward_edge_and_an_unbalanced_stage() -> None:
    problem = StageProblem(("a", "b"), (1.0, 1.0), (8, 8), ((1,), ()), 2, 0.0)
    with pytest.raises(InfeasibleError, match="reads %a from the later stage 1"):
        problem.evaluate((1, 0))
    with pytest.raises(InfeasibleError, match=r"stage 0 computes .* > .*\(1 \+ epsilon 0"):
        problem.evaluate((0, 0))
    assert problem.measure((0, 0)).imbalance == pytest.approx(1.0)
    assert problem.evaluate((0, 1)).cut_bytes == 8


def test_a_nearly_empty_stage_is_below_the_floor() -> None:
    # a chain of 3 units over 3 stages, epsilon 0.5: a stage holds 0.5 to 1.5 units; the
    # only split under the cap leaves 0.4 on the last stage
    problem = StageProblem(
        ("a", "b", "c", "d"), (0.8, 0.6, 1.2, 0.4), (8, 8, 8, 8), ((1,), (2,), (3,), ()), 3, 0.5
    )
    with pytest.raises(InfeasibleError, match=r"stage 2 computes .* < .*\(1 - epsilon 0.5"):
        problem.evaluate((0, 0, 1, 2))
    assert problem.measure((0, 0, 1, 2)).imbalance == pytest.approx(0.6)
    assert solve_stages_brute_force(problem) is None
    with pytest.raises(InfeasibleError, match="no 3-stage plan"):
        solve_stages(problem, OPTIONS)
    assert best_split(problem).stage is None


def test_an_instruction_larger_than_a_stage_is_refused_with_numbers() -> None:
    problem = StageProblem(("a", "b", "c"), (8.0, 1.0, 1.0), (1, 1, 1), ((1,), (2,), ()), 2, 0.1)
    with pytest.raises(
        InfeasibleError, match=r"%a alone is 80.0% of the compute \(raise `epsilon`"
    ):
        solve_stages(problem, OPTIONS)


def test_a_balanced_hint_is_kept_when_it_is_optimal() -> None:
    problem = random_problem(3)
    best = solve_stages_brute_force(problem)
    assert best is not None
    plan = solve_stages(problem, OPTIONS, hint=best[0])
    assert plan.cut_bytes == best[1]


def best_range_split(problem: StageProblem, order: list[int]) -> float | None:
    """Brute force: the fewest cut bytes of any balanced split of `order` into consecutive
    ranges, one per stage (None when no split is balanced)."""
    n, best = len(order), None
    for cuts in itertools.combinations(range(1, n), problem.stages - 1):
        plan = [0] * n
        for k, v in enumerate(order):
            plan[v] = sum(k >= c for c in cuts)
        try:
            cut = problem.evaluate(plan).cut_bytes
        except InfeasibleError:
            continue
        best = cut if best is None else min(best, cut)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_best_split_is_the_best_balanced_split_of_the_order(seed: int) -> None:
    problem = random_problem(seed, n=9, d=3, eps=0.5)
    best = best_range_split(problem, list(range(len(problem.names))))
    found = best_split(problem)
    assert (found.evaluation.cut_bytes if found.stage and found.evaluation else None) == best
    if best is not None:
        assert found.within
        ilp = solve_stages(problem, OPTIONS)
        assert ilp.cut_bytes <= best  # ranges of one order are among the ILP's plans


@pytest.mark.parametrize("seed", range(10))
def test_late_order_is_topological_and_its_dp_beats_no_split_of_it(seed: int) -> None:
    problem = random_problem(seed, n=9, d=3, eps=0.5)
    order = late_order(problem)
    position = {v: k for k, v in enumerate(order)}
    assert sorted(order) == list(range(9))
    assert all(position[j] > position[i] for i, cs in enumerate(problem.consumers) for j in cs)
    best = best_range_split(problem, order)
    found = best_split_late(problem)
    assert (found.evaluation.cut_bytes if found.stage and found.evaluation else None) == best


def test_late_order_moves_a_side_branch_down_to_its_reader() -> None:
    # v0 (a side input, first in the program) is read only by v3, at the end of a chain:
    # it moves after x, to the level of y (the other operand of its reader)
    problem = StageProblem(
        ("side", "x", "y", "loss"),
        (0.0, 1.0, 1.0, 1.0),
        (1, 1, 1, 1),
        ((3,), (2,), (3,), ()),
        2,
        1.0,
    )
    assert late_order(problem) == (1, 0, 2, 3)


def test_equal_count_splits_the_order_evenly() -> None:
    problem = random_problem(1, n=10, d=4)
    found = equal_count(problem)
    assert found.stage is not None
    sizes = [found.stage.count(s) for s in range(4)]
    assert max(sizes) - min(sizes) <= 1
    assert list(found.stage) == sorted(found.stage)
