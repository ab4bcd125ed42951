"""rhino's plans through Shardy: the sdy shardings of rhino's layouts (plain Python), and
the bridge's StableHLO-with-sdy module compiled by XLA's Shardy partitioner on eight
simulated CPU devices."""

from __future__ import annotations

import numpy as np
import pytest

from rhino.hlo.analysis import replica_groups
from rhino.hlo.errors import ExecutionError
from rhino.hlo.opcode import Opcode
from rhino.hlo.parser import parse_file, parse_module
from rhino.hlo.sharding import parse_sharding
from rhino.runtime import xla_bridge as xb
from rhino.runtime.spmd.shardy import (
    MESH_NAME,
    TensorSharding,
    Translator,
    mesh_axes,
    mesh_text,
    of_hlo_sharding,
    of_spec,
)
from rhino.search.mesh import DeviceMesh, parse_mesh
from rhino.search.spmd.spec import SpecError, parse_spec
from tests.hlo.corpus import ROOT
from tests.runtime.test_xla_bridge import MEGATRON_MLP, collectives, mlp_inputs, mlp_reference

MESH = DeviceMesh((2, 4))


def sdy(*dims: tuple[str, ...]) -> TensorSharding:
    return TensorSharding(tuple(dims))


# --- layouts -> sdy shardings (no jax) ----------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "rank", "want"),
    [
        ("S0S1", 2, sdy(("axis_0",), ("axis_1",))),
        ("RS0", 2, sdy(("axis_1",), ())),
        ("S1R", 3, sdy((), ("axis_0",), ())),
        ("S0S0", 1, sdy(("axis_0", "axis_1"))),
        ("S0S0 order=1,0", 2, sdy(("axis_1", "axis_0"), ())),
        ("RR", 0, sdy()),
    ],
)
def test_a_spec_names_its_mesh_axes_per_dimension_major_first(
    spec: str, rank: int, want: TensorSharding
) -> None:
    assert of_spec(parse_spec(spec, 2), MESH, rank) == want


def test_the_text_is_the_sdy_attribute() -> None:
    got = of_spec(parse_spec("S0S0 order=1,0", 2), MESH, 2)
    assert got.text() == '<@mesh, [{"axis_1", "axis_0"}, {}]>'
    assert str(got) == '#sdy.sharding<@mesh, [{"axis_1", "axis_0"}, {}]>'
    assert mesh_text(MESH) == 'sdy.mesh @mesh = <["axis_0"=2, "axis_1"=4]>'
    assert mesh_axes(parse_mesh("1x8")) == (("axis_0", 1), ("axis_1", 8))


def test_an_axis_of_size_one_splits_nothing() -> None:
    assert of_spec(parse_spec("S0S1", 2), parse_mesh("1x8"), 2) == sdy((), ("axis_1",))


@pytest.mark.parametrize(("spec", "why"), [("S0[s=1]R", "stride"), ("PS0", "partial sums")])
def test_strides_and_partial_sums_have_no_sdy_sharding(spec: str, why: str) -> None:
    with pytest.raises(SpecError, match=why):
        of_spec(parse_spec(spec, 2), MESH, 2)


def test_an_hlo_sharding_maps_back_through_its_spec() -> None:
    # RS0 on 2x4: dim 0 in four over axis 1, replicated over axis 0
    text = "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert of_hlo_sharding(parse_sharding(text), MESH, 2) == sdy(("axis_1",), ())
    assert of_hlo_sharding(parse_sharding("{replicated}"), MESH, 3) == sdy((), (), ())


def test_the_translator_gives_one_sharding_per_value_or_a_reason() -> None:
    translate = Translator(MESH)
    assert translate("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", [(8, 4)]) == [
        '<@mesh, [{"axis_0"}, {}]>'
    ]
    assert translate("{{replicated}, {devices=[8]<=[8]}}", [(3,), (8,)]) == [
        "<@mesh, [{}]>",
        '<@mesh, [{"axis_0", "axis_1"}]>',
    ]
    assert translate("{replicated}", [(3,), (4, 4)]) == ["<@mesh, [{}]>", "<@mesh, [{}, {}]>"]
    assert "2 elements for 3 values" in translate("{{replicated}, {replicated}}", [(), (), ()])
    refused = translate("{maximal device=0}", [(4,)])
    assert isinstance(refused, str) and "no Shardy sharding on mesh 2x4" in refused


def test_the_translator_answers_a_text_again_as_it_did_the_first_time() -> None:
    translate = Translator(MESH)
    text = "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    first = translate(text, [(8, 4)])
    assert isinstance(first, list)
    first.append("changed by its caller")
    assert translate(text, [(8, 4)]) == ['<@mesh, [{"axis_0"}, {}]>']
    # what the answer depends on is the values' ranks, not their sizes
    assert translate(text, [(16, 2)]) == ['<@mesh, [{"axis_0"}, {}]>']
    wrong = translate(text, [(8, 4, 2)])  # it tiles two dims
    assert isinstance(wrong, str) and "the tensor has rank 3" in wrong


# --- the bridge: StableHLO with sdy, compiled by Shardy ---------------------------------------


def shardy(text: str, mesh: DeviceMesh = MESH) -> xb.ShardyModule:
    return xb.hlo_to_shardy(text, mesh_axes(mesh), Translator(mesh), mesh_name=MESH_NAME)


@pytest.fixture(scope="module")
def megatron() -> tuple[xb.ShardyModule, xb.Compiled]:
    module = shardy(MEGATRON_MLP)
    return module, xb.compile_shardy(module.text, xb.local_devices("cpu", 8))


def test_the_module_speaks_sdy_only(megatron: tuple[xb.ShardyModule, xb.Compiled]) -> None:
    module, _ = megatron
    text = module.text
    assert "mhlo.sharding" not in text and not module.dropped
    assert 'sdy.mesh @mesh = <["axis_0"=2, "axis_1"=4]>' in text
    assert 'sdy.sharding = #sdy.sharding<@mesh, [{}, {"axis_1"}]>' in text  # w1: column split
    assert "mhlo.num_partitions = 8" in text
    # y and the three parameters' readers: y's result is pinned by a constraint
    assert module.pins == 1 and text.count("sdy.sharding_constraint") == 1


def test_megatron_mlp_through_shardy_needs_one_all_reduce_over_mesh_rows(
    megatron: tuple[xb.ShardyModule, xb.Compiled],
) -> None:
    _, compiled = megatron
    found = collectives(compiled.partitioned_hlo())
    assert len(found) == 1 and " all-reduce(" in found[0], found
    entry = parse_module(compiled.partitioned_hlo()).entry
    (reduce,) = [i for i in entry if i.opcode is Opcode.ALL_REDUCE]
    assert replica_groups(reduce) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert 'metadata={op_name="y"}' in found[0]  # attributed to the instruction, as GSPMD
    assert [p.shard_shape for p in compiled.parameters] == [(8, 32), (32, 16), (16, 32)]
    assert compiled.partitioner == "shardy"


def test_the_shardy_program_computes_the_numpy_answer(
    megatron: tuple[xb.ShardyModule, xb.Compiled],
) -> None:
    _, compiled = megatron
    inputs = mlp_inputs()
    (y,) = xb.execute(compiled, inputs)
    np.testing.assert_allclose(y, mlp_reference(*inputs), rtol=1e-5, atol=1e-5)


# x split over both axes; `h` wants it gathered along axis 1 (dim 1 whole); `z` wants it
# split again. GSPMD honours h's sharding (an all-gather); so must the Shardy module.
RESHARD = """\
HloModule reshard

ENTRY main {
  x = f32[8,16] parameter(0), sharding={devices=[2,4]<=[8]}
  h = f32[8,16] add(x, x), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  ROOT z = f32[8,16] exponential(h), sharding={devices=[2,4]<=[8]}
}
"""


def test_an_annotated_op_keeps_its_sharding_through_shardy() -> None:
    module = shardy(RESHARD)
    compiled = xb.compile_shardy(module.text, xb.local_devices("cpu", 8))
    found = collectives(compiled.partitioned_hlo())
    assert len(found) == 1 and " all-gather(" in found[0], found
    assert 'op_name="h"' in found[0]


# RESHARD by hand in sdy, h's sharding on the add only (no constraint after it)
UNPINNED = """\
module @reshard attributes {mhlo.num_partitions = 8 : i32} {
  sdy.mesh @mesh = <["axis_0"=2, "axis_1"=4]>
  func.func @main(%x: tensor<8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"axis_0"}, {"axis_1"}]>})
      -> (tensor<8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"axis_0"}, {"axis_1"}]>}) {
    %h = stablehlo.add %x, %x {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"axis_0"}, {}]>]>} : tensor<8x16xf32>
    %z = stablehlo.exponential %h {sdy.sharding = #sdy.sharding_per_value<[<@mesh, [{"axis_0"}, {"axis_1"}]>]>} : tensor<8x16xf32>
    return %z : tensor<8x16xf32>
  }
}
"""


def test_shardy_overrides_an_ops_own_sdy_sharding_without_a_constraint() -> None:
    """The fact the pins are there for: `sdy.sharding` on an op is a starting point that
    Shardy's propagation changes, closed dimensions or not (no all-gather here)."""
    compiled = xb.compile_shardy(UNPINNED, xb.local_devices("cpu", 8))
    assert collectives(compiled.partitioned_hlo()) == []


def test_a_gspmd_sharding_constraint_becomes_an_sdy_one() -> None:
    text = RESHARD.replace(
        "  ROOT z",
        '  c = f32[8,16] custom-call(h), custom_call_target="Sharding", '
        "sharding={devices=[1,8]<=[8]}\n  ROOT z",
    ).replace("exponential(h)", "exponential(c)")
    module = shardy(text)
    assert module.constraints == 1 and "@Sharding" not in module.text
    assert '<@mesh, [{}, {"axis_0", "axis_1"}]>' in module.text
    compiled = xb.compile_shardy(module.text, xb.local_devices("cpu", 8))
    x = np.arange(128, dtype=np.float32).reshape(8, 16) / 64
    (z,) = xb.execute(compiled, [x])
    np.testing.assert_allclose(z, np.exp(2 * x), rtol=1e-6)


def test_a_sharding_with_no_sdy_form_is_dropped_and_said() -> None:
    text = RESHARD.replace(
        "sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}", "sharding={maximal device=3}"
    )
    module = shardy(text)
    assert [(d.where, d.sharding) for d in module.dropped] == [("%h", "{maximal device=3}")]
    assert "maximal" in module.dropped[0].reason
    assert "mhlo.sharding" not in module.text
    xb.compile_shardy(module.text, xb.local_devices("cpu", 8))  # still compiles


def test_a_parameter_and_a_result_with_no_sdy_form_are_dropped_and_named() -> None:
    text = RESHARD.replace(
        "parameter(0), sharding={devices=[2,4]<=[8]}", "parameter(0), sharding={maximal device=1}"
    ).replace(
        "exponential(h), sharding={devices=[2,4]<=[8]}",
        "exponential(h), sharding={maximal device=2}",
    )
    module = shardy(text)
    where = {d.sharding: d.where for d in module.dropped}
    assert where["{maximal device=1}"] == "%x"
    assert "{maximal device=2}" in where


def test_a_value_that_is_no_array_takes_no_sharding() -> None:
    text = RESHARD.replace("  ROOT z", "  t = token[] after-all(), sharding={replicated}\n  ROOT z")
    assert not shardy(text).dropped  # {replicated} says nothing of a token
    tiled = shardy(
        text.replace(
            "after-all(), sharding={replicated}", "after-all(), sharding={devices=[8]<=[8]}"
        )
    )
    assert [(d.where, d.reason) for d in tiled.dropped] == [
        ("%t", "not an array value (!stablehlo.token)")
    ]


def test_compile_shardy_refuses_gspmd_shardings() -> None:
    with pytest.raises(ExecutionError, match="mhlo.sharding"):
        xb.compile_shardy(xb.hlo_to_stablehlo(MEGATRON_MLP), xb.local_devices("cpu", 8))


def test_compile_shardy_wants_a_device_per_mesh_device(
    megatron: tuple[xb.ShardyModule, xb.Compiled],
) -> None:
    module, _ = megatron
    with pytest.raises(ExecutionError, match="mesh @mesh has 8 devices, but 4 were given"):
        xb.compile_shardy(module.text, xb.local_devices("cpu", 4))


def test_compile_shardy_rejects_text_that_is_no_module() -> None:
    with pytest.raises(xb.XlaRejected):
        xb.compile_shardy("module {", xb.local_devices("cpu", 8))


# --- a plan through Shardy: same numbers, the bytes the plan predicts ------------------------


def test_a_plan_runs_through_shardy_and_moves_what_it_predicts() -> None:
    from rhino.runtime.spmd.runner import RunOptions, run_plan
    from rhino.search.cluster import load_cluster
    from rhino.search.spmd.planner import PlanRequest, make_plan

    module = parse_file(ROOT / "tests/data/mlp_step.hlo")
    plan = make_plan(module, PlanRequest(parse_mesh("2x4"), load_cluster("m8")))
    report = run_plan(module, plan, RunOptions(steps=1, warmup=0, baseline=False))
    assert report.partitioner == "shardy"
    assert report.ok, report.verify
    fidelity = report.fidelity
    assert fidelity.predicted_bytes > 0
    assert fidelity.ok, fidelity.messages()
    assert report.to_json()["partitioner"] == "shardy"


def test_the_plans_strided_layouts_are_noted_on_the_shardy_path() -> None:
    from rhino.runtime.spmd.apply import realized_stablehlo
    from rhino.search.cluster import load_cluster
    from rhino.search.spmd.planner import PlanRequest, make_plan

    module = parse_file(ROOT / "tests/data/strided_reshape.hlo")
    pins = (("p", parse_spec("RS1")), ("out", parse_spec("RS1")))
    plan = make_plan(module, PlanRequest(parse_mesh("1x4"), load_cluster("m8"), pins=pins))
    assert plan.instruction("r").outs == ("RS0[s=1]",)
    text, notes = realized_stablehlo(module, plan)
    assert any(n.startswith("%r:") and "non-maximal stride" in n for n in notes), notes
    assert "mhlo.sharding" not in text
    compiled = xb.compile_shardy(text, xb.local_devices("cpu", 4))
    assert compiled.num_partitions == 4


def test_shardy_falls_back_to_gspmd_with_a_note() -> None:
    from rhino.runtime.spmd.runner import compile_realized

    text = RESHARD.replace(
        "sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}", "sharding={maximal device=3}"
    )
    devices = xb.local_devices("cpu", 8)
    compiled, used, notes = compile_realized(parse_module(text), MESH, devices)
    assert used == compiled.partitioner == "gspmd"
    assert notes[0].startswith("%h: sharding {maximal device=3} is not written")
    assert "compiled through GSPMD instead" in notes[-1]
    compiled, used, notes = compile_realized(parse_module(RESHARD), MESH, devices)
    assert used == compiled.partitioner == "shardy" and notes == []
    compiled, used, _ = compile_realized(parse_module(RESHARD), MESH, devices, partitioner="gspmd")
    assert used == compiled.partitioner == "gspmd"


def test_an_unknown_partitioner_is_refused() -> None:
    from rhino.hlo.errors import ConfigError
    from rhino.runtime.spmd.runner import RunOptions

    with pytest.raises(ConfigError, match="shardy, gspmd"):
        RunOptions(partitioner="auto")
