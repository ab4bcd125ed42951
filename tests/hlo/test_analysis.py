from __future__ import annotations

from rhino.hlo.analysis import (
    instruction_bytes,
    instruction_flops,
    summarize,
    topological_order,
    while_trip_count,
)
from rhino.hlo.opcode import Opcode
from rhino.hlo.parser import parse_file, parse_module
from tests.hlo.corpus import ROOT

CONV = """HloModule m

ENTRY e {
  x = f32[8,32,32,16]{3,2,1,0} parameter(0)
  w = f32[3,3,16,64]{3,2,1,0} parameter(1)
  ROOT y = f32[8,16,16,64]{3,2,1,0} convolution(x, w), window={size=3x3 stride=2x2 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
}
"""

LOOP = """HloModule m

cond {
  p = (s32[], f32[4]{0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(10)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[4]{0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  two = s32[] constant(2)
  next = s32[] add(i, two)
  x = f32[4]{0} get-tuple-element(p), index=1
  y = f32[4]{0} multiply(x, x)
  ROOT t = (s32[], f32[4]{0}) tuple(next, y)
}

ENTRY e {
  x = f32[4]{0} parameter(0)
  zero = s32[] constant(0)
  init = (s32[], f32[4]{0}) tuple(zero, x)
  w = (s32[], f32[4]{0}) while(init), condition=cond, body=body
  ROOT out = f32[4]{0} get-tuple-element(w), index=1
}
"""


def test_dot_and_convolution_flops() -> None:
    m = parse_file(ROOT / "tests" / "data" / "mlp_step.hlo")
    dot = m.entry["dot_general.5"]  # [4,16] x [16,32]
    assert instruction_flops(dot) == 2 * 4 * 32 * 16
    assert instruction_bytes(dot) == (4 * (4 * 16 + 16 * 32), 4 * 4 * 32)
    conv = parse_module(CONV).entry.root
    assert instruction_flops(conv) == 2 * (8 * 16 * 16 * 64) * (3 * 3 * 16)
    assert instruction_flops(m.entry["max.1"]) == 4 * 32
    assert instruction_flops(m.entry["x.1"]) == 0


def test_trip_count_from_the_loop_pattern_and_backend_config() -> None:
    m = parse_module(LOOP)
    w = m.entry["w"]
    assert while_trip_count(w).count == 5  # i = 0, 2, 4, 6, 8
    assert while_trip_count(w).source == "pattern"
    flops = summarize(m).total_flops
    assert flops == 5 * (4 + 1 + 1)  # per trip: multiply (4 elements), add and compare (1 each)
    w.attrs = {**w.attrs, "backend_config": '{"known_trip_count":{"n":"7"}}'}
    assert while_trip_count(w).count == 7 and while_trip_count(w).source == "backend_config"


def test_scan_gpt_has_the_flops_of_the_unrolled_gpt() -> None:
    unrolled = summarize(parse_file(ROOT / "examples" / "gpt_tiny.hlo"))
    scanned = summarize(parse_file(ROOT / "examples" / "gpt_scan_tiny.hlo"))
    assert scanned.while_loops and all(lp.trip_count == 2 for lp in scanned.while_loops)
    assert abs(scanned.total_flops - unrolled.total_flops) / unrolled.total_flops < 0.01
    assert scanned.parameter_bytes == unrolled.parameter_bytes


def test_topological_order_respects_operands() -> None:
    m = parse_file(ROOT / "examples" / "moe_tiny.hlo")
    order = topological_order(m.entry)
    seen = set()
    for inst in order:
        assert all(id(op) in seen for op in inst.operands)
        seen.add(id(inst))
    assert len(order) == len(m.entry.instructions)


def test_summary_histogram_and_largest_tensors() -> None:
    s = summarize(parse_file(ROOT / "tests" / "data" / "mlp_step.hlo"), top=2)
    assert s.instructions == 48 and s.computations == 2 and s.parameters == 4
    assert s.opcode_histogram["dot"] == 5
    assert s.parameter_bytes == 4 * (16 * 32 + 32 * 8 + 4 * 16 + 4 * 8)
    assert [t.bytes for t in s.largest_tensors] == [2048, 2048]
    assert Opcode.DOT.value in s.opcode_histogram
