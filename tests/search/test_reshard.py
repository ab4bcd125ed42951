"""rhino.search.spmd.reshard: costs, shortest paths, XLA's choices, and a brute-force check
that the steps move the right data (collectives simulated on index sets)."""

from __future__ import annotations

import itertools
import math
import random
import re

import pytest

from rhino.search.cluster import Cluster, load_cluster, load_cluster_text
from rhino.search.mesh import DeviceMesh, parse_mesh
from rhino.search.spmd import comm
from rhino.search.spmd.reshard import LOCAL, Reshard, reshard, reshard_cost
from rhino.search.spmd.spec import ShardingSpec, SpecError, Split, all_specs, parse_spec

# 4 devices per node: on a 2x4 mesh axis 1 is fast (in a node), axis 0 slow (4 groups per NIC)
CLUSTER = load_cluster_text(
    """\
name: t
devices_per_node: 4
device: {memory: 16 GiB, flops: {f32: 10 TFLOP/s}}
links:
  intra_node: {bandwidth: 100 GB/s, latency: 1 us}
  inter_node: {bandwidth: 80 Gb/s, latency: 10 us}
"""
)
MESH = parse_mesh("2x4")
SHAPE = (1024, 512)


def _r(src: str, dst: str, shape: tuple[int, ...] = SHAPE, cluster: Cluster = CLUSTER) -> Reshard:
    return reshard(shape, 4, parse_spec(src), parse_spec(dst), MESH, cluster)


def _kinds(r: Reshard) -> list[tuple[str, tuple[int, ...]]]:
    return [(s.kind, s.axes) for s in r.collectives()]


# -- costs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["RR", "S0R", "S0S1", "PR", "S0S0 order=1,0", "S0[s=2]S1"])
def test_identity_is_free(spec: str) -> None:
    r = _r(spec, spec)
    assert r.steps == ()
    assert r.seconds == 0.0


@pytest.mark.parametrize("dst", ["S0R", "RS1", "S0S1", "S1S0", "S0S0", "S0[s=2]R", "PS0"])
def test_replicated_to_split_is_free(dst: str) -> None:
    r = _r("RR", dst)
    assert r.seconds == 0.0
    assert r.collectives() == ()
    assert r.steps  # local slices


def test_split_to_replicated_is_an_all_gather() -> None:
    mesh = parse_mesh("8")
    r = reshard(SHAPE, 4, parse_spec("S0"), parse_spec("R"), mesh, CLUSTER)
    full = math.prod(SHAPE) * 4
    assert _kinds(r) == [("all-gather", (0,))]
    assert r.steps[0].nbytes == full
    assert r.seconds == pytest.approx(comm.all_gather(full, mesh, 0, CLUSTER))


def test_partial_to_replicated_is_an_all_reduce() -> None:
    r = _r("RP", "RR")
    full = math.prod(SHAPE) * 4
    assert _kinds(r) == [("all-reduce", (1,))]
    assert r.seconds == pytest.approx(comm.all_reduce(full, MESH, 1, CLUSTER))


def test_partial_to_split_is_a_reduce_scatter() -> None:
    r = _r("RP", "RS0")
    full = math.prod(SHAPE) * 4
    assert _kinds(r) == [("reduce-scatter", (1,))]
    assert r.seconds == pytest.approx(comm.reduce_scatter(full, MESH, 1, CLUSTER))
    assert r.seconds < _r("RP", "RR").seconds


def test_swapping_split_dims_is_one_all_to_all() -> None:
    r = _r("RS0", "RS1")
    assert _kinds(r) == [("all-to-all", (1,))]
    assert r.steps[0].dims == (0, 1)


def test_intermediate_spec_found_when_cheaper() -> None:
    """S0R -> RR directly all-gathers full rows over the slow axis 0. Slicing on the fast
    axis first, gathering the 4x smaller pieces over axis 0, then gathering over axis 1
    is cheaper (a hierarchical all-gather); the search must find it."""
    direct = comm.all_gather(math.prod(SHAPE) * 4, MESH, 0, CLUSTER)
    r = _r("S0R", "RR")
    full = math.prod(SHAPE) * 4
    assert r.seconds < direct
    assert len(r.collectives()) == 2
    # only a quarter of the tensor crosses the slow axis
    assert all(s.nbytes <= full / 4 for s in r.collectives() if 0 in s.axes)
    assert r.collectives()[-1].kind == "all-gather"
    assert r.collectives()[-1].axes == (1,)
    # when both axes are equally fast there is nothing to gain: one all-gather
    flat = load_cluster_text(CLUSTER_TEXT_ONE_NODE)
    r = _r("S0R", "RR", cluster=flat)
    assert _kinds(r) == [("all-gather", (0,))]


CLUSTER_TEXT_ONE_NODE = """\
name: flat
devices_per_node: 64
device: {memory: 16 GiB, flops: {f32: 10 TFLOP/s}}
links:
  intra_node: {bandwidth: 100 GB/s, latency: 1 us}
  inter_node: {bandwidth: 80 Gb/s, latency: 10 us}
"""


def test_several_axes_in_one_collective() -> None:
    # a dim split over both axes comes back in one all-gather when that is cheapest
    flat = load_cluster_text(CLUSTER_TEXT_ONE_NODE)
    r = reshard(SHAPE, 4, parse_spec("S0S0"), parse_spec("RR"), MESH, flat)
    assert [s.kind for s in r.collectives()] in (["all-gather"], ["all-gather", "all-gather"])
    r = _r("PP", "RR")
    # partial sums over both axes: a hierarchical all-reduce beats one ring over 8
    assert r.seconds <= comm.all_reduce(math.prod(SHAPE) * 4, MESH, (0, 1), CLUSTER)


def test_collective_permute_pairs() -> None:
    # same tiles, other device order: every device gets its shard from one device
    r = _r("S0S0", "S0S0 order=1,0")
    assert _kinds(r) == [("collective-permute", (0, 1))]
    (step,) = r.steps
    assert sorted(t for _, t in step.pairs) == list(range(8))
    src_slices = step.src.device_slices(SHAPE, MESH)
    dst_slices = step.dst.device_slices(SHAPE, MESH)
    assert all(src_slices[s] == dst_slices[t] for s, t in step.pairs)
    assert step.seconds == pytest.approx(comm.permute_time(step.nbytes, step.pairs, MESH, CLUSTER))


def test_reshard_cost_and_cache() -> None:
    a = _r("S0S1", "S1S0")
    b = _r("S0S1", "S1S0")
    assert a is b  # cached
    assert (
        reshard_cost(SHAPE, 4, parse_spec("S0S1"), parse_spec("S1S0"), MESH, CLUSTER) == a.seconds
    )


def test_invalid_spec_is_an_error() -> None:
    with pytest.raises(SpecError, match="does not divide"):
        _r("S0S0", "RR", shape=(4, 4))


# -- brute force: simulate the collectives on index sets ----------------------------------------

Data = tuple[tuple[frozenset[int], ...], frozenset[tuple[int, ...]]]
"""Per device: the indices held along each dim, and which partial summands are in it."""


def _initial(spec: ShardingSpec, shape: tuple[int, ...], mesh: DeviceMesh) -> list[Data]:
    slices = spec.device_slices(shape, mesh)
    return [
        (tuple(frozenset(ix) for ix in slices[d]), frozenset([spec.partial_part(d, mesh)]))
        for d in range(mesh.size)
    ]


def _elements(data: Data) -> set[tuple[int, ...]]:
    return set(itertools.product(*data[0]))


def _simulate(r: Reshard, mesh: DeviceMesh) -> list[Data]:
    """Run the steps on index sets; assert each collective can do what the step claims."""
    shape = r.shape
    state = _initial(r.src, shape, mesh)
    spec = r.src
    for step in r.steps:
        assert step.src == spec
        after = [tuple(frozenset(ix) for ix in s) for s in step.dst.device_slices(shape, mesh)]
        groups = mesh.axes_groups(step.axes) if step.axes else [[d] for d in range(mesh.size)]
        new: list[Data | None] = [None] * mesh.size
        for group in groups:
            old = [state[d] for d in group]
            if step.kind == LOCAL:
                for d in group:
                    assert all(a <= b for a, b in zip(after[d], state[d][0], strict=True)), step
                    parts = state[d][1]
                    added = set(step.dst.partial_axes()) - set(step.src.partial_axes())
                    if any(mesh.coords(d)[a] != 0 for a in added):
                        parts = frozenset()  # keeps a zero summand
                    new[d] = (after[d], parts)
            elif step.kind == "all-gather":
                (dim,) = step.dims
                assert len({o[1] for o in old}) == 1, step  # no partial sums mixed
                pieces = [o[0][dim] for o in old]
                assert sum(map(len, pieces)) == len(frozenset().union(*pieces)), step
                for d in group:
                    assert after[d][dim] == frozenset().union(*pieces), step
                    others = [i for i in range(len(shape)) if i != dim]
                    assert all(after[d][i] == state[d][0][i] for i in others), step
                    new[d] = (after[d], state[d][1])
            elif step.kind in ("all-reduce", "reduce-scatter"):
                assert len({o[0] for o in old}) == 1, step  # same indices in the group
                parts = [o[1] for o in old]
                assert sum(map(len, parts)) == len(frozenset().union(*parts)), step
                total = frozenset().union(*parts)
                held = _elements(old[0])
                if step.kind == "reduce-scatter":
                    pieces = [_elements((after[d], total)) for d in group]
                    assert sum(map(len, pieces)) == len(held) == len(set().union(*pieces)), step
                    assert set().union(*pieces) == held, step
                else:
                    assert all(after[d] == state[d][0] for d in group), step
                for d in group:
                    new[d] = (after[d], total)
            elif step.kind == "all-to-all":
                assert len({o[1] for o in old}) == 1, step
                have = set().union(*(_elements(o) for o in old))
                want = [_elements((after[d], old[0][1])) for d in group]
                assert set().union(*want) == have, step
                assert sum(map(len, want)) == sum(len(_elements(o)) for o in old), step
                for d in group:
                    new[d] = (after[d], state[d][1])
            elif step.kind == "collective-permute":
                for d in group:
                    # the new shard comes whole from one device (then a local slice)
                    sources = [
                        o
                        for o in state
                        if all(a <= b for a, b in zip(after[d], o[0], strict=True))
                        and o[1] == state[d][1]
                    ]
                    assert sources, step
                    new[d] = (after[d], state[d][1])
            else:  # pragma: no cover
                raise AssertionError(step.kind)
        state = [n for n in new if n is not None]
        assert len(state) == mesh.size
        spec = step.dst
    assert spec == r.dst
    return state


def _check_final(r: Reshard, state: list[Data], mesh: DeviceMesh) -> None:
    target = r.dst.device_slices(r.shape, mesh)
    for d in range(mesh.size):
        assert state[d][0] == tuple(frozenset(ix) for ix in target[d]), (r, d)
    universe = frozenset(itertools.product(*(range(mesh.shape[a]) for a in r.src.partial_axes())))
    partial = r.dst.partial_axes()
    for group in mesh.axes_groups(partial):
        parts = [state[d][1] for d in group]
        assert sum(map(len, parts)) == len(universe), (r, group, parts)
        assert frozenset().union(*parts) == universe, (r, group)


def _strided_specs(shape: tuple[int, ...], mesh: DeviceMesh) -> list[ShardingSpec]:
    found = []
    for spec in all_specs(shape, mesh):
        for a, entry in enumerate(spec.axes):
            if isinstance(entry, Split):
                axes = list(spec.axes)
                axes[a] = Split(entry.dim, 1)
                other = ShardingSpec(tuple(axes), spec.order)
                if other.is_valid(shape, mesh) and other.normalized(shape, mesh) == other:
                    found.append(other)
    return found


@pytest.mark.parametrize("mesh_text", ["4", "2x2", "2x4", "2x2x2"])
def test_brute_force_data_movement(mesh_text: str) -> None:
    """For every pair of specs (partial sums and strides included) on small shapes, the
    steps, run as collectives on index sets, leave each device holding exactly what the
    target spec says, with every partial summand counted once."""
    mesh = parse_mesh(mesh_text)
    cluster = load_cluster("m8")
    shape = (8, 4)
    specs = all_specs(shape, mesh, partial=True) + _strided_specs(shape, mesh)
    pairs = list(itertools.product(specs, repeat=2))
    if len(pairs) > 300:  # all 27k pairs pass too; this keeps the suite fast
        pairs = random.Random(1).sample(pairs, 300)
    for src, dst in pairs:
        r = reshard(shape, 2, src, dst, mesh, cluster)
        state = _simulate(r, mesh)
        _check_final(r, state, mesh)


def test_simulator_catches_a_wrong_step() -> None:
    """The brute-force check is not vacuous: a step list that skips a collective fails."""
    r = _r("S0R", "RR")
    wrong = Reshard(r.shape, r.dtype_bytes, r.src, r.dst, ())
    with pytest.raises(AssertionError):
        _check_final(wrong, _simulate(wrong, MESH), MESH)


# -- XLA (through jax) as the oracle --------------------------------------------------------------

_XLA_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%\S+ = .*? (all-gather|all-to-all|collective-permute|all-reduce"
    r"|reduce-scatter)(?:-start)?\(",
    re.M,
)


def test_materialized_path_is_what_xla_does() -> None:
    """Written into the program as sharding constraints, the intermediate specs of a path
    make XLA's SPMD partitioner insert exactly the predicted collectives, in order."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    if len(jax.devices()) < 8:
        pytest.skip("needs 8 simulated devices")
    jmesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))
    shape = (16, 16)

    def named(spec: ShardingSpec) -> NamedSharding:
        entries: list[object] = []
        for d in range(len(shape)):
            axes = tuple("ab"[a] for a in spec.dim_axes(d))
            entries.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        return NamedSharding(jmesh, PartitionSpec(*entries))

    specs = all_specs(shape, MESH)
    pairs = random.Random(3).sample(list(itertools.permutations(specs, 2)), 24)
    pairs += [(parse_spec("S0R"), parse_spec("RR")), (parse_spec("S0S1"), parse_spec("S1S0"))]
    x = jax.numpy.zeros(shape, jax.numpy.float32)
    for src, dst in pairs:
        r = reshard(shape, 4, src, dst, MESH, load_cluster("m8"))

        def f(y: object, r: Reshard = r) -> object:
            y = y * 1.0
            for step in r.steps[:-1]:
                y = jax.lax.with_sharding_constraint(y, named(step.dst))
            return y

        compiled = jax.jit(f, in_shardings=named(src), out_shardings=named(dst)).lower(x).compile()
        got = _XLA_COLLECTIVE.findall(compiled.as_text())
        assert got == [s.kind for s in r.collectives()], (src, dst, [str(s) for s in r.steps])
