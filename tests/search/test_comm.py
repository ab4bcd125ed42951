"""rhino.search.spmd.comm: alpha-beta collective formulas and compute time."""

from __future__ import annotations

import pytest

from rhino.search.cluster import load_cluster, load_cluster_text
from rhino.search.mesh import parse_mesh
from rhino.search.spmd import comm

# one node of 4 devices at 100 GB/s and 1 us; 10 GB/s NIC and 10 us between nodes
CLUSTER = load_cluster_text(
    """\
name: t
devices_per_node: 4
device: {memory: 16 GiB, memory_bandwidth: 1 TB/s, flops: {f32: 10 TFLOP/s, bf16: 40 TFLOP/s}}
links:
  intra_node: {bandwidth: 100 GB/s, latency: 1 us}
  inter_node: {bandwidth: 80 Gb/s, latency: 10 us}
"""
)
KINDS = sorted(comm.COLLECTIVES)


def test_formulas_on_one_node() -> None:
    mesh = parse_mesh("4")
    nbytes = 4e9
    bw, alpha, n = 100e9, 1e-6, 4
    ring = (n - 1) / n * nbytes / bw + (n - 1) * alpha
    assert comm.all_gather(nbytes, mesh, 0, CLUSTER) == pytest.approx(ring)
    assert comm.reduce_scatter(nbytes, mesh, 0, CLUSTER) == pytest.approx(ring)
    assert comm.all_reduce(nbytes, mesh, 0, CLUSTER) == pytest.approx(2 * ring)
    assert comm.all_to_all(nbytes, mesh, 0, CLUSTER) == pytest.approx(ring)
    assert comm.collective_permute(nbytes, mesh, 0, CLUSTER) == pytest.approx(nbytes / bw + alpha)


def test_all_reduce_is_reduce_scatter_plus_all_gather() -> None:
    mesh = parse_mesh("2x4")
    for axes in [(0,), (1,), (0, 1)]:
        ar = comm.all_reduce(1e8, mesh, axes, CLUSTER)
        rs = comm.reduce_scatter(1e8, mesh, axes, CLUSTER)
        ag = comm.all_gather(1e8, mesh, axes, CLUSTER)
        assert ar == pytest.approx(rs + ag)


@pytest.mark.parametrize("kind", KINDS)
def test_monotonic_in_bytes(kind: str) -> None:
    mesh = parse_mesh("2x4")
    for axes in [0, 1, (0, 1)]:
        times = [comm.collective_time(kind, b, mesh, axes, CLUSTER) for b in (1e3, 1e6, 1e9)]
        assert times[0] < times[1] < times[2]


@pytest.mark.parametrize("kind", KINDS)
def test_cheap_axis_is_cheaper(kind: str) -> None:
    mesh = parse_mesh("2x4")  # axis 1 inside a node, axis 0 across nodes
    inner = comm.collective_time(kind, 1e8, mesh, 1, CLUSTER)
    outer = comm.collective_time(kind, 1e8, mesh, 0, CLUSTER)
    assert inner < outer


@pytest.mark.parametrize("kind", KINDS)
def test_single_device_group_is_free(kind: str) -> None:
    assert comm.collective_time(kind, 1e9, parse_mesh("1x4"), 0, CLUSTER) == 0.0
    assert comm.collective_time(kind, 0, parse_mesh("1x4"), 1, CLUSTER) == 0.0


def test_more_devices_cost_more_latency() -> None:
    small = comm.all_reduce(8, parse_mesh("2"), 0, CLUSTER)
    large = comm.all_reduce(8, parse_mesh("4"), 0, CLUSTER)
    assert small < large


def test_several_axes_use_the_bottleneck() -> None:
    mesh = parse_mesh("2x4")
    both = comm.all_gather(1e9, mesh, (0, 1), CLUSTER)
    # one ring over 8 devices; the NIC is the slowest hop and serves one group per node
    assert both == pytest.approx(7 / 8 * 1e9 / 10e9 + 7 * 10e-6)
    # the axis order of a group does not change its cost
    assert comm.all_gather(1e9, mesh, (1, 0), CLUSTER) == pytest.approx(both)


def test_unknown_collective() -> None:
    with pytest.raises(ValueError, match="unknown collective"):
        comm.collective_time("all-scatter", 1, parse_mesh("2"), 0, CLUSTER)


def test_compute_time() -> None:
    assert comm.compute_time(10e12, CLUSTER) == pytest.approx(1.0)
    assert comm.compute_time(10e12, CLUSTER, "bf16") == pytest.approx(0.25)
    assert comm.compute_time(10e12, CLUSTER, "s32") == pytest.approx(1.0)
    assert comm.memory_time(1e12, CLUSTER) == pytest.approx(1.0)
    assert comm.roofline_time(1e12, 1e12, CLUSTER) == pytest.approx(1.0)
    assert comm.roofline_time(20e12, 1e9, CLUSTER) == pytest.approx(2.0)


def test_m8_all_reduce_magnitudes() -> None:
    """Order-of-magnitude sanity for the paper's platform: 1 GB all-reduce over 8 GPUs
    in a node takes ~10 ms on NVLink; over 2 nodes sharing one 100 Gb/s NIC, ~1 s."""
    m8 = load_cluster("m8")
    mesh = parse_mesh("2x8")
    intra = comm.all_reduce(1e9, mesh, 1, m8)
    inter = comm.all_reduce(1e9, mesh, 0, m8)
    assert 5e-3 < intra < 30e-3
    assert 0.3 < inter < 3
