"""Replayed reductions (rhino.search.spmd.replay) are, to the bit, the reductions of the
changed problem made whole; where a change would take another step, they give up."""

from __future__ import annotations

import numpy as np

from rhino.search.problem import ProblemEdge, ProblemNode, ShardingProblem
from rhino.search.spmd.merge import SearchMemo
from rhino.search.spmd.reduce import Reduced, reduce_further, reduce_problem
from rhino.search.spmd.replay import recorded, replayed
from rhino.search.spmd.solver import tie_broken


def graph(seed: int) -> ShardingProblem:
    """A sparse graph with every kind of step: leaves, chain links, a core of cycles,
    separable edges, parallel edges, nodes of one strategy and nodes with no edge."""
    rng = np.random.default_rng(seed)
    n = 40
    sizes = rng.integers(1, 5, size=n)
    nodes = tuple(
        ProblemNode(f"n{v}", tuple(map(str, range(k))), rng.random(k).round(3), rng.random(k))
        for v, k in enumerate(sizes)
    )
    pairs = [(v - 1, v) for v in range(1, n - 3)]  # a chain, the last nodes alone
    pairs += [tuple(rng.choice(n - 3, 2, replace=False)) for _ in range(20)]
    edges = []
    for u, v in pairs:
        su, sv = sizes[u], sizes[v]
        if rng.random() < 0.2:  # separable
            cost = rng.random(su)[:, None] + rng.random(sv)[None, :]
        else:
            cost = rng.random((su, sv)).round(3)
        edges.append(ProblemEdge(int(u), int(v), cost))
    return ShardingProblem(nodes, tuple(edges))


def changed(problem: ShardingProblem, seed: int, share: float = 0.1) -> ShardingProblem:
    """Some nodes' costs and some edges' matrices raised (new objects, as the planner's
    closed keys make them: a collective's latency charged to its strategies); the rest the
    same objects."""
    rng = np.random.default_rng(seed)
    nodes = tuple(
        ProblemNode(n.name, n.labels, n.cost + rng.random(len(n.cost)), n.memory)
        if rng.random() < share
        else n
        for n in problem.nodes
    )
    # a separable term: an edge separable before is still, one not separable still not
    edges = tuple(
        ProblemEdge(e.u, e.v, e.cost + rng.random((len(e.cost), 1)) + rng.random(e.cost.shape[1]))
        if rng.random() < share
        else e
        for e in problem.edges
    )
    return ShardingProblem(nodes, edges)


def same(a: Reduced, b: Reduced) -> None:
    """The two cores and their trails are the same, bit for bit."""

    def bits(x: object) -> bytes:
        return np.ascontiguousarray(x).tobytes()

    assert a.alive == b.alive
    assert a.neighbours == b.neighbours
    assert a.counts == b.counts
    assert bits(a.offset) == bits(b.offset)
    for name in ("cost", "keep", "edges"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].shape == y[k].shape and bits(x[k]) == bits(y[k]), (name, k)
    assert len(a.trail) == len(b.trail)
    for s, t in zip(a.trail, b.trail, strict=True):
        assert s[:-1] == t[:-1] if s[0] != "fixed" else s == t
        if s[0] != "fixed":
            assert bits(s[-1]) == bits(t[-1])


def test_a_replay_is_the_whole_reduction() -> None:
    replays = 0
    for seed in range(30):
        base = graph(seed)
        first, recording = recorded(base)
        assert recording is not None
        same(first, reduce_problem(tie_broken(base), dominance=False))
        for trial in range(4):
            problem = changed(base, 1000 * seed + trial)
            whole = reduce_problem(tie_broken(problem), dominance=False)
            found = replayed(recording, problem)
            if found is None:
                # a test came out otherwise: on these small random graphs, mostly a chain
                # link's new matrix (one strategy best for all) separable or no longer
                continue
            replays += 1
            same(found, whole)
            reduce_further(found)  # and it goes on as the whole one does
            reduce_further(whole)
            same(found, whole)
    assert replays >= 60  # of 120


def test_an_unchanged_problem_replays_to_its_recording() -> None:
    base = graph(7)
    first, recording = recorded(base)
    assert recording is not None
    found = replayed(recording, ShardingProblem(base.nodes, base.edges))
    assert found is not None
    same(found, first)


def test_an_edge_made_inseparable_is_not_replayed() -> None:
    rng = np.random.default_rng(0)
    nodes = tuple(ProblemNode(f"n{v}", ("a", "b"), rng.random(2), np.ones(2)) for v in range(4))
    # a clique of four (no leaf, no chain link): node 0's separable edge to node 1 is
    # folded into their costs, the others stay
    pairs = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    matrices = [np.array([[0.0, 1.0], [2.0, 3.0]])] + [rng.random((2, 2)) for _ in pairs[1:]]
    base = ShardingProblem(
        nodes, tuple(ProblemEdge(u, v, m) for (u, v), m in zip(pairs, matrices, strict=True))
    )
    first, recording = recorded(base)
    assert recording is not None and first.counts["separable"] == 1
    problem = ShardingProblem(
        nodes, (ProblemEdge(0, 1, np.array([[0.0, 1.0], [1.0, 0.0]])), *base.edges[1:])
    )
    assert replayed(recording, problem) is None
    memo = SearchMemo(record=True, recording=recording)
    same(memo.reduced(problem), reduce_problem(tie_broken(problem), dominance=False))
    # and the other way: an edge node 0 found not separable made separable
    again = ShardingProblem(
        nodes,
        (base.edges[0], ProblemEdge(0, 2, np.array([[0.0, 1.0], [2.0, 3.0]])), *base.edges[2:]),
    )
    assert replayed(recording, again) is None


def test_what_cannot_be_replayed() -> None:
    base = graph(3)
    _, recording = recorded(base)
    assert recording is not None
    assert replayed(recording, changed(base, 5, share=0.9)) is None  # most of it changed
    other = graph(4)  # another graph
    assert replayed(recording, other) is None or len(other.edges) == len(base.edges)
    budget = ShardingProblem(base.nodes, base.edges, budget=1e9)
    assert replayed(recording, budget) is None
    assert recorded(budget)[1] is None  # a budget's reductions are not recorded
    v = next(v for v, n in enumerate(base.nodes) if len(n.labels) > 1)
    node = base.nodes[v]
    forbidden = ProblemNode(node.name, node.labels, np.append(node.cost[1:], np.inf), node.memory)
    infinite = ShardingProblem(base.nodes[:v] + (forbidden,) + base.nodes[v + 1 :], base.edges)
    assert recorded(infinite)[1] is None  # nor those with a forbidden strategy
    assert replayed(recording, infinite) is None


def test_a_memo_records_only_when_asked() -> None:
    base = graph(11)
    memo = SearchMemo()
    memo.reduced(base)
    assert memo.recording is None
    memo = SearchMemo(record=True)
    first = memo.reduced(base)
    assert memo.recording is not None
    same(first, reduce_problem(tie_broken(base), dominance=False))
    problem = changed(base, 12)
    same(memo.reduced(problem), reduce_problem(tie_broken(problem), dominance=False))
