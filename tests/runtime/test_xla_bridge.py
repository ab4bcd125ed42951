"""The jaxlib bridge on eight simulated CPU devices (tests/conftest.py sets them up)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from rhino.hlo.analysis import replica_groups
from rhino.hlo.errors import ExecutionError, RhinoError
from rhino.hlo.opcode import Opcode
from rhino.hlo.parser import parse_module
from rhino.runtime import xla_bridge as xb

# x split on batch over mesh axis a (size 2), W1 column-split and W2 row-split over axis b
# (size 4) of a 2x4 mesh, device d = 4*a + b. Tile assignments, written by hand:
#   x, y: [2,1,4]<=[8] last_tile_dim_replicate  -> batch half a on devices 4a..4a+3
#   W1:   [1,4,2]<=[2,4]T(1,0) ...              -> column quarter b on devices b, 4+b
#   W2:   [4,1,2]<=[2,4]T(1,0) ...              -> row quarter b on devices b, 4+b
MEGATRON_MLP = """\
HloModule megatron_mlp

ENTRY main {
  x = f32[16,32] parameter(0), sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
  w1 = f32[32,64] parameter(1), sharding={devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  w2 = f32[64,32] parameter(2), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  h = f32[16,64] dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  zero = f32[] constant(0)
  zeros = f32[16,64] broadcast(zero), dimensions={}
  relu = f32[16,64] maximum(h, zeros)
  ROOT y = f32[16,32] dot(relu, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}
}
"""

REDUCE = """\
HloModule reduce_rows

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  p = f32[4,6] parameter(0)
  q = f32[6] parameter(1)
  zero = f32[] constant(0)
  r = f32[6] reduce(p, zero), dimensions={0}, to_apply=add
  t = f32[6] multiply(r, q)
  ROOT out = (f32[6], f32[4,6]) tuple(t, p)
}
"""

# The opcode follows the (possibly tuple) shape; operands are %-prefixed, so never match.
COLLECTIVE = re.compile(
    r"\s(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\("
)


def collectives(hlo_text: str) -> list[str]:
    return [line.strip() for line in hlo_text.splitlines() if COLLECTIVE.search(line)]


def mlp_inputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal(shape).astype(np.float32) for shape in [(16, 32), (32, 64), (64, 32)]
    ]


def mlp_reference(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    return np.maximum(x @ w1, 0) @ w2


@pytest.fixture(scope="module")
def mlp() -> xb.Compiled:
    return xb.compile_spmd(MEGATRON_MLP, xb.local_devices("cpu", 8), num_partitions=8)


# --- parsing and conversion -----------------------------------------------------------


def test_xla_parse_counts_instructions_per_computation() -> None:
    info = xb.xla_parse(REDUCE)
    assert info.name == "reduce_rows"
    assert info.entry == "main"
    assert dict(info.computation_sizes) == {"add": 3, "main": 6}
    assert info.instruction_count == 9
    assert "ENTRY %main" in info.text


def test_xla_parse_rejects_bad_text_with_xla_position() -> None:
    bad = "HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT a = f32[4] addd(p, p)\n}\n"
    with pytest.raises(xb.XlaRejected) as caught:
        xb.xla_parse(bad)
    assert (caught.value.line, caught.value.col) == (4, 19)
    assert "Unknown opcode: addd" in caught.value.xla_message
    assert isinstance(caught.value, RhinoError)


def test_hlo_to_stablehlo_keeps_shardings() -> None:
    text = xb.hlo_to_stablehlo(MEGATRON_MLP)
    assert "func.func @main" in text
    assert text.count("stablehlo.dot") == 2
    assert 'mhlo.sharding = "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"' in text


def test_hlo_to_stablehlo_can_keep_instruction_names() -> None:
    assert 'loc("relu")' not in xb.hlo_to_stablehlo(MEGATRON_MLP)
    assert 'loc("relu")' in xb.hlo_to_stablehlo(MEGATRON_MLP, locations=True)


def test_hlo_to_stablehlo_catches_shape_errors_the_parser_lets_through() -> None:
    bad = "HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT a = f32[5] add(p, p)\n}\n"
    assert xb.xla_parse(bad).instruction_count == 2  # XLA's parser does not check shapes
    with pytest.raises(xb.XlaRejected, match="same shape"):
        xb.hlo_to_stablehlo(bad)


# --- devices --------------------------------------------------------------------------


def test_local_devices_too_few() -> None:
    with pytest.raises(ExecutionError, match=r"need 16 devices, have 8 on cpu"):
        xb.local_devices("cpu", 16)


def test_local_devices_unknown_platform() -> None:
    with pytest.raises(ExecutionError, match="no gpu platform"):
        xb.local_devices("gpu", 1)


# --- single device --------------------------------------------------------------------


def test_single_device_program_matches_numpy() -> None:
    compiled = xb.compile_spmd(REDUCE, xb.local_devices("cpu", 1), num_partitions=1)
    assert [o.shape for o in compiled.outputs] == [(6,), (4, 6)]
    assert all(o.sharding == "{replicated}" for o in compiled.outputs)
    p = np.arange(24, dtype=np.float32).reshape(4, 6)
    q = np.linspace(-1, 1, 6, dtype=np.float32)
    t, echoed = xb.execute(compiled, [p, q])
    np.testing.assert_allclose(t, p.sum(axis=0) * q, rtol=1e-6)
    np.testing.assert_array_equal(echoed, p)


def test_a_reference_is_compiled_once_per_text_and_device() -> None:
    one, two = xb.local_devices("cpu", 2)
    first = xb.compile_reference(REDUCE, one)
    assert xb.compile_reference(REDUCE, one) is first  # the same text again: not compiled
    p = np.arange(24, dtype=np.float32).reshape(4, 6)
    q = np.linspace(-1, 1, 6, dtype=np.float32)
    for _ in range(2):  # the program held runs again
        t, _echoed = xb.execute(first, [p, q])
        np.testing.assert_allclose(t, p.sum(axis=0) * q, rtol=1e-6)
    elsewhere = xb.compile_reference(REDUCE, two)
    assert elsewhere is not first and elsewhere.devices == (two,)
    assert xb.compile_reference(REDUCE, one) is not first  # one program is held at a time
    other = REDUCE.replace("reduce_rows", "reduce_rows_again")
    assert xb.compile_reference(other, one).name == "reduce_rows_again"


# --- the Megatron MLP on a 2x4 mesh ---------------------------------------------------


def test_megatron_mlp_needs_exactly_one_all_reduce_over_mesh_rows(mlp: xb.Compiled) -> None:
    found = collectives(mlp.partitioned_hlo())
    assert len(found) == 1, found
    assert " all-reduce(" in found[0]
    # jaxlib 0.10 prints the groups listed, newer ones as an iota (`[2,4]<=[8]`)
    entry = parse_module(mlp.partitioned_hlo()).entry
    (reduce,) = [i for i in entry if i.opcode is Opcode.ALL_REDUCE]
    assert replica_groups(reduce) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert found[0].startswith("ROOT %all-reduce = f32[8,32]")
    assert 'metadata={op_name="y"}' in found[0]  # attributed to the original instruction


def test_megatron_mlp_reports_shardings_and_shard_shapes(mlp: xb.Compiled) -> None:
    assert [p.shard_shape for p in mlp.parameters] == [(8, 32), (32, 16), (16, 32)]
    assert mlp.parameters[1].sharding == "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert mlp.outputs[0].shape == (16, 32)
    assert mlp.outputs[0].sharding == "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"


def test_megatron_mlp_memory_stats_are_per_device(mlp: xb.Compiled) -> None:
    stats = mlp.memory_stats()
    assert stats.argument_bytes == 4 * (8 * 32 + 32 * 16 + 16 * 32)
    assert stats.output_bytes == 4 * 8 * 32


def test_sharded_execution_matches_numpy(mlp: xb.Compiled) -> None:
    inputs = mlp_inputs()
    (y,) = xb.execute(mlp, inputs)
    np.testing.assert_allclose(y, mlp_reference(*inputs), rtol=1e-4, atol=1e-4)


def test_inputs_as_shards_or_shard_functions(mlp: xb.Compiled) -> None:
    x, w1, w2 = mlp_inputs(seed=1)
    # x by hand: partition p = 4a + b holds batch rows 8a..8a+7.
    x_shards = xb.DeviceShards({p: x[8 * (p // 4) : 8 * (p // 4) + 8] for p in range(8)})
    asked: list[tuple[slice, ...]] = []

    def w1_shard(index: tuple[slice, ...]) -> np.ndarray:
        asked.append(index)
        return w1[index]

    (y,) = xb.execute(mlp, [x_shards, w1_shard, w2])
    np.testing.assert_allclose(y, mlp_reference(x, w1, w2), rtol=1e-4, atol=1e-4)
    assert len(asked) == 8
    assert {(s.start, s.stop) for _, s in asked} == {(0, 16), (16, 32), (32, 48), (48, 64)}


def test_execute_shards_gives_each_partition_its_piece(mlp: xb.Compiled) -> None:
    inputs = mlp_inputs(seed=2)
    (shards,) = xb.execute_shards(mlp, inputs)
    reference = mlp_reference(*inputs)
    assert [s.partition for s in shards] == list(range(8))
    for shard in shards:
        assert shard.index[0] == slice(8 * (shard.partition // 4), 8 * (shard.partition // 4) + 8)
        np.testing.assert_allclose(shard.data, reference[shard.index], rtol=1e-4, atol=1e-4)


def test_wrong_input_is_refused_before_running(mlp: xb.Compiled) -> None:
    x, w1, w2 = mlp_inputs()
    with pytest.raises(
        ExecutionError, match=r"input 0 is float32\[8, 32\], expected float32\[16, 32\]"
    ):
        xb.execute(mlp, [x[:8], w1, w2])
    with pytest.raises(ExecutionError, match=r"input 2 is float64"):
        xb.execute(mlp, [x, w1, w2.astype(np.float64)])
    with pytest.raises(ExecutionError, match="takes 3 inputs, got 2"):
        xb.execute(mlp, [x, w1])
    with pytest.raises(ExecutionError, match=r"shards for partitions \[0\], expected"):
        xb.execute(mlp, [xb.DeviceShards({0: x[:8]}), w1, w2])


def test_time_execution_returns_one_time_per_step(mlp: xb.Compiled) -> None:
    times = xb.time_execution(mlp, mlp_inputs(), warmup=1, steps=3)
    assert len(times) == 3
    assert all(t > 0 for t in times)


# --- compile failures -----------------------------------------------------------------


def test_compile_error_carries_xla_message() -> None:
    bad = MEGATRON_MLP.replace("devices=[2,1,4]<=[8]", "devices=[4,1,4]<=[16]", 1)
    with pytest.raises(ExecutionError, match="tile_assignment should have 8 devices but has 16"):
        xb.compile_spmd(bad, xb.local_devices("cpu", 8), num_partitions=8)


def test_compile_of_unparsable_text_is_rejected() -> None:
    with pytest.raises(xb.XlaRejected):
        xb.compile_spmd("HloModule m\nENTRY e {\n}\n", xb.local_devices("cpu", 1), num_partitions=1)


def test_partition_count_must_match_devices() -> None:
    with pytest.raises(ExecutionError, match="num_partitions=8 but 4 devices"):
        xb.compile_spmd(MEGATRON_MLP, xb.local_devices("cpu", 4), num_partitions=8)


def test_uneven_shards_are_refused() -> None:
    uneven = """\
HloModule uneven

ENTRY main {
  p = f32[10] parameter(0), sharding={devices=[4]<=[4]}
  ROOT n = f32[10] negate(p), sharding={devices=[4]<=[4]}
}
"""
    with pytest.raises(ExecutionError, match="divide every dimension evenly"):
        xb.compile_spmd(uneven, xb.local_devices("cpu", 4), num_partitions=4)
