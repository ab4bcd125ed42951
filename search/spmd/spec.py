"""Sharding specs (Rhino §4.1): what each mesh axis does to a tensor.

A `ShardingSpec` holds one entry per mesh axis:

    Replicate()          R          every device along the axis holds the same data
    Split(dim, stride)   S<d>       the axis cuts tensor dim d into shards
    Partial(op)          P          every device holds a partial result; the value is the
                                    `op` (sum by default) over the axis

Split semantics, with strides. Splitting a sequence of length L over n shards with
stride s cuts it into L/s units of s consecutive elements and deals the units
round-robin: unit k goes to shard k mod n. The maximal stride s = L/n (the default,
`stride=None`) gives contiguous blocks. Example: 8 elements, 2 shards, stride 2: shard 0
holds {0,1,4,5}, shard 1 holds {2,3,6,7}. A stride is valid when it divides L/n.

Several mesh axes may split the same tensor dim. They apply one after another, outer
axis first, each to the local sequence the previous split left on the device (so the
inner axis' stride counts in local positions). By default the outer axis is the one
that comes first in the mesh; `order` says otherwise (XLA's `{devices=[8,1]<=[2,4]T(1,0)}`
splits dim 0 over both axes of a 2x4 mesh with axis 1 outer).

Notation (`str(spec)`, `parse_spec`): one token per mesh axis, outermost axis first:
`S0R` (axis 0 splits dim 0, axis 1 replicates), `RS0` (axis 1 splits dim 0), `S0S1`,
`PR` (partial sums over axis 0), `S0[s=2]R` (a non-maximal stride), `P[max]R` (partial
maxima). When a dim is split by several axes in other than mesh order, the split axes
follow as `order=1,0` (outer first): `S0S0 order=1,0`. `dim_notation(rank)` gives the
per-tensor-dim notation of Alpa and ColossalAI (`S01R`, `RS1`) for the same spec.

XLA's HloSharding (`to_hlo_sharding`, `from_hlo_sharding`) can express only maximal
strides; a strided spec is realized by rewriting the graph (rhino.runtime), and
`to_hlo_sharding` raises `SpecError` for it. HloSharding has no partial-sum state for a
tensor either: `to_hlo_sharding` raises for Partial unless asked to write the partial
axes as replicated (`partial_as_replicated=True`), which is what the tensor becomes after
the all-reduce that XLA inserts.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from rhino.hlo.errors import ConfigError, RhinoError
from rhino.search.mesh import DeviceMesh

if TYPE_CHECKING:
    from rhino.hlo.sharding import HloSharding

REDUCE_OPS = ("sum", "max", "min", "prod")


class SpecError(RhinoError):
    """A sharding spec that does not fit a tensor or mesh, or cannot be written as XLA's
    HloSharding (or an HloSharding that is no spec on the given mesh)."""


@dataclass(frozen=True)
class Replicate:
    """The mesh axis replicates the tensor."""

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Split:
    """The mesh axis splits tensor dim `dim` into shards of `stride`-sized units."""

    dim: int
    """Tensor dimension that is split."""
    stride: int | None = None
    """Consecutive elements per unit; None is the maximal stride (contiguous shards)."""

    def __post_init__(self) -> None:
        if self.dim < 0:
            raise SpecError(f"Split: dim must be >= 0, got {self.dim}")
        if self.stride is not None and self.stride < 1:
            raise SpecError(f"Split: stride must be >= 1 or None, got {self.stride}")

    def __str__(self) -> str:
        return f"S{self.dim}" if self.stride is None else f"S{self.dim}[s={self.stride}]"


@dataclass(frozen=True)
class Partial:
    """Each device along the mesh axis holds a partial result; the value is their `op`."""

    op: str = "sum"
    """Reduction that combines the partial results: sum, max, min or prod."""

    def __post_init__(self) -> None:
        if self.op not in REDUCE_OPS:
            raise SpecError(f"Partial: op must be one of {REDUCE_OPS}, got {self.op!r}")

    def __str__(self) -> str:
        return "P" if self.op == "sum" else f"P[{self.op}]"


AxisSpec = Replicate | Split | Partial
R = Replicate()


class _Derived:
    """What a `ShardingSpec` derives from its fields when made (a spec is made once and
    read many times by the search): attributes, not dataclass fields, so they are not
    compared, printed or copied."""

    _key: tuple[tuple[object, ...], tuple[int, ...]]
    """The fields as plain values: each axis a dim, (dim, stride), None (R) or the
    partial op; and the order."""
    _hash: int
    split_order: tuple[int, ...]
    """The splitting mesh axes in split order (outer first)."""
    _chain_map: dict[int, tuple[int, ...]]
    """Tensor dim -> the mesh axes that split it, outermost first."""
    _split_dims: tuple[int, ...]
    _partial_axes: tuple[int, ...]
    _maximal: bool


@dataclass(frozen=True)
class ShardingSpec(_Derived):
    """How a tensor lies on a device mesh: one `AxisSpec` per mesh axis.

    A spec knows the mesh rank but not the mesh sizes or the tensor shape; the methods
    that need them take them. Equal specs mean the same layout: `order` is canonical.
    """

    axes: tuple[AxisSpec, ...]
    """What each mesh axis does, outermost mesh axis first."""
    order: tuple[int, ...] = ()
    """The splitting mesh axes, outer split first, when some dim is split by several
    axes in other than mesh order; () means mesh order (canonical for that case)."""

    def __post_init__(self) -> None:
        axes = tuple(self.axes)
        if not axes:
            raise SpecError("a sharding spec needs at least one mesh axis")
        splitting, partial = [], []
        chains: dict[int, list[int]] = {}  # in mesh order
        maximal = True
        entries: list[object] = []  # each axis as plain values: a fast __eq__ and hash
        for a, s in enumerate(axes):
            if isinstance(s, Split):
                splitting.append(a)
                chains.setdefault(s.dim, []).append(a)
                entries.append(s.dim if s.stride is None else (s.dim, s.stride))
                maximal = maximal and s.stride is None
            elif isinstance(s, Replicate):
                entries.append(None)
            elif isinstance(s, Partial):
                partial.append(a)
                entries.append(s.op)
            else:
                raise SpecError(f"mesh axis entry must be R, Split or Partial, got {s!r}")
        order = tuple(self.order)
        if order:
            if sorted(order) != splitting:
                raise SpecError(
                    f"order {order} must list exactly the splitting mesh axes {splitting}"
                )
            # canonical: () when every dim's axes come in mesh order
            in_order = self._chains(axes, order)
            if all(list(chain) == sorted(chain) for chain in in_order.values()):
                order = ()
            else:  # canonical: grouped by dim, each group in split order
                order = tuple(a for d in sorted(in_order) for a in in_order[d])
                chains = self._chains(axes, order)
        chain_map = {d: tuple(chain) for d, chain in chains.items()}
        key = (tuple(entries), order)
        # a spec is made once and read many times by the search (its caches are keyed by
        # specs, its moves read the chains): the hash and the structure are kept
        vars(self).update(
            axes=axes,
            order=order,
            _key=key,
            _hash=hash(key),
            split_order=order or tuple(splitting),
            _chain_map=chain_map,
            _split_dims=tuple(sorted(chain_map)),
            _partial_axes=tuple(partial),
            _maximal=maximal,
        )

    @staticmethod
    def _chains(axes: Sequence[AxisSpec], order: Sequence[int]) -> dict[int, list[int]]:
        """Tensor dim -> the axes of `order` that split it, in that order."""
        chains: dict[int, list[int]] = {}
        for a in order:
            spec = axes[a]
            assert isinstance(spec, Split)
            chains.setdefault(spec.dim, []).append(a)
        return chains

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        """Equal axes and order (as the fields compare, without a Python call per axis)."""
        if other.__class__ is not ShardingSpec:
            return NotImplemented
        return self._key == other._key

    def __reduce__(self) -> tuple[type[ShardingSpec], tuple[tuple[AxisSpec, ...], tuple[int, ...]]]:
        """Pickled as its fields: the cached hash (and text) of one process is not
        another's (string hashes are salted per process)."""
        return ShardingSpec, (self.axes, self.order)

    # -- constructors ---------------------------------------------------------------------

    @classmethod
    def replicated(cls, mesh_ndim: int) -> ShardingSpec:
        """All mesh axes replicate."""
        return cls((R,) * mesh_ndim)

    # -- structure ------------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        """Mesh rank the spec is for."""
        return len(self.axes)

    def dim_axes(self, dim: int) -> tuple[int, ...]:
        """Mesh axes that split tensor dim `dim`, outermost first."""
        return self._chain_map.get(dim, ())

    def split_dims(self) -> tuple[int, ...]:
        """Tensor dims split by at least one mesh axis, ascending."""
        return self._split_dims

    def partial_axes(self) -> tuple[int, ...]:
        """Mesh axes holding partial results."""
        return self._partial_axes

    def is_replicated(self) -> bool:
        """True when every axis replicates (no split, no partial)."""
        return all(isinstance(s, Replicate) for s in self.axes)

    def is_maximal(self) -> bool:
        """True when no split names an explicit stride."""
        return self._maximal

    def with_axis(self, axis: int, entry: AxisSpec, *, inner: bool = True) -> ShardingSpec:
        """This spec with mesh axis `axis` replaced by `entry`.

        A new Split becomes the innermost split of its dim (`inner=True`); removing a
        split keeps the others in their order.
        """
        axes = list(self.axes)
        axes[axis] = entry
        order = [a for a in self.split_order if a != axis]
        if isinstance(entry, Split):
            if inner:
                order.append(axis)
            else:
                order.insert(0, axis)
        return ShardingSpec(tuple(axes), tuple(order))

    # -- sizes and validity -------------------------------------------------------------

    def shards(self, dim: int, mesh: DeviceMesh) -> int:
        """Number of shards of tensor dim `dim`."""
        return math.prod(mesh.shape[a] for a in self.dim_axes(dim))

    def replicas(self, mesh: DeviceMesh) -> int:
        """Number of devices holding each shard (replicate and partial axes)."""
        return math.prod(mesh.shape[a] for a, s in enumerate(self.axes) if not isinstance(s, Split))

    def shard_shape(self, shape: Sequence[int], mesh: DeviceMesh) -> tuple[int, ...]:
        """Shape of the local shard on every device (specs shard evenly)."""
        self.check(shape, mesh)
        return tuple(n // self.shards(d, mesh) for d, n in enumerate(shape))

    def strides(self, shape: Sequence[int], mesh: DeviceMesh) -> dict[int, int]:
        """The stride each splitting mesh axis uses, maximal ones filled in."""
        result: dict[int, int] = {}
        for d in self.split_dims():
            length = shape[d]
            for a in self.dim_axes(d):
                n = mesh.shape[a]
                split = self.axes[a]
                assert isinstance(split, Split)
                result[a] = split.stride if split.stride is not None else length // n
                length //= n
        return result

    def problem(self, shape: Sequence[int], mesh: DeviceMesh) -> str | None:
        """Why the spec does not fit `shape` on `mesh`, or None when it does."""
        if self.ndim != mesh.ndim:
            return f"spec {self} has {self.ndim} mesh axes, mesh {mesh} has {mesh.ndim}"
        for d in self.split_dims():
            if d >= len(shape):
                return f"spec {self} splits dim {d} of a rank-{len(shape)} tensor"
            length = shape[d]
            for a in self.dim_axes(d):
                n = mesh.shape[a]
                split = self.axes[a]
                assert isinstance(split, Split)
                if length % n:
                    return (
                        f"spec {self}: mesh axis {a} (size {n}) does not divide dim {d} "
                        f"(size {shape[d]}, {length} per shard before that axis)"
                    )
                if split.stride is not None and (length // n) % split.stride:
                    return (
                        f"spec {self}: stride {split.stride} on mesh axis {a} does not "
                        f"divide the {length // n} elements of dim {d} each shard gets"
                    )
                length //= n
        return None

    def is_valid(self, shape: Sequence[int], mesh: DeviceMesh) -> bool:
        """True when every split divides its dim evenly and every stride fits."""
        return self.problem(shape, mesh) is None

    def check(self, shape: Sequence[int], mesh: DeviceMesh) -> None:
        """Raise `SpecError` unless the spec fits `shape` on `mesh`."""
        problem = self.problem(shape, mesh)
        if problem is not None:
            raise SpecError(f"{problem} (shape {list(shape)})")

    def normalized(self, shape: Sequence[int], mesh: DeviceMesh) -> ShardingSpec:
        """The same layout with every explicit stride that is maximal written as None."""
        self.check(shape, mesh)
        axes = list(self.axes)
        for d in self.split_dims():
            length = shape[d]
            for a in self.dim_axes(d):
                split = axes[a]
                assert isinstance(split, Split)
                if split.stride == length // mesh.shape[a]:
                    axes[a] = Split(split.dim)
                length //= mesh.shape[a]
        return ShardingSpec(tuple(axes), self.order)

    # -- which device holds what ----------------------------------------------------------

    def device_slices(
        self, shape: Sequence[int], mesh: DeviceMesh
    ) -> list[tuple[tuple[int, ...], ...]]:
        """For each device id, the global indices it holds along each tensor dim.

        Indices are listed in local order: position i of the device's shard along dim d
        holds global index `result[device][d][i]`. Works for any valid stride.
        """
        self.check(shape, mesh)
        result = []
        for device in range(mesh.size):
            coords = mesh.coords(device)
            per_dim = []
            for d, length in enumerate(shape):
                seq = list(range(length))
                for a in self.dim_axes(d):
                    split = self.axes[a]
                    assert isinstance(split, Split)
                    seq = _deal(seq, mesh.shape[a], split.stride, coords[a])
                per_dim.append(tuple(seq))
            result.append(tuple(per_dim))
        return result

    def partial_part(self, device: int, mesh: DeviceMesh) -> tuple[int, ...]:
        """Which partial result `device` holds: its coordinates on the partial axes."""
        coords = mesh.coords(device)
        return tuple(coords[a] for a in self.partial_axes())

    # -- notation -------------------------------------------------------------------------

    def __str__(self) -> str:
        return self._text

    @cached_property
    def _text(self) -> str:
        text = "".join(str(s) for s in self.axes)
        if self.order:
            text += " order=" + ",".join(str(a) for a in self.order)
        return text

    def dim_notation(self, rank: int) -> str:
        """Alpa/ColossalAI notation: one token per tensor dim (`S01R`, `RS1`), then the
        partial axes (`RR+P0`) and explicit strides (`S0[s=2]R` style per axis: `[0:s=2]`).
        """
        tokens = []
        for d in range(rank):
            axes = self.dim_axes(d)
            if not axes:
                tokens.append("R")
                continue
            token = "S" + "".join(str(a) for a in axes)
            strides = [
                f"{a}:s={s.stride}"
                for a in axes
                if isinstance(s := self.axes[a], Split) and s.stride is not None
            ]
            if strides:
                token += "[" + ",".join(strides) + "]"
            tokens.append(token)
        text = "".join(tokens)
        for a in self.partial_axes():
            text += f"+{self.axes[a]}{a}"
        return text

    # -- XLA HloSharding --------------------------------------------------------------------

    def to_hlo_sharding(
        self, mesh: DeviceMesh, rank: int, *, partial_as_replicated: bool = False
    ) -> HloSharding:
        """The XLA sharding of this spec for a rank-`rank` tensor on `mesh`.

        Tile dim d has `shards(d)` tiles; axes that replicate (or hold partial results,
        with `partial_as_replicated`) form the trailing `last_tile_dim_replicate` dim.
        The device order is iota(mesh) transposed so that the axes splitting dim 0
        (outer first) come first, then those splitting dim 1, ..., then the replicating
        axes, e.g. RS0 on 2x4 -> `{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}`.
        """
        from rhino.hlo.sharding import HloSharding

        if self.ndim != mesh.ndim:
            raise SpecError(f"spec {self} has {self.ndim} mesh axes, mesh {mesh} has {mesh.ndim}")
        if not self.is_maximal():
            raise SpecError(
                f"spec {self} has a non-maximal stride, which XLA's HloSharding cannot "
                f"express; rhino.runtime realizes it by rewriting the graph"
            )
        if self.partial_axes() and not partial_as_replicated:
            raise SpecError(
                f"spec {self} holds partial results, which a tensor's HloSharding cannot "
                f"express; pass partial_as_replicated=True for the layout after the reduction"
            )
        for d in self.split_dims():
            if d >= rank:
                raise SpecError(f"spec {self} splits dim {d} of a rank-{rank} tensor")
        if all(self.shards(d, mesh) == 1 for d in range(rank)):
            return HloSharding.replicated()
        perm: list[int] = []
        for d in range(rank):
            perm.extend(self.dim_axes(d))
        rep_axes = [a for a in range(mesh.ndim) if a not in perm]
        perm.extend(rep_axes)
        tile = [self.shards(d, mesh) for d in range(rank)]
        rep = math.prod(mesh.shape[a] for a in rep_axes)
        if rep > 1:
            tile.append(rep)
        devices = _iota_devices(mesh.shape, perm)
        return HloSharding.tiled(tuple(tile), devices, last_tile_dim_replicate=rep > 1)


def _deal(seq: list[int], n: int, stride: int | None, shard: int) -> list[int]:
    """The elements of `seq` that shard `shard` of `n` gets with `stride` (see module)."""
    s = len(seq) // n if stride is None else stride
    return [x for k in range(shard, len(seq) // s, n) for x in seq[k * s : (k + 1) * s]]


# -- iota tile assignments -----------------------------------------------------------------


def canonical_iota(
    dims: Sequence[int], perm: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """XLA's canonical form of the device list `iota(prod(dims)).reshape(dims).transpose(perm)`.

    Size-1 dims are dropped and dims that stay adjacent after the transpose are merged;
    an identity transpose becomes `((N,), ())`, printed `<=[N]`. (HloSharding.tiled
    finds this form itself from the device list; this says which form a spec gets.)
    """
    keep = [i for i, n in enumerate(dims) if n > 1]
    dims_k = [dims[i] for i in keep]
    perm_k = [keep.index(p) for p in perm if p in keep]
    merged = True
    while merged:
        merged = False
        for i in range(len(perm_k) - 1):
            if perm_k[i + 1] == perm_k[i] + 1:
                lo = perm_k[i]
                dims_k[lo : lo + 2] = [dims_k[lo] * dims_k[lo + 1]]
                perm_k = [p if p <= lo else p - 1 for p in perm_k[: i + 1] + perm_k[i + 2 :]]
                merged = True
                break
    n = math.prod(dims)
    if perm_k == sorted(perm_k):
        return (n,), ()
    return tuple(dims_k), tuple(perm_k)


def _iota_devices(dims: Sequence[int], perm: Sequence[int]) -> list[int]:
    """Flattened `iota(prod(dims)).reshape(dims).transpose(perm)`."""
    strides = [math.prod(dims[i + 1 :]) for i in range(len(dims))]
    shape = [dims[p] for p in perm]
    return [
        sum(idx[k] * strides[perm[k]] for k in range(len(perm)))
        for idx in itertools.product(*(range(n) for n in shape))
    ]


# -- HloSharding -> spec -------------------------------------------------------------------


def from_hlo_sharding(sharding: HloSharding, mesh: DeviceMesh, rank: int) -> ShardingSpec:
    """The spec on `mesh` whose layout is `sharding` for a rank-`rank` tensor.

    Any HloSharding that assigns tiles to devices the way some maximal-stride spec does
    maps back, whatever order its replication group lists devices in. Raises `SpecError`
    for maximal (single-device), manual and tuple shardings and for tile assignments no
    spec on this mesh produces.
    """
    from rhino.hlo.sharding import ShardingKind

    kind = sharding.kind
    if kind == ShardingKind.REPLICATED:
        return ShardingSpec.replicated(mesh.ndim)
    if kind != ShardingKind.TILED:
        raise SpecError(f"sharding {sharding} is {kind.name.lower()}, not a tiled SPMD sharding")
    if any(t != "replicated" for t in sharding.subgroup_types):
        raise SpecError(f"sharding {sharding} has subgroups other than replicated")
    tile = tuple(sharding.tile_shape)
    data = tuple(sharding.data_tile_shape())
    if len(data) != rank:
        raise SpecError(f"sharding {sharding} tiles {len(data)} dims, the tensor has rank {rank}")
    devices = list(sharding.devices())
    if sorted(devices) != list(range(mesh.size)):
        raise SpecError(
            f"sharding {sharding} uses devices {sorted(set(devices))[:8]}..., "
            f"mesh {mesh} has devices 0..{mesh.size - 1}"
        )
    want = _tile_of_device(tile, len(data), devices)
    for spec in _specs_with_tiles(data, mesh):
        if dict(enumerate(device_tiles(spec, mesh, rank))) == want:
            return spec
    raise SpecError(f"sharding {sharding} is not the layout of any sharding spec on mesh {mesh}")


def _tile_of_device(tile: Sequence[int], rank: int, devices: Sequence[int]) -> dict[int, tuple]:
    result = {}
    for flat, idx in enumerate(itertools.product(*(range(n) for n in tile))):
        result[devices[flat]] = tuple(idx[:rank])
    return result


@functools.lru_cache(maxsize=4096)
def device_tiles(spec: ShardingSpec, mesh: DeviceMesh, rank: int) -> tuple[tuple[int, ...], ...]:
    """Per device (in id order), the index of the tile it holds along each tensor dim,
    for a maximal-stride spec."""
    result = []
    for device in range(mesh.size):
        coords = mesh.coords(device)
        index = []
        for d in range(rank):
            t = 0
            for a in spec.dim_axes(d):
                t = t * mesh.shape[a] + coords[a]
            index.append(t)
        result.append(tuple(index))
    return tuple(result)


def _specs_with_tiles(data: Sequence[int], mesh: DeviceMesh) -> Iterator[ShardingSpec]:
    """Maximal specs whose per-dim shard counts are `data`, every axis order tried."""
    live = [a for a in range(mesh.ndim) if mesh.shape[a] > 1]
    for perm in itertools.permutations(live):
        axes: list[AxisSpec] = [R] * mesh.ndim
        order: list[int] = []
        rest = list(perm)
        ok = True
        for d, count in enumerate(data):
            product = 1
            while product < count and rest:
                a = rest.pop(0)
                product *= mesh.shape[a]
                axes[a] = Split(d)
                order.append(a)
            if product != count:
                ok = False
                break
        if ok:
            yield ShardingSpec(tuple(axes), tuple(order))


# -- enumeration and parsing -----------------------------------------------------------------


def all_specs(
    shape: Sequence[int],
    mesh: DeviceMesh,
    *,
    partial: bool = False,
) -> list[ShardingSpec]:
    """Every valid maximal-stride spec of `shape` on `mesh`, all split orders included;
    with `partial`, also those with Partial('sum') axes. Sorted by notation."""
    rank = len(shape)
    choices: list[AxisSpec] = [R, *(Split(d) for d in range(rank))]
    if partial:
        choices.append(Partial())
    found: set[ShardingSpec] = set()
    for axes in itertools.product(choices, repeat=mesh.ndim):
        splitting = [a for a, s in enumerate(axes) if isinstance(s, Split)]
        for order in itertools.permutations(splitting):
            spec = ShardingSpec(tuple(axes), order)
            if spec.is_valid(shape, mesh):
                found.add(spec)
    return sorted(found, key=str)


_TOKEN_RE = re.compile(r"R|P(?:\[(\w+)\])?|S(\d+)(?:\[s=(\d+)\])?")


def parse_spec(text: str, mesh_ndim: int | None = None) -> ShardingSpec:
    """Parse the notation of `str(spec)`: tokens R, P, P[op], S<d>, S<d>[s=<stride>],
    one per mesh axis, then optionally ` order=<axis>,<axis>...`."""
    body, _, order_text = text.strip().partition(" order=")
    axes: list[AxisSpec] = []
    pos = 0
    while pos < len(body):
        m = _TOKEN_RE.match(body, pos)
        if m is None:
            raise ConfigError(
                f"sharding spec {text!r}: expected one token per mesh axis "
                f"(R, P, P[op], S<dim>, S<dim>[s=<stride>]) at column {pos + 1}, "
                f"got {body[pos:]!r}"
            )
        if m.group(0) == "R":
            axes.append(R)
        elif m.group(0).startswith("P"):
            op = m.group(1) or "sum"
            if op not in REDUCE_OPS:
                raise ConfigError(f"sharding spec {text!r}: reduction {op!r} not in {REDUCE_OPS}")
            axes.append(Partial(op))
        else:
            stride = int(m.group(3)) if m.group(3) else None
            if stride == 0:
                raise ConfigError(f"sharding spec {text!r}: stride must be >= 1")
            axes.append(Split(int(m.group(2)), stride))
        pos = m.end()
    if not axes:
        raise ConfigError(f"sharding spec {text!r}: expected at least one token")
    if mesh_ndim is not None and len(axes) != mesh_ndim:
        raise ConfigError(
            f"sharding spec {text!r}: expected {mesh_ndim} tokens (one per mesh axis), "
            f"got {len(axes)}"
        )
    order: tuple[int, ...] = ()
    if order_text:
        try:
            order = tuple(int(a) for a in order_text.split(","))
        except ValueError:
            raise ConfigError(
                f"sharding spec {text!r}: expected order=<axis>,<axis>..., got {order_text!r}"
            ) from None
    try:
        return ShardingSpec(tuple(axes), order)
    except SpecError as e:
        raise ConfigError(f"sharding spec {text!r}: {e}") from None
