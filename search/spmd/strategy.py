"""Strategies: the ways one instruction can run on a mesh, and what each costs.

A `Strategy` fixes the layout (a `ShardingSpec`) of every result leaf of an instruction
and the layout in which it reads each operand, with the compute time on one device and
the communication the instruction performs itself (the all-reduce of a dot whose
contracting dim is split, the halo exchange of a spatially split convolution). The
layout conversions between a producer's result and a consumer's operand are not part
of a strategy: they are the edge costs of the problem (`rhino.search.spmd.reshard`).

Per-opcode rules live in `rhino.search.spmd.rules`; this module holds the types they share
and the tensor-layout helpers (candidate specs, mapping splits through reshapes).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import cast

from rhino.hlo.ir import Instruction
from rhino.search.cluster import Cluster
from rhino.search.mesh import DeviceMesh
from rhino.search.spmd.spec import AxisSpec, Replicate, ShardingSpec, SpecError, Split

R = Replicate()


@dataclass(frozen=True)
class CommStep:
    """A collective an instruction performs itself (for costs and the fidelity report)."""

    kind: str
    """"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"."""
    axes: tuple[int, ...]
    """Mesh axes the collective runs over."""
    nbytes: float
    """Bytes per device, full-side convention of `rhino.search.spmd.comm`."""
    seconds: float
    """Predicted time."""


@dataclass(frozen=True)
class Strategy:
    """One way to run an instruction."""

    label: str
    """Alpa/XLA-style notation, e.g. `S0R = S0R x RR`."""
    outs: tuple[ShardingSpec, ...]
    """Layout of each result leaf (one for an array result)."""
    ins: tuple[ShardingSpec | None, ...]
    """Layout each operand is read in; None for an operand read whole on every device
    that is not a tensor the plan places (tokens)."""
    compute: float
    """Seconds of compute per device."""
    comm: tuple[CommStep, ...] = ()
    """Collectives the instruction itself performs."""

    @property
    def comm_seconds(self) -> float:
        return sum(c.seconds for c in self.comm)

    @property
    def cost(self) -> float:
        return self.compute + self.comm_seconds


@dataclass(frozen=True)
class Context:
    """What a rule needs besides the instruction."""

    mesh: DeviceMesh
    cluster: Cluster
    max_strategies: int = 64
    """Rules keep at most this many strategies per instruction (cheapest first)."""
    pinned: dict[str, ShardingSpec] = field(default_factory=dict)
    """User-pinned result layouts by instruction name."""
    strided: dict[str, tuple[ShardingSpec, ...]] = field(default_factory=dict)
    """Extra (non-maximal stride) result layouts by instruction name (§4.3.3)."""

    def candidates(self, inst: Instruction) -> tuple[ShardingSpec, ...]:
        """Result layouts to consider for `inst`: maximal strides, plus strided ones
        where they can save communication."""
        return candidate_specs(inst.shape.dims, self.mesh) + self.strided.get(inst.name, ())


# -- candidate layouts of a tensor -----------------------------------------------------------


def candidate_specs(dims: tuple[int, ...], mesh: DeviceMesh) -> tuple[ShardingSpec, ...]:
    """Maximal-stride layouts of a `dims` tensor: each mesh axis replicates or splits one dim.

    Several axes may split the same dim (in mesh order). Axes of size 1 only replicate.
    Replicated first, then by notation (deterministic).
    """
    return _candidate_specs(tuple(dims), mesh)


@lru_cache(maxsize=4096)
def _candidate_specs(dims: tuple[int, ...], mesh: DeviceMesh) -> tuple[ShardingSpec, ...]:
    per_axis = []
    for size in mesh.shape:
        choices: list[Replicate | Split] = [R]
        if size > 1:
            choices += [Split(d) for d in range(len(dims)) if dims[d] % size == 0]
        per_axis.append(choices)
    found = []
    for axes in itertools.product(*per_axis):
        spec = ShardingSpec(tuple(axes))
        if spec.is_valid(dims, mesh):
            found.append(spec)
    found.sort(key=lambda s: (not s.is_replicated(), str(s)))
    return tuple(found)


def replicated(mesh: DeviceMesh) -> ShardingSpec:
    return ShardingSpec.replicated(mesh.ndim)


def dividing_axes(specs: Sequence[ShardingSpec]) -> set[int]:
    """The mesh axes that divide an instruction's work: those that split or hold partial
    sums in any of its layouts `specs`."""
    used: set[int] = set()
    for spec in specs:
        used.update(a for a, s in enumerate(spec.axes) if not isinstance(s, Replicate))
    return used


def work_fraction(specs: Sequence[ShardingSpec], mesh: DeviceMesh) -> float:
    """1 / the number of devices the work is divided over (`dividing_axes`)."""
    used = dividing_axes(specs)
    return 1.0 / math.prod(mesh.shape[a] for a in used) if used else 1.0


def map_spec(
    spec: ShardingSpec, dim_map: Mapping[int, int | None], mesh: DeviceMesh
) -> ShardingSpec | None:
    """`spec` with every split dim d renamed to dim_map[d]; None when a split dim has no
    image (the layout does not carry over). Strides are kept."""
    axes: list[AxisSpec] = []
    for entry in spec.axes:
        if isinstance(entry, Split):
            target = dim_map.get(entry.dim)
            if target is None:
                return None
            axes.append(Split(target, entry.stride))
        else:
            axes.append(entry)
    try:
        return ShardingSpec(tuple(axes), spec.order)
    except SpecError:  # a combination no spec can hold (e.g. one dim split twice)
        return None


def keep_dims(spec: ShardingSpec, keep: Sequence[int]) -> ShardingSpec:
    """`spec` with splits of dims outside `keep` replaced by replication."""
    kept = set(keep)
    axes = [e if not isinstance(e, Split) or e.dim in kept else R for e in spec.axes]
    return ShardingSpec(tuple(axes))


# -- reshape: which splits carry over, and with what stride (Rhino §4.1) -----------------------


def reshape_groups(
    src: Sequence[int], dst: Sequence[int]
) -> list[tuple[list[int], list[int]]] | None:
    """Pair up runs of src dims and dst dims with equal element counts (major to minor).

    Trailing size-1 dims join the last group. None if the counts differ or are zero.
    """
    if math.prod(src) != math.prod(dst) or 0 in src or 0 in dst:
        return None
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) and j < len(dst):
        gs, gd = [i], [j]
        ps, pd = src[i], dst[j]
        i, j = i + 1, j + 1
        while ps != pd:
            if ps < pd:
                gs.append(i)
                ps *= src[i]
                i += 1
            else:
                gd.append(j)
                pd *= dst[j]
                j += 1
        groups.append((gs, gd))
    if not groups:
        return [(list(range(len(src))), list(range(len(dst))))]
    groups[-1][0].extend(range(i, len(src)))
    groups[-1][1].extend(range(j, len(dst)))
    return groups


def map_split_through_reshape(
    src: Sequence[int], dst: Sequence[int], dim: int, stride: int | None, shards: int
) -> tuple[int, int | None] | None:
    """The split of reshape output `dst` that holds the same elements on each device as
    splitting `src` dim `dim` into `shards` with `stride` (None: maximal); None if none.

    In the flattened run of dims a reshape group covers, splitting a dim with stride t
    deals units of u = t * (product of the dims minor to it) elements round-robin. The
    same units, seen from the other side, are a split of the dim whose minor product
    divides u, with stride u / that product. Returns (dst dim, stride or None if maximal).
    """
    groups = reshape_groups(src, dst)
    if groups is None:
        return None
    for gs, gd in groups:
        if dim not in gs:
            continue
        t = stride if stride is not None else src[dim] // shards
        unit = t * math.prod(src[k] for k in gs if k > dim)
        for d in gd:
            inner = math.prod(dst[k] for k in gd if k > d)
            if unit % inner:
                continue
            t2 = unit // inner
            if t2 > dst[d] or dst[d] % (t2 * shards):
                continue
            # the unit must not straddle a more major dst dim: t2 * shards divides dst[d]
            return d, (None if t2 * shards == dst[d] else t2)
        return None
    return None


def reshape_spec(
    spec: ShardingSpec, src: Sequence[int], dst: Sequence[int], mesh: DeviceMesh
) -> ShardingSpec | None:
    """The layout of a reshape's result (dst) equivalent to `spec` on its operand (src)."""
    return _reshape_spec(spec, tuple(src), tuple(dst), mesh)


@lru_cache(maxsize=1 << 14)
def _reshape_spec(
    spec: ShardingSpec, src: tuple[int, ...], dst: tuple[int, ...], mesh: DeviceMesh
) -> ShardingSpec | None:
    axes: list[AxisSpec] = []
    for a, entry in enumerate(spec.axes):
        if not isinstance(entry, Split):
            axes.append(entry)
            continue
        chain = spec.dim_axes(entry.dim)
        if len(chain) == 1:
            mapped = map_split_through_reshape(src, dst, entry.dim, entry.stride, mesh.shape[a])
        elif all(cast(Split, spec.axes[b]).stride is None for b in chain):
            # several axes on one dim with maximal strides cut it into contiguous blocks,
            # one per device of the chain: map that split, and keep it only if it stays
            # contiguous (a strided one would need a stride per axis)
            shards = math.prod(mesh.shape[b] for b in chain)
            mapped = map_split_through_reshape(src, dst, entry.dim, None, shards)
            mapped = mapped if mapped is not None and mapped[1] is None else None
        else:
            return None  # several axes on one dim, with strides: not mapped
        if mapped is None:
            return None
        axes.append(Split(mapped[0], mapped[1]))
    try:
        out = ShardingSpec(tuple(axes), spec.order)
    except SpecError:  # a combination no spec can hold (e.g. one dim split twice)
        return None
    return out if out.is_valid(dst, mesh) else None


# -- candidate generation with strides (Rhino §4.3.3) ----------------------------------------


def strided_candidates(
    instructions: Sequence[Instruction], mesh: DeviceMesh
) -> dict[str, tuple[ShardingSpec, ...]]:
    """Non-maximal-stride layouts worth considering, by instruction name.

    Every tensor uses maximal strides by default; another stride is only useful where it
    saves communication. It arises where a reshape merges a split dim with a whole one
    (the split's elements are then dealt in units smaller than a shard), and it stays
    free of communication through the element-wise ops after it, up to the next reshape
    that restores a maximal stride. So: from each reshape, map its operand's layouts
    (maximal or already strided) through it, and carry the strided results forward
    through element-wise users of the same shape (one pass, program order).
    """
    from rhino.hlo.opcode import ELEMENTWISE, Opcode

    extra: dict[str, set[ShardingSpec]] = {}
    # (operand dims, result dims, the operand's strided layouts) -> the reshape's strided
    # layouts: repeated layers repeat their reshapes
    mapped: dict[tuple[object, ...], set[ShardingSpec]] = {}
    for inst in instructions:
        if inst.shape.is_tuple:
            continue
        if inst.opcode in (Opcode.RESHAPE, Opcode.BITCAST) and not inst.operands[0].shape.is_tuple:
            src = inst.operands[0]
            strided = frozenset(extra.get(src.name, ()))
            key = (src.shape.dims, inst.shape.dims, strided)
            found = mapped.get(key)
            if found is None:
                found = mapped[key] = set()
                for spec in (*candidate_specs(src.shape.dims, mesh), *strided):
                    out = reshape_spec(spec, src.shape.dims, inst.shape.dims, mesh)
                    if out is not None and not out.is_maximal():
                        found.add(out)
            if found:
                extra.setdefault(inst.name, set()).update(found)
        elif inst.opcode in ELEMENTWISE:
            for op in inst.operands:
                if op.shape.dims == inst.shape.dims and op.name in extra:
                    extra.setdefault(inst.name, set()).update(extra[op.name])
    return {name: tuple(sorted(specs, key=str)) for name, specs in extra.items()}
