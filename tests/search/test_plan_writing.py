"""`to_problem` and `to_plan` against the versions they replaced (issue 29): those made
everything anew for each problem and plan; these make what does not depend on the closed
keys or the choice once per graph. Same problems and plans, for any closed keys and any
choice, whichever problems and plans were made of the graph before."""

from __future__ import annotations

import gc
import random
from collections import defaultdict

import numpy as np
import pytest

from rhino.hlo.jsonable import jsonable
from rhino.hlo.parser import parse_file
from rhino.hlo.printer import print_module
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.problem import ProblemEdge, ProblemNode, ShardingProblem, Solution, SolveStatus
from rhino.search.spmd import planner
from rhino.search.spmd.builder import ShardingGraph, build_graph
from rhino.search.spmd.combine import combine, node_latencies
from rhino.search.spmd.comm import COMBINE_THRESHOLD_BYTES, GroupKey
from rhino.search.spmd.plan import (
    InstructionPlan,
    PlannedCollective,
    PlannedReshard,
    module_hash,
)
from rhino.search.spmd.planner import PlanRequest, to_plan, to_problem
from rhino.search.spmd.reshard import reshard
from tests.hlo.corpus import ROOT


def reference_problem(
    graph: ShardingGraph, budget: float | None, closed: frozenset[GroupKey]
) -> ShardingProblem:
    """`to_problem` as it was: every node and edge made for each problem."""
    end = max((n.last_use for n in graph.nodes), default=0) + 1
    entry = graph.module.entry
    root = entry.root
    outputs = {id(root)} | ({id(op) for op in root.operands} if root is not None else set())
    work = np.array([max(s.compute for s in n.strategies) * n.weight for n in graph.nodes])
    heavy_work = planner.HEAVY_SHARE * float(work.sum())
    latencies = node_latencies(graph)
    nodes = []
    for v, n in enumerate(graph.nodes):
        cost = np.array([s.cost for s in n.strategies])
        memory = np.array([n.memory(k, graph.mesh) for k in range(len(n.strategies))])
        for key, alpha in latencies[v].items():
            if key not in closed:
                cost = cost - alpha
        cost = cost * n.weight
        held = n.inst.opcode.value == "parameter" and n.inst.parent is entry
        live = (0 if held else n.order, end if held or id(n.inst) in outputs else n.last_use)
        heavy = n.inst.opcode.value in planner.HEAVY_OPCODES or (
            work[v] > 0 and work[v] >= heavy_work
        )
        labels = tuple(s.label for s in n.strategies)
        nodes.append(ProblemNode(n.name, labels, cost, memory, live, bool(heavy)))
    edges = []
    for (u, v), m in graph.edges.items():
        for key, alpha in graph.combined.get((u, v), {}).items():
            if key in closed:
                m = m + alpha
        edges.append(ProblemEdge(u, v, m, backward=(u, v) in graph.backward))
    problem = ShardingProblem(tuple(nodes), tuple(edges), budget)
    if budget is not None:
        largest = [int(np.argmax(n.memory)) for n in nodes]
        if problem.peak_memory(largest)[0] <= budget:
            problem = ShardingProblem(tuple(nodes), tuple(edges), None)
    return problem


def reference_plan_parts(
    graph: ShardingGraph, choice: tuple[int, ...]
) -> tuple[list[InstructionPlan], list[PlannedCollective], list[PlannedReshard], float]:
    """What `to_plan` wrote as it was: instructions, collectives (combined), reshards,
    and the latency of the combined collectives."""
    mesh = graph.mesh
    instructions, collectives = [], []
    combinable: list[tuple[int, int, int | None]] = []
    for v, (n, k) in enumerate(zip(graph.nodes, choice, strict=True)):
        s = n.strategies[k]
        for c in s.comm:
            if n.quiet and c.kind in COMBINE_THRESHOLD_BYTES:
                combinable.append((len(collectives), v, None))
            collectives.append(
                PlannedCollective(
                    c.kind, c.axes, c.nbytes, c.seconds, n.name, n.weight, "in the instruction"
                )
            )
        if not n.carried:
            instructions.append(
                InstructionPlan(
                    n.name,
                    n.inst.opcode_text,
                    str(n.inst.shape),
                    s.label,
                    tuple(str(o) for o in s.outs),
                    tuple(None if i is None else str(i) for i in s.ins),
                    planner._sharding_text(s.outs, n.leaf_shapes, mesh),
                    s.compute,
                    n.weight,
                )
            )
    reshards = []
    converted = set()
    for u, v in graph.edges:
        nu, nv = graph.nodes[u], graph.nodes[v]
        su, sv = nu.strategies[choice[u]], nv.strategies[choice[v]]
        if nv.carried:
            where = "init" if nu.order < nv.order else "loop"
            uses = [(0, sv.outs[0], where, 0)] if len(nu.leaf_shapes) == 1 else []
        elif nv.inst.opcode.value == "parameter":
            leaf = graph.state_leaf.get(nv.name, -1)
            uses = [(0, sv.outs[0], "state", leaf)] if len(nu.leaf_shapes) == 1 else []
        else:
            uses = []
            for j, want in enumerate(sv.ins):
                src = graph.operand_sources.get((v, j))
                if want is not None and src is not None and src[0] == u:
                    uses.append((src[1], want, "operand", j))
        for leaf, dst, where, operand in uses:
            shape = nu.leaf_shapes[leaf]
            r = reshard(shape.dims, shape.element_bytes, su.outs[leaf], dst, mesh, graph.cluster)
            path = tuple(str(step.dst) for step in r.collectives())
            path = path if path and path[-1] == str(dst) else (*path, str(dst))
            if su.outs[leaf] != dst:
                reshards.append(PlannedReshard(nv.name, where, operand, nu.name, leaf, path))
            if (u, leaf, path, nv.weight) in converted:
                continue
            converted.add((u, leaf, path, nv.weight))
            for step in r.collectives():
                if (u, v) in graph.combined and step.kind in COMBINE_THRESHOLD_BYTES:
                    combinable.append((len(collectives), v, u))
                collectives.append(
                    PlannedCollective(
                        step.kind,
                        tuple(step.axes),
                        step.nbytes,
                        step.seconds,
                        nv.name,
                        nv.weight,
                        f"reshard of %{nu.name} {su.outs[leaf]} -> {dst}",
                    )
                )
    collectives, latency = combine(graph, collectives, combinable)
    return instructions, collectives, reshards, latency


def assert_same_problem(a: ShardingProblem, b: ShardingProblem) -> None:
    assert (a.budget, a.constant_memory, len(a.nodes), len(a.edges)) == (
        b.budget,
        b.constant_memory,
        len(b.nodes),
        len(b.edges),
    )
    for x, y in zip(a.nodes, b.nodes, strict=True):
        assert (x.name, x.labels, x.live, x.heavy) == (y.name, y.labels, y.live, y.heavy)
        assert np.array_equal(x.cost, y.cost) and x.cost.dtype == y.cost.dtype, x.name
        assert np.array_equal(x.memory, y.memory) and x.memory.dtype == y.memory.dtype, x.name
    for e, f in zip(a.edges, b.edges, strict=True):
        assert (e.u, e.v, e.backward) == (f.u, f.v, f.backward)
        assert np.array_equal(e.cost, f.cost), (e.u, e.v)


CASES = [("gpt_scan_tiny.hlo", "1x8"), ("gpt_tiny.hlo", "2x4"), ("mlp.hlo", "2x4")]
"""A model with loops (loop-carried values), a GPT's step (state, combined collectives of
several keys), a small MLP."""


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{m}" for f, m in CASES])
def graph(request: pytest.FixtureRequest) -> ShardingGraph:
    file, mesh = request.param
    return build_graph(parse_file(ROOT / "examples" / file), parse_mesh(mesh), load_cluster("m8"))


def keys_of(graph: ShardingGraph) -> list[GroupKey]:
    found = {k for table in node_latencies(graph) for k in table}
    return sorted(found | {k for table in graph.combined.values() for k in table})


def test_problems_are_what_they_were(graph: ShardingGraph) -> None:
    keys = keys_of(graph)
    assert keys, "a case without combined collectives tests little"
    closings = [frozenset(), *(frozenset({k}) for k in keys), frozenset(keys[::2])]
    free = reference_problem(graph, None, frozenset())
    largest = free.peak_memory([int(np.argmax(n.memory)) for n in free.nodes])[0]
    for budget in (None, 1e12, largest / 2):  # none, one that cannot bind, one that can
        for closed in closings:
            assert_same_problem(
                to_problem(graph, budget, closed), reference_problem(graph, budget, closed)
            )
    assert to_problem(graph, largest / 2).budget == largest / 2


def test_plans_are_what_they_were(graph: ShardingGraph) -> None:
    rng = random.Random(29)
    request = PlanRequest(graph.mesh, graph.cluster)
    problem = to_problem(graph, None)
    first = tuple(0 for _ in graph.nodes)
    choices = [
        first,
        *(tuple(rng.randrange(len(n.strategies)) for n in graph.nodes) for _ in range(4)),
    ]
    choices.append(first)  # written again, from what the graph's first plan kept
    converted = 0
    for choice in choices:
        solution = Solution(choice, 1.0, 0.5, SolveStatus.FEASIBLE, 0.0, 0.0)
        plan = to_plan(graph, problem, solution, request, 0.0)
        instructions, collectives, reshards, latency = reference_plan_parts(graph, choice)
        assert jsonable(plan.instructions) == jsonable(instructions)
        assert jsonable(plan.collectives) == jsonable(collectives)
        assert jsonable(plan.reshards) == jsonable(reshards)
        assert plan.combined_latency_s == latency
        assert plan.module_hash == module_hash(print_module(graph.module))
        converted += len(reshards)
    assert converted > 0, "random choices convert some tensors"


def test_what_is_kept_of_a_graph_goes_with_it() -> None:
    graph = build_graph(
        parse_file(ROOT / "examples" / "mlp.hlo"), parse_mesh("1x4"), load_cluster("m8")
    )
    to_problem(graph, None)
    key = id(graph)
    assert any(k[0] == key for k in planner._PER_GRAPH)
    del graph
    gc.collect()
    assert not any(k[0] == key for k in planner._PER_GRAPH)


def test_closing_keys_changes_only_their_nodes_and_edges() -> None:
    graph = build_graph(
        parse_file(ROOT / "examples" / "gpt_tiny.hlo"), parse_mesh("2x8"), load_cluster("m8")
    )
    latencies = node_latencies(graph)
    key = min(k for table in latencies for k in table)
    free, closed = to_problem(graph, None), to_problem(graph, None, frozenset({key}))
    changed = {
        v for v, (a, b) in enumerate(zip(free.nodes, closed.nodes, strict=True)) if a is not b
    }
    assert changed == {v for v, table in enumerate(latencies) if key in table}
    assert changed, "the key closes some node's collectives"
    for v in changed:
        assert np.all(closed.nodes[v].cost >= free.nodes[v].cost)
    by_edge = defaultdict(set)
    for (u, v), table in graph.combined.items():
        by_edge[key in table].add((u, v))
    moved = {(a.u, a.v) for a, b in zip(free.edges, closed.edges, strict=True) if a is not b}
    assert moved == by_edge[True]
