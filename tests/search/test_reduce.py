"""The exact reductions (rhino.search.spmd.reduce) keep an optimum: on trees they solve the
problem alone, and any plan of the reduced core, expanded, costs what the core says."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rhino.search.problem import ProblemEdge, ProblemNode, ShardingProblem
from rhino.search.spmd.reduce import reduce_further, reduce_problem
from rhino.search.spmd.solver import core_problem, solve_brute_force, solve_ilp
from tests.search.test_solver import random_problem


def random_tree(seed: int) -> ShardingProblem:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 8))
    nodes = [
        ProblemNode(f"n{v}", tuple(f"s{i}" for i in range(k)), rng.random(k).round(3), np.ones(k))
        for v, k in enumerate(rng.integers(1, 5, size=n))
    ]
    edges = []
    for v in range(1, n):
        u = int(rng.integers(0, v))
        edges.append(
            ProblemEdge(u, v, rng.random((len(nodes[u].labels), len(nodes[v].labels))).round(3))
        )
    return ShardingProblem(tuple(nodes), tuple(edges))


@pytest.mark.parametrize("seed", range(20))
def test_reductions_alone_solve_a_tree(seed: int) -> None:
    problem = random_tree(seed)
    reduced = reduce_problem(problem)
    assert not reduced.alive
    choice = reduced.expand({})
    assert problem.evaluate(choice).objective == pytest.approx(solve_brute_force(problem).objective)
    assert solve_ilp(problem).stats.sizes.core_nodes == 0


@pytest.mark.parametrize("seed", range(20))
def test_any_core_plan_expanded_costs_what_the_core_says(seed: int) -> None:
    problem = random_problem(100 + seed)
    reduced = reduce_problem(problem)
    rng = np.random.default_rng(seed)
    core = {v: int(rng.integers(0, len(reduced.keep[v]))) for v in reduced.alive}
    cost = reduced.offset + sum(float(reduced.cost[v][k]) for v, k in core.items())
    cost += sum(float(m[core[a], core[b]]) for (a, b), m in reduced.edges.items())
    assert problem.evaluate(reduced.expand(core)).objective == pytest.approx(cost, abs=1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_reducing_further_with_dominance_keeps_the_optimum(seed: int) -> None:
    problem = random_problem(200 + seed)
    reduced = reduce_problem(problem, dominance=False)
    before = sum(len(reduced.keep[v]) for v in reduced.alive)
    reduce_further(reduced)
    assert reduced.dominance
    assert sum(len(reduced.keep[v]) for v in reduced.alive) <= before
    # the core's own optimum, expanded, is the problem's optimum
    core = solve_brute_force(core_problem(problem, reduced))
    ids = sorted(reduced.alive)
    choice = reduced.expand({v: core.choice[i] for i, v in enumerate(ids)})
    assert problem.evaluate(choice).objective == pytest.approx(
        solve_brute_force(problem).objective, abs=1e-12
    )


@pytest.mark.parametrize("seed", range(10))
def test_without_the_dominance_test_forbidden_strategies_still_go(seed: int) -> None:
    rng = np.random.default_rng(400 + seed)
    n = 5  # a clique: no node is a leaf or a chain link
    nodes = [
        ProblemNode(f"n{v}", ("a", "b", "c"), rng.random(3).round(3), np.ones(3)) for v in range(n)
    ]
    edges = tuple(
        ProblemEdge(u, v, rng.random((3, 3)).round(3)) for u in range(n) for v in range(u + 1, n)
    )
    assert reduce_problem(ShardingProblem(tuple(nodes), edges), dominance=False).finite
    v = seed % n
    gone = nodes[v].cost.copy()
    gone[rng.permutation(3)[:2]] = np.inf  # two of v's three strategies are forbidden
    nodes[v] = dataclasses.replace(nodes[v], cost=gone)
    problem = ShardingProblem(tuple(nodes), edges)
    reduced = reduce_problem(problem, dominance=False)
    assert not reduced.finite
    assert all(np.isfinite(cost).all() for cost in reduced.cost.values())
    core = solve_brute_force(core_problem(problem, reduced))
    ids = sorted(reduced.alive)
    choice = reduced.expand({u: core.choice[i] for i, u in enumerate(ids)})
    assert np.isfinite(gone[choice[v]])
    assert problem.evaluate(choice).objective == pytest.approx(
        solve_brute_force(problem).objective, abs=1e-12
    )


@pytest.mark.parametrize("bad", [np.inf, np.nan, 1e299, None])
def test_finite_reads_each_edge_matrix_whether_tested_here_or_remembered(bad: float | None) -> None:
    """`Reduced.finite` is False where an edge matrix has an infinite, nan or too large
    value (the largest |value| `_find_inseparable` found), the first time a matrix is
    seen and when the memo of windows (`far`) remembers it."""
    from rhino.search.spmd.identity import ByArray
    from rhino.search.spmd.reduce import Matrices

    rng = np.random.default_rng(7)
    n = 5  # a clique: nothing reduces before the test
    nodes = tuple(
        ProblemNode(f"n{v}", ("a", "b", "c"), rng.random(3), np.ones(3)) for v in range(n)
    )
    matrices = [rng.random((3, 3)) for _ in range(n * (n - 1) // 2)]
    if bad is not None:
        matrices[3][1, 2] = bad
    edges = tuple(ProblemEdge(u, v, matrices.pop()) for u in range(n) for v in range(u + 1, n))
    problem = ShardingProblem(nodes, edges)
    known: Matrices = ByArray()
    for _ in range(2):  # tested, then remembered
        assert reduce_problem(problem, dominance=False, far=known).finite is (bad is None)
    assert len(known) == len(edges)


def test_edges_sharing_one_matrix_reduce_as_their_copies_do() -> None:
    """Edges that share a matrix object, either way round (as the builder makes them), are
    tested for separability once, and reduce to exactly what copies of it reduce to."""
    rng = np.random.default_rng(7)
    shared = rng.random((3, 3)).round(3)
    n = 12
    nodes = tuple(
        ProblemNode(f"n{v}", ("a", "b", "c"), rng.random(3).round(3), np.ones(3)) for v in range(n)
    )
    pairs = [
        (v, (v + step) % n) if (v + step) % 2 else ((v + step) % n, v)
        for v in range(n)
        for step in (1, 3, 5)
    ]
    together = ShardingProblem(nodes, tuple(ProblemEdge(u, v, shared) for u, v in pairs))
    apart = ShardingProblem(nodes, tuple(ProblemEdge(u, v, shared.copy()) for u, v in pairs))
    one, other = reduce_problem(together, dominance=False), reduce_problem(apart, dominance=False)
    assert one.alive == other.alive and one.alive
    assert one.edges.keys() == other.edges.keys()
    for key, m in one.edges.items():
        np.testing.assert_array_equal(m, other.edges[key])
    for v, cost in one.cost.items():
        np.testing.assert_array_equal(cost, other.cost[v])
    assert one.offset == other.offset
    assert one.inseparable.keys() == other.inseparable.keys()
