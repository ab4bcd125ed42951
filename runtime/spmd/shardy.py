"""rhino's layouts as Shardy (sdy dialect) shardings, for the partitioner jax uses.

jax (0.10.2 on) partitions with Shardy: a StableHLO module carries an `sdy.mesh` and,
per value, an `sdy.sharding` that names for each tensor dimension the mesh axes that
split it, major to minor. rhino writes its plan that way too (`rhino plan
--emit-stablehlo`, `rhino run --partitioner shardy`): this module says what each layout
becomes; `xla_bridge.hlo_to_shardy` writes it into the module (nothing here imports jax).

Mesh and axis names. The plan's mesh becomes `sdy.mesh @mesh = <["axis_0"=2,
"axis_1"=4]>`: axis a of rhino's `DeviceMesh` (outermost first, as `--mesh 2x4` lists
them) is `"axis_<a>"`, and device ids are row-major over the mesh, as rhino lays
partitions (partition p is mesh device p). Axes of size 1 split nothing and are left out
of the dimension shardings (the mesh keeps them).

What a layout becomes. A spec's split dims list their mesh axes outermost first
(`ShardingSpec.dim_axes`), which is Shardy's major-to-minor order: `S0S1` on 2x4 for a
matrix is `<@mesh, [{"axis_0"}, {"axis_1"}]>`, `RS0` is `<@mesh, [{"axis_1"}, {}]>`,
`S0S0 order=1,0` is `<@mesh, [{"axis_1", "axis_0"}, {}]>`. Every dimension is closed (no
`?`): Shardy's propagation does not change it, as GSPMD does not change an annotated
instruction's sharding. Axes that replicate are not named (a closed dimension without
them is replicated over them).

What Shardy cannot carry (as GSPMD's HloSharding cannot; the plan's notes list them):
a non-maximal stride (Rhino §4.1: no sdy sharding deals units round-robin; it would take
a sub-axis of a reshaped dimension), and partial sums `P`: a plan's partial result is
what a value holds before the all-reduce XLA inserts itself, not a layout written on the
value. A sharding that is no layout on the plan's mesh (a `{maximal device=...}`, a
manual one, devices in an order no spec gives) is reported by `translate` and dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rhino.hlo.errors import RhinoError, TextError
from rhino.hlo.sharding import HloSharding, ShardingKind, parse_sharding
from rhino.search.mesh import DeviceMesh
from rhino.search.spmd.spec import ShardingSpec, SpecError, from_hlo_sharding

MESH_NAME = "mesh"
"""The symbol of the plan's mesh in the module (`sdy.mesh @mesh`)."""


def axis_name(axis: int) -> str:
    """Mesh axis `axis` of rhino's `DeviceMesh` in Shardy: `axis_0`, `axis_1`, ..."""
    return f"axis_{axis}"


def mesh_axes(mesh: DeviceMesh) -> tuple[tuple[str, int], ...]:
    """The sdy mesh of `mesh`: (name, size) per axis, outermost first."""
    return tuple((axis_name(a), n) for a, n in enumerate(mesh.shape))


def mesh_text(mesh: DeviceMesh) -> str:
    """`sdy.mesh @mesh = <["axis_0"=2, "axis_1"=4]>`."""
    axes = ", ".join(f'"{name}"={size}' for name, size in mesh_axes(mesh))
    return f"sdy.mesh @{MESH_NAME} = <[{axes}]>"


@dataclass(frozen=True)
class TensorSharding:
    """One value's Shardy sharding on the plan's mesh."""

    dims: tuple[tuple[str, ...], ...]
    """Per tensor dimension, the mesh axes that split it, major to minor (empty:
    replicated along that dimension)."""

    def text(self) -> str:
        """The short form `<@mesh, [{"axis_0"}, {}]>` (after `#sdy.sharding`, or inside
        `#sdy.sharding_per_value<[...]>`)."""
        dims = ", ".join("{" + ", ".join(f'"{a}"' for a in axes) + "}" for axes in self.dims)
        return f"<@{MESH_NAME}, [{dims}]>"

    def __str__(self) -> str:
        return f"#sdy.sharding{self.text()}"


def of_spec(spec: ShardingSpec, mesh: DeviceMesh, rank: int) -> TensorSharding:
    """The Shardy sharding of a rank-`rank` tensor laid out as `spec` on `mesh`.

    Raises `SpecError` for a non-maximal stride or partial sums (see module doc), and
    for a spec that does not fit the mesh or the rank."""
    if spec.ndim != mesh.ndim:
        raise SpecError(f"spec {spec} has {spec.ndim} mesh axes, mesh {mesh} has {mesh.ndim}")
    if not spec.is_maximal():
        raise SpecError(f"spec {spec} has a non-maximal stride, which Shardy cannot carry")
    if spec.partial_axes():
        raise SpecError(f"spec {spec} holds partial sums, which a value's sharding cannot carry")
    for d in spec.split_dims():
        if d >= rank:
            raise SpecError(f"spec {spec} splits dim {d} of a rank-{rank} tensor")
    return TensorSharding(
        tuple(
            tuple(axis_name(a) for a in spec.dim_axes(d) if mesh.shape[a] > 1) for d in range(rank)
        )
    )


def of_hlo_sharding(sharding: HloSharding, mesh: DeviceMesh, rank: int) -> TensorSharding:
    """The Shardy sharding of an XLA HloSharding (one array value) on `mesh`.

    Raises `SpecError` for one that is no layout on the mesh (tuple, maximal, manual,
    or devices in an order no spec gives)."""
    if sharding.kind is ShardingKind.TUPLE:
        raise SpecError(f"a tuple sharding {sharding} for one array value")
    return of_spec(from_hlo_sharding(sharding, mesh, rank), mesh, rank)


@dataclass
class Translator:
    """HloSharding text -> Shardy shardings on one mesh (`xla_bridge.ShardingTranslator`).

    Called with the sharding's text and the shapes of the values it is for (one for an
    array, one per result of an op with several): returns one sharding text per value,
    or the reason it cannot (a string). A tuple sharding gives its elements to the
    values in order; a plain one is every value's. Memoized: a module repeats few
    distinct shardings."""

    mesh: DeviceMesh
    _seen: dict[tuple[str, int], TensorSharding | str] = field(default_factory=dict)
    _answers: dict[tuple[str, tuple[int, ...]], list[str] | str] = field(default_factory=dict)
    """(text, the values' ranks) -> the answer: what it depends on."""

    def __call__(self, text: str, shapes: Sequence[tuple[int, ...]]) -> list[str] | str:
        key = (text, tuple(len(shape) for shape in shapes))
        if key not in self._answers:
            self._answers[key] = self._translated(text, shapes)
        found = self._answers[key]
        return found if isinstance(found, str) else list(found)

    def _translated(self, text: str, shapes: Sequence[tuple[int, ...]]) -> list[str] | str:
        try:
            sharding = parse_sharding(text)
        except TextError as e:
            return f"XLA's sharding {text} does not parse: {e}"
        if sharding.kind is ShardingKind.TUPLE:
            elements = list(sharding.elements)
            if len(elements) != len(shapes):
                return f"a tuple sharding of {len(elements)} elements for {len(shapes)} values"
        else:
            elements = [sharding] * len(shapes)
        out = []
        for element, shape in zip(elements, shapes, strict=True):
            found = self.one(element, len(shape))
            if isinstance(found, str):
                return found
            out.append(found.text())
        return out

    def one(self, sharding: HloSharding, rank: int) -> TensorSharding | str:
        key = (str(sharding), rank)
        if key not in self._seen:
            try:
                self._seen[key] = of_hlo_sharding(sharding, self.mesh, rank)
            except RhinoError as e:
                self._seen[key] = f"no Shardy sharding on mesh {self.mesh}: {e}"
        return self._seen[key]
