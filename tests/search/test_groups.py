"""Tied nodes merged (rhino.search.iopddl.groups): the merged problem prices and fills memory as
the nodes it stands for do, its lower bound holds, and its search keeps the limit and
its own total right, on seeded random instances with chains of ties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rhino.hlo.errors import InfeasibleError
from rhino.search import iopddl
from rhino.search.iopddl import groups, local
from tests.search.test_iopddl import brute_force, random_doc


def tied_doc(seed: int, n: int = 8) -> dict:
    """`random_doc` with every node at three strategies and a few edges made one-to-one
    (a random permutation allowed, the rest forbidden), so ties chain some nodes."""
    doc = random_doc(seed, n)
    p = doc["problem"]
    rng = np.random.default_rng(seed + 1000)
    p["nodes"]["costs"] = [[int(c) for c in rng.integers(0, 100, 3)] for _ in range(n)]
    p["nodes"]["usages"] = [[int(u) for u in rng.integers(1, 20, 3)] for _ in range(n)]
    for i in range(len(p["edges"]["nodes"])):
        c = rng.integers(0, 100, 9)
        if rng.random() < 0.4:
            allowed = np.full((3, 3), iopddl.FORBIDDEN)
            allowed[np.arange(3), rng.permutation(3)] = rng.integers(0, 100, 3)
            c = allowed.reshape(-1)
        p["edges"]["costs"][i] = [int(x) for x in c]
    small = sum(min(u) for u in p["nodes"]["usages"])
    large = sum(max(u) for u in p["nodes"]["usages"])
    p["usage_limit"] = int(small + (large - small) * rng.random())
    return doc


def every_choice(instance: iopddl.Instance, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.array([rng.integers(len(c)) for c in instance.costs]) for _ in range(count)]


@pytest.mark.parametrize("seed", range(10))
def test_merged_problem_prices_and_fills_as_its_nodes(seed: int) -> None:
    instance = iopddl.parse(tied_doc(seed))
    try:
        g = local.build(iopddl.to_problem(instance))
    except InfeasibleError:
        pytest.skip("a node has no strategy left in this draw")
    merged = groups.merge(g)
    assert sorted(np.concatenate(merged.members).tolist()) == list(range(g.size))
    rng = np.random.default_rng(seed)
    for _ in range(20):
        y = np.array([rng.integers(len(c)) for c in merged.cost])
        x = merged.expand(y)
        assert np.array_equal(merged.contract(x), y)
        assert np.allclose(merged.levels(y), local.levels(g, x))
        total, judged = merged.total(y), iopddl.check(instance, x.tolist())
        if np.isfinite(total):
            assert total == judged.cost
        else:
            assert judged.cost >= iopddl.FORBIDDEN
    for x in every_choice(instance, 20, seed):  # a plan that breaks a tie has no group plan
        y_or_none = merged.contract(x)
        if y_or_none is not None:
            assert np.array_equal(merged.expand(y_or_none), x)


@pytest.mark.parametrize("seed", range(10))
def test_merged_lower_bound_holds(seed: int) -> None:
    instance = iopddl.parse(tied_doc(seed))
    best = brute_force(instance)
    if best is None:
        pytest.skip("no plan fits this draw")
    merged = groups.merge(local.build(iopddl.to_problem(instance)))
    assert merged.lower_bound() <= best


def merged_and_start(seed: int, n: int = 12) -> tuple[iopddl.Instance, groups.Groups, np.ndarray]:
    instance = iopddl.parse(tied_doc(seed, n=n))
    try:
        g = local.build(iopddl.to_problem(instance))
        x = local.legal_start(g)
    except InfeasibleError:
        pytest.skip("no plan fits this draw")
    merged = groups.merge(g)
    y = merged.contract(x)
    if y is None:
        pytest.skip("the start breaks a tie")
    return instance, merged, y


@pytest.mark.parametrize("seed", range(10))
def test_group_search_keeps_the_limit_and_its_total(seed: int) -> None:
    instance, merged, y = merged_and_start(seed + 50)
    before = merged.total(y)
    search = groups.GroupSearch(merged, y, deadline=float("inf"), seed=seed)
    search.run()  # ends by its fruitless kicks
    after = merged.total(search.y)
    assert after <= before
    assert search.cost == pytest.approx(after)
    assert np.allclose(search.level, merged.levels(search.y))
    judged = iopddl.check(instance, merged.expand(search.y).tolist())
    assert judged.peak <= instance.limit
    assert judged.feasible or not np.isfinite(before)


@pytest.mark.parametrize("seed", range(8))
def test_tree_dp_against_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 6
    sizes = rng.integers(1, 4, n).tolist()
    nodes = [(0, -1)] + [(i, int(rng.integers(i))) for i in range(1, n)]  # parents first
    index = {a: a for a, _ in nodes}
    unary = [rng.integers(0, 50, k).astype(float) for k in sizes]
    edges = [(p, i, rng.integers(0, 50, (sizes[p], sizes[i])).astype(float)) for i, p in nodes[1:]]

    def value(choice: tuple[int, ...]) -> float:
        total = sum(float(u[k]) for u, k in zip(unary, choice, strict=True))
        return total + sum(float(m[choice[i], choice[j]]) for i, j, m in edges)

    best = min(value(c) for c in itertools.product(*(range(k) for k in sizes)))
    assert value(tuple(groups._tree_dp(nodes, index, unary, edges))) == best


@pytest.mark.parametrize("seed", range(6))
def test_tree_is_induced(seed: int) -> None:
    instance = iopddl.parse(tied_doc(seed + 200, n=14))
    try:
        g = local.build(iopddl.to_problem(instance))
    except InfeasibleError:
        pytest.skip("a node has no strategy left in this draw")
    merged = groups.merge(g)
    search = groups.GroupSearch(merged, np.zeros(merged.size, dtype=np.int64), float("inf"), seed)
    for size in (3, 6, 100):
        nodes = search.tree(size)
        parent = dict(nodes)
        assert len(nodes) <= size and nodes[0][1] == -1
        assert all(p in parent for _, p in nodes[1:])
        for a, _ in nodes:  # every edge among the members is a tree edge
            for _, b in merged.adj[a]:
                if b in parent:
                    assert parent[a] == b or parent[b] == a
