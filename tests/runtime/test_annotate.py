"""Plans written onto HLO: structure, checks, and XLA's parser accepting the result."""

from __future__ import annotations

import pytest

from rhino.hlo.errors import RhinoError
from rhino.hlo.opcode import Opcode
from rhino.hlo.parser import parse_file, parse_module
from rhino.hlo.printer import print_module
from rhino.hlo.shape import parse_shape
from rhino.hlo.sharding import HloSharding, ShardingKind, parse_sharding
from rhino.runtime import xla_bridge as xb
from rhino.runtime.spmd.annotate import AnnotationError, annotate, annotated_text, fit_sharding
from tests.hlo.corpus import ROOT

R = HloSharding.replicated()
BATCH8 = parse_sharding("{devices=[8,1]<=[8]}")

SMALL = """\
HloModule small

ENTRY main {
  x = f32[8,4] parameter(0)
  w = f32[4,2] parameter(1), sharding={devices=[1,2,4]<=[8] last_tile_dim_replicate}
  y = f32[8,2] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/dot"}
  ROOT out = (f32[8,2], f32[8,4]) tuple(y, x)
}
"""

# What annotate(SMALL, {"x": batch split, "y": batch split}) must print: w keeps its own
# sharding, the ROOT tuple takes its operands', metadata is gone.
SMALL_ANNOTATED = """\
HloModule small

ENTRY main {
  x = f32[8,4] parameter(0), sharding={devices=[8,1]<=[8]}
  w = f32[4,2] parameter(1), sharding={devices=[1,2,4]<=[8] last_tile_dim_replicate}
  y = f32[8,2] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[8,1]<=[8]}
  ROOT out = (f32[8,2], f32[8,4]) tuple(y, x), sharding={{devices=[8,1]<=[8]}, {devices=[8,1]<=[8]}}
}

"""


def test_golden_small_module() -> None:
    module = parse_module(SMALL)
    text = annotated_text(module, {"x": BATCH8, "y": BATCH8}, strip_metadata=True)
    assert text == SMALL_ANNOTATED
    xb.xla_parse(text)


def test_annotate_is_pure() -> None:
    module = parse_module(SMALL)
    before = print_module(module)
    annotate(module, {"x": BATCH8}, default=R, strip_metadata=True)
    assert print_module(module) == before


def test_parameters_and_root_always_carry_a_sharding() -> None:
    out = annotate(parse_module(SMALL), {})
    entry = out.entry
    assert entry["x"].sharding == R
    assert str(entry["w"].sharding) == "{devices=[1,2,4]<=[8] last_tile_dim_replicate}"
    assert "sharding" not in entry["y"].attrs  # no default: left to XLA's propagation
    assert entry["out"].sharding == HloSharding.tuple_([R, R])
    assert "metadata" in entry["y"].attrs


def test_default_and_override() -> None:
    s = parse_sharding("{devices=[2,4]<=[8]}")
    out = annotate(parse_module(SMALL), {"w": s}, default=BATCH8)
    entry = out.entry
    assert entry["w"].sharding == s  # the plan overrides the text
    assert entry["x"].sharding == BATCH8
    assert entry["y"].sharding == BATCH8
    assert entry["out"].sharding == HloSharding.tuple_([BATCH8, BATCH8])


def test_unknown_names_are_reported_together() -> None:
    with pytest.raises(AnnotationError, match=r"2 instruction\(s\).*%nope, %zilch") as info:
        annotate(parse_module(SMALL), {"x": R, "zilch": R, "nope": R})
    assert isinstance(info.value, RhinoError) and info.value.exit_code == 2


def test_sharding_that_does_not_fit_is_reported() -> None:
    with pytest.raises(AnnotationError, match=r"%x \(f32\[8,4\]\).*tiles 1 dims"):
        annotate(parse_module(SMALL), {"x": parse_sharding("{devices=[8]<=[8]}")})
    with pytest.raises(AnnotationError, match=r"%out .*3 elements.*2 leaves"):
        annotate(parse_module(SMALL), {"out": HloSharding.tuple_([R, R, R])})


# -- tuple shapes ----------------------------------------------------------------------


def test_tuple_shardings_are_flat_with_one_element_per_leaf() -> None:
    nested = parse_shape("((f32[8,4], f32[4]), f32[8,4], ())")
    got = fit_sharding(R, nested)
    assert got.kind is ShardingKind.TUPLE and len(got.elements) == 3
    tiled = parse_sharding("{devices=[8,1]<=[8]}")
    flat = HloSharding.tuple_([tiled, R, tiled])
    assert fit_sharding(flat, nested) == flat
    assert len(fit_sharding(R, parse_shape("()")).elements) == 1  # XLA's RequiredLeaves
    with pytest.raises(ValueError, match="tiles 2 dims"):
        fit_sharding(tiled, nested)  # f32[4] cannot take a 2-D tiling
    with pytest.raises(ValueError, match="4 elements"):
        fit_sharding(HloSharding.tuple_([tiled, R, tiled, R]), nested)
    with pytest.raises(ValueError, match="tuple sharding"):
        fit_sharding(flat, parse_shape("f32[8,4]"))


def test_xla_accepts_flat_tuple_shardings_on_nested_tuples() -> None:
    text = """\
HloModule nested

ENTRY main {
  a = f32[8,4] parameter(0)
  b = f32[4] parameter(1)
  inner = (f32[8,4], f32[4]) tuple(a, b)
  e = () tuple()
  ROOT out = ((f32[8,4], f32[4]), f32[8,4], ()) tuple(inner, a, e)
}
"""
    plan = {"a": BATCH8, "inner": HloSharding.tuple_([BATCH8, R])}
    out = annotate(parse_module(text), plan)
    assert str(out.entry["out"].sharding) == (
        "{{devices=[8,1]<=[8]}, {replicated}, {devices=[8,1]<=[8]}}"
    )
    compiled = xb.compile_spmd(print_module(out), xb.local_devices("cpu", 8), num_partitions=8)
    assert [o.sharding for o in compiled.outputs] == [str(BATCH8), "{replicated}", str(BATCH8)]


# -- while loops, called computations, metadata -----------------------------------------


@pytest.fixture(scope="module")
def gpt_scan():
    return parse_file(ROOT / "examples" / "gpt_scan_tiny.hlo")


def test_while_instructions_are_refused_and_skipped_by_default(gpt_scan) -> None:
    whiles = [i for i in gpt_scan.entry if i.opcode is Opcode.WHILE]
    assert whiles
    with pytest.raises(AnnotationError, match=f"%{whiles[0].name}: XLA rejects"):
        annotate(gpt_scan, {whiles[0].name: R})
    out = annotate(gpt_scan, {}, default=R)
    for w in whiles:
        assert "sharding" not in out.entry[w.name].attrs
    assert all("sharding" in i.attrs for i in out.entry if i.opcode is not Opcode.WHILE)


def test_instructions_inside_while_bodies_can_be_named(gpt_scan) -> None:
    body = next(i for i in gpt_scan.entry if i.opcode is Opcode.WHILE).called
    call = next(i for c in body for i in c if i.opcode is Opcode.CALL)
    out = annotate(gpt_scan, {call.name: R})
    got = out.computation(call.parent.name)[call.name].sharding
    assert got == fit_sharding(R, call.shape)
    # nothing else outside the entry was touched
    others = [i for c in out.computations if not c.is_entry for i in c if "sharding" in i.attrs]
    assert [i.name for i in others] == [call.name]


def test_strip_metadata_removes_every_metadata_attribute() -> None:
    module = parse_file(ROOT / "examples" / "mlp_optimized.hlo")
    assert any("metadata" in i.attrs for i in module.instructions())
    out = annotate(module, {}, strip_metadata=True)
    assert not any("metadata" in i.attrs for i in out.instructions())
    assert any("metadata" in i.attrs for i in annotate(module, {}).instructions())
