"""Message passing on the group problem (rhino.search.iopddl.trws): exact on trees (seeded
random chains against brute force), a joint move single moves cannot make, and its plan
costed as the groups cost it."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest

from rhino.search.iopddl import groups, local, trws
from rhino.search.problem import ProblemEdge, ProblemNode, ShardingProblem


def merged(costs: list[list[float]], edges: list[tuple[int, int, np.ndarray]]) -> groups.Groups:
    nodes = tuple(
        ProblemNode(
            str(v), tuple(map(str, range(len(c)))), np.array(c, dtype=np.float64), np.zeros(len(c))
        )
        for v, c in enumerate(costs)
    )
    problem = ShardingProblem(nodes, tuple(ProblemEdge(u, v, m) for u, v, m in edges))
    return dataclasses.replace(groups.merge(local.build(problem)), limit=math.inf)


def brute_force(gr: groups.Groups) -> float:
    return min(gr.total(np.array(y)) for y in itertools.product(*(range(len(c)) for c in gr.cost)))


@pytest.mark.parametrize("seed", range(8))
def test_passing_is_exact_on_a_chain(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 6
    sizes = rng.integers(2, 4, n)
    costs = [rng.integers(0, 50, k).astype(float).tolist() for k in sizes]
    edges = [
        (v, v + 1, rng.integers(0, 50, (sizes[v], sizes[v + 1])).astype(float))
        for v in range(n - 1)
    ]
    edges[0][2][0, 0] = np.inf  # a forbidden pair
    gr = merged(costs, edges)
    passing = trws.MessagePassing(gr, np.zeros(gr.size, dtype=np.int64))
    y = passing.run(float("inf"), most=20)
    assert passing.cost == gr.total(y)
    assert gr.total(y) == brute_force(gr)


def test_passing_makes_a_joint_move_single_moves_cannot() -> None:
    # three nodes that pay 10 for each neighbour on another strategy; strategy 1 saves 1
    # each: from all at 0, moving one or two costs more than it saves
    apart = np.array([[0.0, 10.0], [10.0, 0.0]])
    gr = merged([[1.0, 0.0]] * 3, [(0, 1, apart), (1, 2, apart)])
    start = np.zeros(gr.size, dtype=np.int64)
    descent = groups.GroupSearch(gr, start, float("inf"))
    descent.descend()
    assert descent.cost == 3.0
    passing = trws.MessagePassing(gr, start)
    y = passing.run(float("inf"), most=4)
    assert gr.total(y) == 0.0
    assert y.tolist() == [1, 1, 1]


@pytest.mark.parametrize("seed", range(4))
def test_reprice_costs_the_best_plan_again(seed: int) -> None:
    rng = np.random.default_rng(seed)
    costs = [rng.integers(0, 50, 3).astype(float).tolist() for _ in range(5)]
    edges = [
        (u, v, rng.integers(0, 50, (3, 3)).astype(float))
        for u, v in [(0, 1), (1, 2), (2, 0), (3, 4)]
    ]
    gr = merged(costs, edges)
    passing = trws.MessagePassing(gr, np.zeros(gr.size, dtype=np.int64))
    passing.run(float("inf"), most=6)
    assert gr.total(passing.y) <= gr.total(np.zeros(gr.size, dtype=np.int64))
    dearer = [c + rng.integers(0, 50, len(c)) for c in gr.cost]
    passing.reprice(dearer)
    assert passing.cost == dataclasses.replace(gr, cost=dearer).total(passing.y)
