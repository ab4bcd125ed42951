"""A realized plan's boundary: the layout of every entry parameter and every result, as
PartitionSpecs over named mesh axes, keyed by the JAX pytree path of each parameter.

    boundary(module, plan) -> Boundary      the program `rhino run` compiles, and per
                                            parameter / result its layout
    shardings_document(b, plan, names)      what `rhino plan --emit-shardings` writes

The program is `apply.realized_program(module, plan)`, with one change at the boundary:
an entry parameter, or a ROOT element, whose planned layout has no HloSharding (a
non-maximal stride, Rhino §4.1, or partial sums) takes the *nearest expressible* layout
(`expressible`) instead of the replicated one the annotator would give it. Every other
boundary layout is the plan's, exactly; a ROOT element that is updated state paired
with a parameter returns in that parameter's layout (the plan prices that conversion).

A layout becomes a PartitionSpec (`partition_spec`): per tensor dim, the mesh axes that
split it, outermost first (one name, a tuple of names, or None), over the mesh axis names
given in mesh order (rhino's mesh axis a is the user's a-th axis).

The key of a parameter (`parameter_keys`) comes from the parsed Module, whatever text it
was read from: the `op_name` of its `metadata`, which jax writes as the argument's pytree
path (`params['dense']['kernel']`) when the program is printed with debug info
(`lowered.as_text(dialect="hlo", debug_info=True)`); without that (jax's default dump,
which names the parameter `params__dense____kernel__.1`, a lossy spelling of the path)
the key is the parameter's name.

Nothing here imports jax: `rhino.jax` turns these PartitionSpecs into `NamedSharding`s.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rhino.hlo.errors import ConfigError, RhinoError
from rhino.hlo.ir import Instruction, Module
from rhino.hlo.opcode import Opcode
from rhino.hlo.sharding import HloSharding, ShardingKind
from rhino.runtime.spmd.apply import realized_program
from rhino.search.mesh import DeviceMesh
from rhino.search.spmd.plan import InstructionPlan, Plan
from rhino.search.spmd.spec import (
    Partial,
    Replicate,
    ShardingSpec,
    SpecError,
    Split,
    from_hlo_sharding,
    parse_spec,
)

SHARDINGS_SCHEMA = "rhino.shardings/1"
"""The schema of `rhino plan --emit-shardings`."""

PartitionEntry = str | tuple[str, ...] | None
"""One tensor dim of a PartitionSpec: no mesh axis, one, or several (outermost first)."""


_Planned = Mapping[str, InstructionPlan]
"""The plan's instructions by name."""


@dataclass(frozen=True)
class Layout:
    """Where one entry parameter or result lives on the mesh."""

    name: str
    """The instruction: the parameter, or the ROOT's operand the result comes from."""
    key: str
    """The parameter's pytree path where the module knows it, else its name (results:
    `result[i]`)."""
    dims: tuple[int, ...]
    """Its shape's dimensions."""
    spec: ShardingSpec
    """The layout the program takes or returns it in (always an HloSharding)."""
    planned: str
    """The plan's layout (rhino notation); differs from `spec` only where noted."""
    note: str | None = None
    """Why `spec` is not the planned layout (a stride or partial sums)."""


@dataclass(frozen=True)
class Boundary:
    """The realized program and the layouts at its boundary (see module doc)."""

    program: Module
    """What to compile (the plan's shardings and constraints written in)."""
    inputs: tuple[Layout, ...]
    """One per entry parameter, in parameter-number order."""
    outputs: tuple[Layout, ...]
    """One per array leaf of the ROOT, flattened depth first."""
    notes: tuple[str, ...]
    """The realized program's notes and one per boundary fallback."""
    mesh: DeviceMesh


def boundary(module: Module, plan: Plan) -> Boundary:
    """The program realizing `plan` for `module`, and its boundary layouts (module doc).

    Raises `ConfigError` when the plan is not `module`'s (see `apply.apply_plan`)."""
    program, realized_notes = realized_program(module, plan)
    mesh = plan.mesh
    entry = program.entry
    keys = parameter_keys(module)  # the program has its metadata stripped
    by_name = {inst.name: inst for inst in plan.instructions}
    inputs = []
    for param in entry.parameters:
        planned = _planned_layout(by_name, param)
        layout = _layout(param, keys.get(param.name, param.name), planned, mesh)
        if layout.note is not None:  # the nearest expressible layout, not {replicated}
            param.set_attr("sharding", layout.spec.to_hlo_sharding(mesh, len(layout.dims)))
        inputs.append(layout)
    outputs = _output_layouts(entry.root, by_name, mesh) if entry.root is not None else []
    notes = [*realized_notes]
    notes += [f"{x.key} (%{x.name}): {x.note}" for x in (*inputs, *outputs) if x.note]
    return Boundary(program, tuple(inputs), tuple(outputs), tuple(notes), mesh)


def _planned_layout(plan: _Planned, inst: Instruction) -> str | None:
    planned = plan.get(inst.name)
    if planned is None or len(planned.outs) != 1:
        return None
    return planned.outs[0]


def _layout(inst: Instruction, key: str, planned: str | None, mesh: DeviceMesh) -> Layout:
    """The layout of `inst`'s array value: the `planned` one where XLA can take it, the
    nearest expressible one where not, else (nothing planned) what its `sharding=` says."""
    dims = tuple(inst.shape.dims)
    rank = len(dims)
    if planned is not None:
        spec = parse_spec(planned, mesh.ndim)
        if spec.is_valid(dims, mesh):  # an explicit stride that is the maximal one: none
            spec = spec.normalized(dims, mesh)
        nearest, why = expressible(spec)
        if why is None:
            return Layout(inst.name, key, dims, spec, planned)
        return Layout(
            inst.name,
            key,
            dims,
            nearest,
            planned,
            f"planned {planned} ({why}), which no HloSharding or NamedSharding expresses; "
            f"taken as {nearest}",
        )
    sharding = inst.sharding
    have = _spec_of(sharding, mesh, rank) if sharding is not None else None
    have = have or ShardingSpec.replicated(mesh.ndim)
    return Layout(inst.name, key, dims, have, str(have))


def _spec_of(sharding: HloSharding, mesh: DeviceMesh, rank: int) -> ShardingSpec | None:
    try:
        return from_hlo_sharding(sharding, mesh, rank)
    except SpecError:
        return None


def _output_layouts(root: Instruction, plan: _Planned, mesh: DeviceMesh) -> list[Layout]:
    """Per array leaf of the ROOT: the layout its `sharding=` gives it, or, where the
    plan's layout of the value has no HloSharding, the nearest expressible one (then
    written into the ROOT's sharding)."""
    if root.opcode is Opcode.TUPLE:
        sources = [(op, leaf) for op in root.operands for leaf in op.shape.leaves()]
    else:
        sources = [(root, leaf) for leaf in root.shape.leaves()]
    have = root.sharding
    if have is not None and have.kind is ShardingKind.TUPLE:
        elements: list[HloSharding | None] = list(have.elements)
    else:
        elements = [have] * len(sources)
    layouts = []
    for i, (value, leaf) in enumerate(sources):
        key = f"result[{i}]"
        planned = None if value.shape.is_tuple else _unexpressed(plan, value)
        if planned is not None:
            layouts.append(_layout(value, key, planned, mesh))
            continue
        element = elements[i] if i < len(elements) else None
        spec = _spec_of(element, mesh, leaf.rank) if element is not None else None
        spec = spec or ShardingSpec.replicated(mesh.ndim)
        layouts.append(Layout(value.name, key, tuple(leaf.dims), spec, str(spec)))
    if any(x.note for x in layouts):
        written = [x.spec.to_hlo_sharding(mesh, len(x.dims)) for x in layouts]
        tupled = root.opcode is Opcode.TUPLE or root.shape.is_tuple
        root.set_attr("sharding", HloSharding.tuple_(written) if tupled else written[0])
    return layouts


def _unexpressed(plan: _Planned, inst: Instruction) -> str | None:
    """The plan's layout of `inst` where it has no HloSharding (a stride, partial sums)."""
    planned = plan.get(inst.name)
    if planned is None or planned.sharding is not None or len(planned.outs) != 1:
        return None
    return planned.outs[0]


def expressible(spec: ShardingSpec) -> tuple[ShardingSpec, str | None]:
    """The nearest layout an HloSharding (hence a NamedSharding) expresses, and why
    `spec` is not one (None when it is):

    - a split with a non-maximal stride becomes the maximal split over the same mesh
      axes (each device holds as many elements of that dim, contiguous);
    - a mesh axis holding partial sums becomes replicated (the value after the sum).
    """
    if spec.is_maximal() and not spec.partial_axes():
        return spec, None
    reasons = []
    if not spec.is_maximal():
        reasons.append("a non-maximal stride")
    if spec.partial_axes():
        reasons.append("partial sums")
    axes: list[Replicate | Split | Partial] = []
    for entry in spec.axes:
        if isinstance(entry, Split):
            axes.append(Split(entry.dim))
        elif isinstance(entry, Partial):
            axes.append(Replicate())
        else:
            axes.append(entry)
    order = tuple(a for a in spec.order if isinstance(axes[a], Split))
    return ShardingSpec(tuple(axes), order), " and ".join(reasons)


def partition_spec(
    spec: ShardingSpec, rank: int, axis_names: tuple[str, ...]
) -> tuple[PartitionEntry, ...]:
    """The PartitionSpec of an expressible `spec` for a rank-`rank` tensor: per dim, the
    names of the mesh axes splitting it, outermost first (`("data", None)`;
    `(("data", "model"),)` for a dim split by both)."""
    if len(axis_names) != spec.ndim:
        raise ConfigError(
            f"{len(axis_names)} mesh axis names ({', '.join(axis_names)}) for a layout on "
            f"{spec.ndim} mesh axes"
        )
    if not spec.is_maximal() or spec.partial_axes():
        raise SpecError(f"layout {spec} has no PartitionSpec; take `expressible(spec)` first")
    entries: list[PartitionEntry] = []
    for d in range(rank):
        names = tuple(axis_names[a] for a in spec.dim_axes(d))
        entries.append(None if not names else names[0] if len(names) == 1 else names)
    return tuple(entries)


# --------------------------------------------------------------------------------------
# Keys


_PATH = re.compile(r"[A-Za-z_]\w*(?:$|[\[.])")
"""How a pytree path as jax prints it begins (`params['w']`, `state.step`, `x`); an
op_name such as `jit(step)/dot_general` does not."""


def parameter_keys(module: Module) -> dict[str, str]:
    """Entry parameter name -> its pytree path (`params['dense']['kernel']`), for the
    parameters whose `metadata={op_name=...}` holds one (see module doc)."""
    keys: dict[str, str] = {}
    for param in module.entry.parameters:
        path = _metadata_path(param)
        if path is not None:
            keys[param.name] = path
    seen: dict[str, int] = {}
    for path in keys.values():
        seen[path] = seen.get(path, 0) + 1
    # a path two parameters claim names neither (jax never writes one twice)
    return {name: path for name, path in keys.items() if seen[path] == 1}


def _metadata_path(inst: Instruction) -> str | None:
    if "metadata" not in inst.attrs:
        return None
    try:
        quoted = inst.attr("metadata").get("op_name")
    except RhinoError:  # metadata rhino cannot read names nothing
        return None
    if not quoted or len(quoted) < 2 or quoted[0] != '"' or quoted[-1] != '"':
        return None
    try:  # XLA writes the name C-escaped: params[\'w\']
        name = codecs.escape_decode(quoted[1:-1].encode("utf-8"))[0].decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    return name if _PATH.match(name) and "/" not in name.split("[", 1)[0] else None


def shardings_document(found: Boundary, plan: Plan, axis_names: tuple[str, ...]) -> dict[str, Any]:
    """What `rhino plan --emit-shardings` writes: every entry parameter's PartitionSpec,
    keyed by pytree path (JSON lists for tuples, null for None), the mesh and the notes."""
    if len(axis_names) != found.mesh.ndim:
        raise ConfigError(
            f"axis_names {','.join(axis_names)}: {len(axis_names)} names for the "
            f"{found.mesh.ndim}-axis mesh {found.mesh}",
            option="axis_names",
        )
    if len(set(axis_names)) != len(axis_names):
        raise ConfigError(f"axis_names {','.join(axis_names)}: a name repeats", option="axis_names")

    def as_json(entries: tuple[PartitionEntry, ...]) -> list[Any]:
        return [list(e) if isinstance(e, tuple) else e for e in entries]

    specs: dict[str, list[Any]] = {}
    params = []
    for number, x in enumerate(found.inputs):
        entries = as_json(partition_spec(x.spec, len(x.dims), axis_names))
        specs[x.key if x.key not in specs else x.name] = entries
        params.append(
            {
                "key": x.key,
                "name": x.name,
                "number": number,
                "shape": list(x.dims),
                "layout": str(x.spec),
                "planned": x.planned,
                "partition_spec": entries,
            }
        )
    return {
        "schema": SHARDINGS_SCHEMA,
        "module": plan.module,
        "mesh": {"shape": list(found.mesh.shape), "axis_names": list(axis_names)},
        "partition_specs": specs,
        "parameters": params,
        "notes": list(found.notes),
    }
