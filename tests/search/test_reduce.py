"""The exact reductions (rhino.search.spmd.reduce) keep an optimum: on trees they solve the
problem alone, and any plan of the reduced core, expanded, costs what the core says."""

from __future__ import annotations

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
