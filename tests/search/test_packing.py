"""Arrays packed for another process (`rhino.search.packing`), and the sharding problem
pickled through them (what the combined-collectives search sends each worker)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from rhino.search.packing import pack, unpack
from rhino.search.problem import ProblemEdge, ProblemNode, ShardingProblem


def test_arrays_come_back_equal_in_dtype_shape_and_sharing() -> None:
    rng = np.random.default_rng(0)
    shared = rng.normal(size=(3, 4))
    given = [
        shared,
        rng.integers(0, 9, size=5),  # another dtype: another buffer
        shared,  # the same object again: sent once
        np.asfortranarray(rng.normal(size=(2, 3))),
        rng.normal(size=(4, 3)).T,  # a view that is not contiguous
        np.zeros((0, 2)),
        np.float32([1.5, 2.5]),
    ]
    packed, at = pack(given)
    assert len(packed.shapes) == 6 and len(packed.buffers) == 3
    arrays = unpack(packed)
    back = [arrays[i] for i in at.tolist()]
    for a, b in zip(given, back, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    assert back[0] is back[2] and back[0] is not back[3]


def _problem(seed: int, edges: bool, budget: float | None) -> ShardingProblem:
    rng = np.random.default_rng(seed)
    labels = ("R", "S0", "S1")
    cost = rng.normal(size=3)  # shared by some nodes, as nodes of one kind share theirs
    nodes = []
    for v in range(12):
        k = int(rng.integers(1, 4))
        own = cost if k == 3 and v % 2 else rng.normal(size=k)
        memory = rng.integers(0, 1 << 30, size=k).astype(np.float64)
        live = (int(rng.integers(0, 5)), int(rng.integers(5, 10)))
        nodes.append(ProblemNode(f"n{v}", labels[:k], own, memory, live, bool(v % 3 == 0)))
    found = []
    for i in range(20 if edges else 0):
        u, v = (int(x) for x in rng.choice(12, size=2, replace=False))
        shape = (len(nodes[u].labels), len(nodes[v].labels))
        matrix = rng.normal(size=shape)
        matrix[0, -1] = np.inf  # a forbidden pair
        found.append(ProblemEdge(u, v, matrix if i % 4 else np.asfortranarray(matrix), i % 5 == 0))
    return ShardingProblem(tuple(nodes), tuple(found), budget, float(rng.integers(0, 100)))


@pytest.mark.parametrize(
    ("seed", "edges", "budget"), [(0, True, None), (1, True, 3e12), (2, False, None)]
)
def test_a_problem_pickled_is_the_same_problem(
    seed: int, edges: bool, budget: float | None
) -> None:
    problem = _problem(seed, edges, budget)
    back = pickle.loads(pickle.dumps(problem))
    assert (back.budget, back.constant_memory) == (problem.budget, problem.constant_memory)
    assert len(back.nodes) == len(problem.nodes) and len(back.edges) == len(problem.edges)
    for a, b in zip(problem.nodes, back.nodes, strict=True):
        assert (a.name, a.labels, a.live, a.heavy) == (b.name, b.labels, b.live, b.heavy)
        assert all(type(x) is int for x in b.live) and type(b.heavy) is bool
        assert np.array_equal(a.cost, b.cost) and np.array_equal(a.memory, b.memory)
    for a, b in zip(problem.edges, back.edges, strict=True):
        assert (a.u, a.v, a.backward) == (b.u, b.v, b.backward) and type(b.backward) is bool
        assert np.array_equal(a.cost, b.cost)
    # what was one object is one object again (nodes of a kind share their costs)
    ids = [id(n.cost) for n in problem.nodes]
    back_ids = [id(n.cost) for n in back.nodes]
    assert [ids.index(i) for i in ids] == [back_ids.index(i) for i in back_ids]
    choice = [len(n.labels) - 1 for n in problem.nodes]
    assert back.evaluate(choice) == problem.evaluate(choice)
