"""rhino.search.spmd.spec: notation, validity, stride semantics, HloSharding round trips."""

from __future__ import annotations

import itertools
import math

import pytest

from rhino.hlo.errors import ConfigError
from rhino.hlo.sharding import HloSharding, parse_sharding
from rhino.search.mesh import DeviceMesh, parse_mesh
from rhino.search.spmd.spec import (
    Partial,
    R,
    ShardingSpec,
    SpecError,
    Split,
    all_specs,
    canonical_iota,
    from_hlo_sharding,
    parse_spec,
)

MESH_2x4 = parse_mesh("2x4")

# -- notation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "R",
        "S0",
        "P",
        "S0R",
        "RS1",
        "S0S1",
        "S1S0",
        "PR",
        "RP",
        "S0S0",
        "S0[s=2]R",
        "P[max]S1",
        "S0S0 order=1,0",
        "S1S0S1 order=1,2,0",
        "S0[s=1]S0[s=4]",
    ],
)
def test_notation_round_trip(text: str) -> None:
    spec = parse_spec(text)
    assert str(spec) == text
    assert parse_spec(str(spec)) == spec


def test_notation_structure() -> None:
    spec = parse_spec("S0[s=2]PS1")
    assert spec.axes == (Split(0, 2), Partial(), Split(1))
    assert spec.partial_axes() == (1,)
    assert spec.split_dims() == (0, 1)
    assert parse_spec("S0S0").dim_axes(0) == (0, 1)
    assert parse_spec("S0S0 order=1,0").dim_axes(0) == (1, 0)


def test_order_is_canonical() -> None:
    # an order that agrees with the mesh order on every dim is dropped
    assert ShardingSpec((Split(0), Split(1)), (1, 0)) == parse_spec("S0S1")
    assert str(ShardingSpec((Split(0), Split(1)), (1, 0))) == "S0S1"
    # otherwise it is grouped by dim
    spec = ShardingSpec((Split(1), Split(0), Split(1)), (2, 1, 0))
    assert spec.order == (1, 2, 0)
    assert spec.dim_axes(1) == (2, 0)


@pytest.mark.parametrize(
    "text", ["X", "S", "S0Q", "S0[s=0]R", "P[avg]", "", "S0 order=x", "S0S1 order=0"]
)
def test_parse_spec_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="sharding spec"):
        parse_spec(text)


def test_parse_spec_checks_mesh_rank() -> None:
    with pytest.raises(ConfigError, match="expected 2 tokens"):
        parse_spec("S0", mesh_ndim=2)


def test_dim_notation() -> None:
    assert parse_spec("S0R").dim_notation(2) == "S0R"
    assert parse_spec("RS0").dim_notation(2) == "S1R"
    assert parse_spec("S0S0").dim_notation(2) == "S01R"
    assert parse_spec("S0S0 order=1,0").dim_notation(2) == "S10R"
    assert parse_spec("RS1").dim_notation(2) == "RS1"
    assert parse_spec("PS1").dim_notation(2) == "RS1+P0"
    assert parse_spec("S0[s=2]R").dim_notation(1) == "S0[0:s=2]"


# -- validity and shapes ---------------------------------------------------------------------


def test_shard_shape() -> None:
    assert parse_spec("S0R").shard_shape((8, 6), MESH_2x4) == (4, 6)
    assert parse_spec("RS0").shard_shape((8, 6), MESH_2x4) == (2, 6)
    assert parse_spec("S0S0").shard_shape((8, 6), MESH_2x4) == (1, 6)
    assert parse_spec("S1S0").shard_shape((8, 6), MESH_2x4) == (2, 3)
    assert parse_spec("PR").shard_shape((8, 6), MESH_2x4) == (8, 6)


def test_validity() -> None:
    assert parse_spec("S0R").is_valid((8, 6), MESH_2x4)
    assert not parse_spec("RS1").is_valid((8, 6), MESH_2x4)  # 4 does not divide 6
    assert parse_spec("S1R").is_valid((8, 6), MESH_2x4)
    assert not parse_spec("S0S0").is_valid((4, 6), MESH_2x4)  # 8 shards of 4 rows
    assert not parse_spec("S2R").is_valid((8, 6), MESH_2x4)  # no dim 2
    assert not parse_spec("S0").is_valid((8,), MESH_2x4)  # mesh rank
    # a stride must divide the shard
    assert parse_spec("S0[s=2]R").is_valid((8, 6), MESH_2x4)
    assert not parse_spec("S0[s=3]R").is_valid((8, 6), MESH_2x4)
    assert parse_spec("S0[s=4]R").is_valid((8, 6), MESH_2x4)
    with pytest.raises(SpecError, match="does not divide dim 1"):
        parse_spec("RS1").check((8, 6), MESH_2x4)


def test_normalized() -> None:
    spec = parse_spec("S0[s=4]S0[s=1]")
    assert str(spec.normalized((8,), MESH_2x4)) == "S0S0"
    assert str(parse_spec("S0[s=2]R").normalized((8,), MESH_2x4)) == "S0[s=2]R"
    assert spec.strides((8,), MESH_2x4) == {0: 4, 1: 1}


# -- stride semantics -------------------------------------------------------------------------


def test_device_slices_stride_example() -> None:
    mesh = parse_mesh("2")
    slices = ShardingSpec((Split(0, 2),)).device_slices((8,), mesh)
    assert slices == [((0, 1, 4, 5),), ((2, 3, 6, 7),)]
    slices = ShardingSpec((Split(0, 1),)).device_slices((8,), mesh)
    assert slices == [((0, 2, 4, 6),), ((1, 3, 5, 7),)]
    slices = ShardingSpec((Split(0),)).device_slices((8,), mesh)
    assert slices == [((0, 1, 2, 3),), ((4, 5, 6, 7),)]


def test_device_slices_two_axes_on_one_dim() -> None:
    mesh = parse_mesh("2x2")
    outer0 = parse_spec("S0S0").device_slices((8,), mesh)
    assert [s[0] for s in outer0] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    outer1 = parse_spec("S0S0 order=1,0").device_slices((8,), mesh)
    assert [s[0] for s in outer1] == [(0, 1), (4, 5), (2, 3), (6, 7)]
    # the inner stride counts in the positions the outer split left on the device
    strided = parse_spec("S0[s=1]S0[s=1]").device_slices((8,), mesh)
    assert [s[0] for s in strided] == [(0, 4), (2, 6), (1, 5), (3, 7)]


def test_device_slices_replicate_and_partial() -> None:
    slices = parse_spec("PS1").device_slices((2, 4), MESH_2x4)
    assert slices[0] == ((0, 1), (0,))
    assert slices[4] == ((0, 1), (0,))  # axis 0 holds partial sums: same indices
    assert parse_spec("PS1").partial_part(4, MESH_2x4) == (1,)


@pytest.mark.parametrize("mesh_text", ["4", "2x2", "2x4", "2x2x2"])
def test_device_slices_partition_the_tensor(mesh_text: str) -> None:
    """Every spec covers each element exactly `replicas` times, in shards of shard_shape."""
    mesh = parse_mesh(mesh_text)
    shape = (8, 4)
    specs = all_specs(shape, mesh) + _strided(shape, mesh)
    for spec in specs:
        slices = spec.device_slices(shape, mesh)
        counts: dict[tuple[int, int], int] = {}
        for per_dim in slices:
            assert tuple(len(ix) for ix in per_dim) == spec.shard_shape(shape, mesh)
            for element in itertools.product(*per_dim):
                counts[element] = counts.get(element, 0) + 1
        assert len(counts) == math.prod(shape), spec
        assert set(counts.values()) == {spec.replicas(mesh)}, spec


def _strided(shape: tuple[int, ...], mesh: DeviceMesh) -> list[ShardingSpec]:
    """Every valid spec made from a maximal one by giving one split a smaller stride."""
    found = []
    for spec in all_specs(shape, mesh):
        for a, entry in enumerate(spec.axes):
            if isinstance(entry, Split):
                for s in (1, 2):
                    axes = list(spec.axes)
                    axes[a] = Split(entry.dim, s)
                    other = ShardingSpec(tuple(axes), spec.order)
                    if other.is_valid(shape, mesh) and other.normalized(shape, mesh) == other:
                        found.append(other)
    return found


# -- HloSharding --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mesh_text", "spec_text", "rank", "xla"),
    [
        ("2x4", "S0R", 2, "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"),
        ("2x4", "RS0", 2, "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"),
        ("2x4", "S0S1", 2, "{devices=[2,4]<=[8]}"),
        ("2x4", "S1S0", 2, "{devices=[4,2]<=[2,4]T(1,0)}"),
        ("2x4", "S0S0", 2, "{devices=[8,1]<=[8]}"),
        ("2x4", "S0S0 order=1,0", 2, "{devices=[8,1]<=[2,4]T(1,0)}"),
        ("2x4", "RS1", 2, "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"),
        ("2x4", "RR", 2, "{replicated}"),
        ("2x4", "RR", 0, "{replicated}"),
        ("8", "S0", 1, "{devices=[8]<=[8]}"),
        ("8", "S1", 3, "{devices=[1,8,1]<=[8]}"),
        ("8", "R", 2, "{replicated}"),
        ("2x2x2", "RS0R", 2, "{devices=[2,1,4]<=[2,2,2]T(1,0,2) last_tile_dim_replicate}"),
        ("2x2x2", "S1RS0", 2, "{devices=[2,2,2]<=[4,2]T(1,0) last_tile_dim_replicate}"),
        ("1x8", "S0S1", 2, "{devices=[1,8]<=[8]}"),
    ],
)
def test_to_hlo_sharding_golden(mesh_text: str, spec_text: str, rank: int, xla: str) -> None:
    mesh = parse_mesh(mesh_text)
    spec = parse_spec(spec_text)
    sharding = spec.to_hlo_sharding(mesh, rank)
    assert str(sharding) == xla
    back = from_hlo_sharding(parse_sharding(xla), mesh, rank)
    # a split on a size-1 mesh axis is the same layout as replicating on it
    assert back.to_hlo_sharding(mesh, rank).is_equivalent(sharding)
    if all(n > 1 for n in mesh.shape):
        assert back == spec


@pytest.mark.parametrize("mesh_text", ["8", "2x4", "4x2", "2x2x2"])
@pytest.mark.parametrize("shape", [(8, 8), (8, 4, 2)])
def test_round_trip_all_specs(mesh_text: str, shape: tuple[int, ...]) -> None:
    mesh = parse_mesh(mesh_text)
    for spec in all_specs(shape, mesh):
        sharding = spec.to_hlo_sharding(mesh, len(shape))
        assert from_hlo_sharding(parse_sharding(str(sharding)), mesh, len(shape)) == spec


@pytest.mark.parametrize("mesh_text", ["8", "2x4", "2x2x2"])
def test_hlo_tiles_match_device_slices(mesh_text: str) -> None:
    """The tile XLA gives each device holds exactly the indices device_slices says."""
    mesh = parse_mesh(mesh_text)
    shape = (8, 8)
    for spec in all_specs(shape, mesh):
        sharding = spec.to_hlo_sharding(mesh, 2)
        slices = spec.device_slices(shape, mesh)
        if str(sharding) == "{replicated}":
            assert all(s == (tuple(range(8)), tuple(range(8))) for s in slices)
            continue
        tile = sharding.tile_shape
        data = sharding.data_tile_shape()
        devices = sharding.devices()
        for flat, idx in enumerate(itertools.product(*(range(n) for n in tile))):
            expected = tuple(
                tuple(range(i * n // t, (i + 1) * n // t))
                for i, n, t in zip(idx, shape, data, strict=False)
            )
            assert slices[devices[flat]] == expected, (spec, sharding)


def test_from_hlo_sharding_other_spellings() -> None:
    # an explicit device list, and a replica group listed in another order
    assert (
        str(from_hlo_sharding(parse_sharding("{devices=[2,2]0,2,1,3}"), parse_mesh("2x2"), 2))
        == "S1S0"
    )
    text = "{devices=[2,1,4]0,3,2,1,4,7,6,5 last_tile_dim_replicate}"
    assert str(from_hlo_sharding(parse_sharding(text), MESH_2x4, 2)) == "S0R"
    text = "{devices=[2,1,4]<=[8] last_tile_dims={replicated}}"
    assert str(from_hlo_sharding(parse_sharding(text), MESH_2x4, 2)) == "S0R"
    assert str(from_hlo_sharding(HloSharding.replicated(), MESH_2x4, 3)) == "RR"


@pytest.mark.parametrize(
    ("text", "rank", "message"),
    [
        ("{maximal device=0}", 2, "maximal"),
        ("{manual}", 2, "manual"),
        ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", 3, "rank 3"),
        ("{devices=[4]<=[4]}", 1, "devices"),
        ("{devices=[8,1]0,2,4,6,1,3,5,7}", 2, "not the layout of any"),
        ("{devices=[2,1,4]<=[8] last_tile_dims={manual}}", 2, "subgroups"),
    ],
)
def test_from_hlo_sharding_rejects(text: str, rank: int, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        from_hlo_sharding(parse_sharding(text), MESH_2x4, rank)


def test_to_hlo_sharding_rejects() -> None:
    with pytest.raises(SpecError, match="non-maximal stride"):
        parse_spec("S0[s=2]R").to_hlo_sharding(MESH_2x4, 2)
    with pytest.raises(SpecError, match="partial results"):
        parse_spec("PS0").to_hlo_sharding(MESH_2x4, 2)
    sharding = parse_spec("PS0").to_hlo_sharding(MESH_2x4, 2, partial_as_replicated=True)
    assert str(sharding) == "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    with pytest.raises(SpecError, match="rank-1"):
        parse_spec("RS1").to_hlo_sharding(MESH_2x4, 1)


@pytest.mark.parametrize(
    ("dims", "perm", "expected"),
    [
        ((2, 4), (0, 1), ((8,), ())),
        ((2, 4), (1, 0), ((2, 4), (1, 0))),
        ((2, 2, 2), (1, 2, 0), ((2, 4), (1, 0))),
        ((2, 2, 2), (0, 2, 1), ((2, 2, 2), (0, 2, 1))),
        ((1, 8), (1, 0), ((8,), ())),
        ((2, 1, 4), (2, 1, 0), ((2, 4), (1, 0))),
    ],
)
def test_canonical_iota(
    dims: tuple[int, ...], perm: tuple[int, ...], expected: tuple[tuple[int, ...], ...]
) -> None:
    assert canonical_iota(dims, perm) == expected


# -- XLA (through jax) as the oracle ------------------------------------------------------------

_JAX_MESHES = [(8,), (2, 4), (4, 2), (2, 2, 2)]


@pytest.mark.parametrize("mesh_shape", _JAX_MESHES)
def test_to_hlo_sharding_matches_jax(mesh_shape: tuple[int, ...]) -> None:
    """A spec prints as the HloSharding jax makes for the same NamedSharding."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 simulated devices")
    names = ("a", "b", "c")[: len(mesh_shape)]
    jmesh = Mesh(np.array(jax.devices()[:8]).reshape(mesh_shape), names)
    mesh = DeviceMesh(mesh_shape)
    shape = (8, 8)
    checked = 0
    for spec in all_specs(shape, mesh):
        entries = []
        for d in range(len(shape)):
            axes = tuple(names[a] for a in spec.dim_axes(d))
            entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        jax_text = str(NamedSharding(jmesh, PartitionSpec(*entries))._to_xla_hlo_sharding(2))
        assert str(spec.to_hlo_sharding(mesh, 2)) == jax_text, spec
        checked += 1
    assert checked == len(all_specs(shape, mesh))


def test_all_specs_counts() -> None:
    # 1-D mesh, rank 2: R, S0, S1
    assert [str(s) for s in all_specs((8, 8), parse_mesh("4"))] == ["R", "S0", "S1"]
    specs = {str(s) for s in all_specs((8, 8), MESH_2x4, partial=True)}
    assert {"RR", "S0S1", "S1S0", "S0S0", "S0S0 order=1,0", "PR", "PP", "RS0"} <= specs
    assert "RS1" in specs
    assert "S1S1" in specs
    # invalid ones are left out: 8 does not split 4 rows
    assert "S0S0" not in {str(s) for s in all_specs((4, 8), MESH_2x4)}
    assert R == parse_spec("R").axes[0]
