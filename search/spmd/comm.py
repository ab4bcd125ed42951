"""Alpha-beta cost of collectives on mesh axes, and compute time.

Every function is pure: `(nbytes, mesh, axes, cluster) -> seconds`. `axes` is one mesh
axis or a tuple of them; the collective runs in every replica group over those axes at
once (`DeviceMesh.axes_groups`), on the link `Cluster.group_link` gives for them
(bandwidth B per device, latency alpha per step). n is the number of devices in a group;
a group of one device costs nothing.

`nbytes` is always the per-device buffer on the FULL side of the collective:

    all-gather          output (n shards)        (n-1)/n * nbytes / B + (n-1) * alpha
    reduce-scatter      input (n shards)         (n-1)/n * nbytes / B + (n-1) * alpha
    all-reduce          the buffer           2 * (n-1)/n * nbytes / B + 2(n-1) * alpha
    all-to-all          the buffer               (n-1)/n * nbytes / B + (n-1) * alpha
    collective-permute  the buffer        busiest device or NIC: k * nbytes / B + alpha

These are the ring algorithms NCCL uses for large messages: an all-gather or
reduce-scatter is n-1 steps each moving nbytes/n per device; an all-reduce is a
reduce-scatter then an all-gather. The all-to-all is pairwise exchange: each device
sends nbytes/n to each of the n-1 others, which a switched fabric (NVSwitch, a NIC)
carries at the per-device bandwidth. B is NCCL's "bus bandwidth", which is what makes
these formulas exact for it: busbw = algbw * 2(n-1)/n for all-reduce.

A collective over several axes is one ring over all their devices; `group_link` gives
its bottleneck link (the slowest hop, NICs shared among the groups crossing a node).
A collective-permute is costed from its (source, target) pairs (`permute_time`): k is
the most messages one device, or one node's NICs, must carry.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from rhino.search.cluster import Cluster
from rhino.search.mesh import DeviceMesh

Axes = int | tuple[int, ...]


def _axes(axes: Axes) -> tuple[int, ...]:
    return (axes,) if isinstance(axes, int) else tuple(axes)


def _ring(nbytes: float, mesh: DeviceMesh, axes: Axes, cluster: Cluster, rounds: int) -> float:
    """`rounds` ring passes of n-1 steps, each step moving nbytes/n per device."""
    axes = _axes(axes)
    n = mesh.axes_size(axes)
    if n == 1 or nbytes == 0:
        return 0.0
    link = cluster.group_link(mesh, axes)
    return rounds * ((n - 1) / n * nbytes / link.bandwidth + (n - 1) * link.latency)


def all_gather(nbytes: float, mesh: DeviceMesh, axes: Axes, cluster: Cluster) -> float:
    """All-gather whose per-device OUTPUT is `nbytes`."""
    return _ring(nbytes, mesh, axes, cluster, 1)


def reduce_scatter(nbytes: float, mesh: DeviceMesh, axes: Axes, cluster: Cluster) -> float:
    """Reduce-scatter whose per-device INPUT is `nbytes`."""
    return _ring(nbytes, mesh, axes, cluster, 1)


def all_reduce(nbytes: float, mesh: DeviceMesh, axes: Axes, cluster: Cluster) -> float:
    """All-reduce of a per-device buffer of `nbytes` (ring: reduce-scatter + all-gather)."""
    return _ring(nbytes, mesh, axes, cluster, 2)


def all_to_all(nbytes: float, mesh: DeviceMesh, axes: Axes, cluster: Cluster) -> float:
    """All-to-all of a per-device buffer of `nbytes` (pairwise exchange)."""
    return _ring(nbytes, mesh, axes, cluster, 1)


def collective_permute(nbytes: float, mesh: DeviceMesh, axes: Axes, cluster: Cluster) -> float:
    """A cyclic shift within every group over `axes`: each device sends its `nbytes`
    buffer to the next device of its group (see `permute_time`)."""
    pairs: list[tuple[int, int]] = []
    for group in mesh.axes_groups(_axes(axes)):
        pairs.extend(zip(group, group[1:] + group[:1], strict=True))
    return permute_time(nbytes, tuple(pairs), mesh, cluster)


def permute_time(
    nbytes: float, pairs: tuple[tuple[int, int], ...], mesh: DeviceMesh, cluster: Cluster
) -> float:
    """A collective-permute in which each (source, target) pair moves `nbytes`.

    Pairs with source == target cost nothing. Devices send and receive at the intra-node
    bandwidth, one message after another; the pairs that cross nodes share the node's
    NICs (nics_per_node x inter-node bandwidth, each way). Time = the busiest device or
    NIC, plus one latency (inter-node when any pair crosses nodes). With measured
    `meshes` links for this mesh, the slowest link of the axes the pairs differ on is used.
    """
    moves = [(s, t) for s, t in pairs if s != t]
    if not moves or nbytes == 0:
        return 0.0
    if any(shape == mesh.shape for shape, _ in cluster.mesh_axes):
        differ = {
            a
            for s, t in moves
            for a, (cs, ct) in enumerate(zip(mesh.coords(s), mesh.coords(t), strict=True))
            if cs != ct
        }
        link = cluster.group_link(mesh, tuple(sorted(differ)))
        busiest = max(Counter(s for s, _ in moves).values())
        return busiest * nbytes / link.bandwidth + link.latency
    dpn = cluster.devices_per_node
    send = Counter(s for s, _ in moves)
    recv = Counter(t for _, t in moves)
    busiest = max(max(send.values()), max(recv.values()))
    seconds = busiest * nbytes / cluster.intra_node.bandwidth
    crossing = [(s, t) for s, t in moves if s // dpn != t // dpn]
    if not crossing:
        return seconds + cluster.intra_node.latency
    out_of = Counter(s // dpn for s, _ in crossing)
    into = Counter(t // dpn for _, t in crossing)
    node_bandwidth = cluster.inter_node.bandwidth * cluster.nics_per_node
    nic = max(max(out_of.values()), max(into.values())) * nbytes / node_bandwidth
    return max(seconds, nic) + cluster.inter_node.latency


COLLECTIVES: dict[str, Callable[[float, DeviceMesh, Axes, Cluster], float]] = {
    "all-gather": all_gather,
    "reduce-scatter": reduce_scatter,
    "all-reduce": all_reduce,
    "all-to-all": all_to_all,
    "collective-permute": collective_permute,
}
"""Cost function per collective, keyed by XLA opcode name."""


def collective_time(
    kind: str, nbytes: float, mesh: DeviceMesh, axes: Axes, cluster: Cluster
) -> float:
    """Cost of the collective named by its XLA opcode (see `COLLECTIVES`)."""
    try:
        cost = COLLECTIVES[kind]
    except KeyError:
        raise ValueError(
            f"unknown collective {kind!r}; expected one of {sorted(COLLECTIVES)}"
        ) from None
    return cost(nbytes, mesh, axes, cluster)


# -- XLA's collective combiners -------------------------------------------------------------

COMBINE_THRESHOLD_BYTES = {
    "all-reduce": 30 * 2**20,
    "reduce-scatter": 30 * 2**20,
    "all-gather": 2**30,
}
"""XLA merges collectives of one kind over the same devices that do not depend on each
other (AllReduceCombiner, ReduceScatterCombiner, AllGatherCombiner) into one op of up to
this many bytes (its GPU pipeline's defaults; the CPU pipeline combines the same way):
the merged op pays one latency. The kinds listed are the ones combined."""
COMBINE_MAX_COUNT = 256
"""At most this many collectives are merged into one op."""


def latency(kind: str, mesh: DeviceMesh, axes: Axes, cluster: Cluster) -> float:
    """The latency part of a ring collective (what a combined op pays once): rounds x
    (n - 1) x alpha; 0 for a collective-permute (not combined) and groups of one."""
    rounds = {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1, "all-to-all": 1}.get(kind)
    axes = _axes(axes)
    n = mesh.axes_size(axes)
    if rounds is None or n == 1:
        return 0.0
    return rounds * (n - 1) * cluster.group_link(mesh, axes).latency


GroupKey = tuple[str, tuple[int, ...]]
"""(kind, mesh axes): collectives XLA may combine into one op have the same key."""


def latency_by_key(
    steps: Iterable[Any], mesh: DeviceMesh, cluster: Cluster
) -> dict[GroupKey, float]:
    """The latency of the steps (ReshardStep or CommStep: .kind, .axes) of the kinds XLA
    combines, summed per group key (keys with no latency left out)."""
    found: dict[GroupKey, float] = {}
    for s in steps:
        if s.kind in COMBINE_THRESHOLD_BYTES:
            alpha = latency(s.kind, mesh, s.axes, cluster)
            if alpha > 0:
                key = (s.kind, _axes(s.axes))
                found[key] = found.get(key, 0.0) + alpha
    return found


def combined_ops(kind: str, nbytes: float, count: int) -> int:
    """How many ops XLA's combiner makes of `count` independent collectives of `kind`
    moving `nbytes` in all (each op up to the threshold's bytes and COMBINE_MAX_COUNT)."""
    return max(
        1,
        math.ceil(nbytes / COMBINE_THRESHOLD_BYTES[kind]),
        math.ceil(count / COMBINE_MAX_COUNT),
    )


# -- compute -----------------------------------------------------------------------------------


def compute_time(flops: float, cluster: Cluster, dtype: str = "f32") -> float:
    """Seconds for `flops` floating-point operations of element type `dtype` on one
    device, at the cluster's achievable rate for that type (f32's when not listed)."""
    return flops / cluster.flops_for(dtype)


def memory_time(nbytes: float, cluster: Cluster) -> float:
    """Seconds to stream `nbytes` through device memory (0 when the cluster gives no
    memory bandwidth)."""
    if cluster.memory_bandwidth is None:
        return 0.0
    return nbytes / cluster.memory_bandwidth


def roofline_time(flops: float, nbytes: float, cluster: Cluster, dtype: str = "f32") -> float:
    """Roofline estimate of one kernel: the larger of its compute and memory times."""
    return max(compute_time(flops, cluster, dtype), memory_time(nbytes, cluster))
