"""Window ops (pooling) keep a split of a dim their window does not touch, on the
operand as on the result, though the windowed dims change size."""

from __future__ import annotations

from rhino.hlo.parser import parse_module
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.spmd.builder import build_graph
from rhino.search.spmd.planner import PlanRequest, make_plan

POOL = """
HloModule pool

max {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT m = f32[] maximum(a, b)
}

ENTRY e {
  x = f32[64,32,32,16] parameter(0)
  i = f32[] constant(-inf)
  ROOT r = f32[64,16,16,16] reduce-window(x, i), window={size=1x2x2x1 stride=1x2x2x1}, to_apply=max
}
"""


def test_pooling_reads_its_operand_in_the_batch_split_it_writes() -> None:
    graph = build_graph(parse_module(POOL), parse_mesh("1x4"), load_cluster("m8"))
    node = graph.node("r")
    batch = [s for s in node.strategies if s.outs[0].split_dims() == (0,)]
    assert batch, [s.label for s in node.strategies]
    for s in batch:
        assert s.ins[0] == s.outs[0] and s.ins[1] is not None and s.ins[1].is_replicated()
    assert not any(
        1 in s.outs[0].split_dims() or 2 in s.outs[0].split_dims() for s in node.strategies
    )


def test_a_batch_split_input_pools_without_communication() -> None:
    from rhino.search.spmd.spec import parse_spec

    pins = (("x", parse_spec("RS0")), ("r", parse_spec("RS0")))
    plan = make_plan(
        parse_module(POOL), PlanRequest(parse_mesh("1x4"), load_cluster("m8"), pins=pins)
    )
    assert plan.instruction("r").ins[0] == "RS0"
    assert not plan.collectives
