"""The one door from rhino into jax/jaxlib: parse, convert, compile, place, execute, time.

Every use of a jax or jaxlib internal in rhino lives in this module, so that a jax upgrade
touches one file (tested: jax == jaxlib, from 0.10.2 to 0.12.0.1, see SUPPORTED_JAX and
runtime/BRIDGE_NOTES.md for what differs between them). jax is imported lazily, inside the
functions, so importing `rhino.runtime.xla_bridge` is cheap and never initializes a
backend. Nothing in `rhino.hlo` or `rhino.search` may import this module.

The compile paths (verified end to end, see runtime/BRIDGE_NOTES.md):

    HLO text --XLA's parser--> HloModule --hlo_to_stablehlo--> StableHLO text
      (sharding={...} annotations become mhlo.sharding attributes)
      --backend.compile_and_load(num_partitions=N, use_spmd_partitioning)--> executable
      whose parameter/output shardings are read back from XLA         (compile_spmd: GSPMD)

    annotated HLO text --hlo_to_shardy--> StableHLO with sdy.mesh, sdy.sharding and
      sdy.sharding_constraint --compile_and_load(..., use_shardy_partitioner)--> the same
      kind of executable                          (compile_shardy: Shardy, jax's default)

Inputs are placed one shard per device (each device receives only its own slice), the
program runs with `execute_sharded`, and outputs come back as global numpy arrays (one
process) or as the local shards with their position in the global array (several).
Several processes (one per host, or several on one host over loopback) join one job
with `init_distributed` before anything else touches jax; they then compile for
`global_devices` and make the same calls in the same order.

Every failure that bad input can cause is an `ExecutionError` (or its subclass
`XlaRejected` when XLA's parser or verifier refuses the text), carrying XLA's message.
In particular, inputs are checked against the executable before it runs: jaxlib 0.10.2
crashes the process (SIGSEGV) when `execute_sharded` receives a buffer of the wrong size.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from rhino.hlo.errors import ExecutionError

if TYPE_CHECKING:  # pragma: no cover
    import jax

Index: TypeAlias = tuple[slice, ...]
"""Where a shard sits in its global array: one slice per dimension."""


class XlaRejected(ExecutionError):
    """XLA's own parser or verifier refused a piece of HLO text.

    Used to check rhino's printer output against XLA, and raised by the compile path
    when the text does not even parse. `line` / `col` are XLA's 1-based position of the
    first syntax error when its message names one, else None.
    """

    def __init__(self, xla_message: str, what: str = "HLO text") -> None:
        self.xla_message = xla_message
        match = re.search(r"was parsing (\d+):(\d+):", xla_message)
        self.line: int | None = int(match.group(1)) if match else None
        self.col: int | None = int(match.group(2)) if match else None
        super().__init__(f"XLA rejected the {what}: {xla_message}")


# --------------------------------------------------------------------------------------
# Parsing and conversion


@dataclass(frozen=True)
class XlaModuleInfo:
    """What XLA's own parser saw in a module."""

    name: str
    """The module name (`HloModule <name>`)."""
    entry: str
    """Name of the entry computation."""
    instruction_count: int
    """Instructions over all computations (entry, reducers, fusions, bodies...)."""
    computation_sizes: Mapping[str, int]
    """Instruction count per computation, in XLA's (post-)order."""
    text: str
    """XLA's re-printed text of the module (canonical names with `%`, layouts added)."""


def xla_parse(text: str) -> XlaModuleInfo:
    """Parse HLO text with XLA's parser and count what it holds.

    The parser checks syntax, names and attribute forms, but not shapes: an `add` whose
    result shape disagrees with its operands is accepted here (use `hlo_to_stablehlo`,
    whose MLIR verifier does check shapes). Raises `XlaRejected` with XLA's message.
    """
    module = _parse_module(text)
    sizes = {c.name: len(c.instructions()) for c in module.computations()}
    printed = module.to_string()
    match = re.search(r"^ENTRY %?([^\s(]+)", printed, re.MULTILINE)
    return XlaModuleInfo(
        name=module.name,
        entry=match.group(1) if match else "",
        instruction_count=sum(sizes.values()),
        computation_sizes=sizes,
        text=printed,
    )


def hlo_to_stablehlo(text: str, *, locations: bool = False) -> str:
    """HLO text -> StableHLO (MLIR) text, through XLA's parser and its MLIR importer.

    `sharding={...}` annotations become `mhlo.sharding = "{...}"` attributes; a ROOT
    tuple becomes several function results. The MLIR verifier runs on the way, so shape
    errors the HLO parser lets through are caught here. With `locations`, every op keeps
    a `loc("<HLO instruction name>")` (or its metadata op_name when it has one), which
    XLA carries into the compiled module as `metadata={op_name="..."}`.
    Raises `XlaRejected`.
    """
    return _stablehlo_of(_parse_module(text), locations=locations)


def xla_parse_only(text: str) -> None:
    """Parse with XLA's parser and nothing else (the speed baseline for rhino's parser)."""
    _parse_module(text)


def _parse_module(text: str) -> Any:
    import jax
    from jax._src.lib import xla_client

    try:
        return xla_client.hlo.hlo_module_from_text(text)
    except jax.errors.JaxRuntimeError as exc:
        raise XlaRejected(_strip_status(str(exc))) from None


def _stablehlo_of(module: Any, *, locations: bool) -> str:
    import jax
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    try:
        data = xla_client._xla.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
        with jax_mlir.make_ir_context():
            return str(ir.Module.parse(data).operation.get_asm(enable_debug_info=locations))
    except (jax.errors.JaxRuntimeError, ir.MLIRError) as exc:
        raise XlaRejected(_strip_status(str(exc)), what="module (HLO -> StableHLO)") from None


def _strip_status(message: str) -> str:
    return re.sub(r"^(INVALID_ARGUMENT|INTERNAL|UNIMPLEMENTED|FAILED_PRECONDITION): ", "", message)


# --------------------------------------------------------------------------------------
# Other inputs: StableHLO / MHLO text (what `jax.jit(f).lower(...).as_text()` prints) and
# serialized HloModuleProtos, converted to HLO text (rhino.runtime.sources reads them)


@dataclass(frozen=True)
class EntryArgument:
    """One argument of a StableHLO module's `@main`, as the module described it."""

    path: str | None
    """Its JAX pytree path (`params['dense']['kernel']`): `jax.arg_info` (older jax) or
    the argument's name location (`as_text(debug_info=True)`); None when the text has
    neither (jax 0.10.2's `as_text()` prints no argument locations). A `jax.arg_info`
    becomes the argument's name location, so the HLO parameter is named after it and
    carries it as `metadata={op_name=...}`, as with a name location."""
    sharding: str | None
    """The `sdy.sharding` / `mhlo.sharding` it carried, as written; removed before the
    conversion."""
    aliased_output: int | None
    """The result it is donated to (`tf.aliasing_output`, or a `jax.buffer_donor` paired
    here with a result of the same type)."""
    donor_unpaired: bool = False
    """A `jax.buffer_donor` for which no result of the same type was left."""


@dataclass(frozen=True)
class EntryResult:
    """One result of a StableHLO module's `@main`."""

    path: str | None
    """`jax.result_info` (`result[0]['dense']['kernel']`), or None."""
    sharding: str | None
    """The `sdy.sharding` / `mhlo.sharding` it carried, as written; removed."""


@dataclass(frozen=True)
class ConvertedModule:
    """A StableHLO module as HLO text, with what the conversion took off it."""

    text: str
    """XLA's HLO text of the module (metadata kept: a name location becomes the
    instruction's name and `metadata={op_name=...}`)."""
    arguments: tuple[EntryArgument, ...]
    """`@main`'s arguments: HLO entry parameter i is argument i."""
    results: tuple[EntryResult, ...]
    """`@main`'s results: leaf i of the HLO entry's result."""
    constraints: int
    """Sharding constraints inside (`sdy.sharding_constraint`, `sdy.reshard`, custom
    call `@Sharding`) whose layout was made replicated (each stays an identity; those
    already replicated, such as jax's on a `jax.random` key, are not counted)."""
    op_shardings: int
    """Other operations' `sdy.sharding` / `mhlo.sharding` attributes, removed."""


class MlirRejected(XlaRejected):
    """The MLIR parser or verifier, or the StableHLO -> HLO conversion, refused a module.

    `message` is the diagnostic; `line` / `col` its 1-based position in the text given
    (None when the diagnostic has none there); `notes` the diagnostic's notes, each
    `(line, col, message)` (line and col None when not in the text)."""

    def __init__(
        self,
        message: str,
        line: int | None = None,
        col: int | None = None,
        notes: tuple[tuple[int | None, int | None, str], ...] = (),
    ) -> None:
        super().__init__(message, what="StableHLO module")
        self.message = message
        self.line, self.col = line, col
        self.notes = notes


_TEXT_LOCATION = re.compile(r'^loc\("-":(\d+):(\d+)\)$')


def stablehlo_to_hlo(text: str | bytes) -> ConvertedModule:
    """StableHLO or MHLO (text, or MLIR bytecode) -> HLO text, the way jax makes its
    `lower().as_text(dialect="hlo")`: the module is parsed in jax's MLIR context and
    legalized by `mlir_module_to_xla_computation`.

    On the way, `@main`'s argument and result attributes are read (pytree paths,
    donation, shardings); shardings are removed from them, sharding constraints inside
    made replicated and other operations' sharding attributes removed (rhino plans every
    layout itself); a `jax.buffer_donor` argument is paired with the first result of the
    same type not yet aliased (as `tf.aliasing_output`, which becomes the HLO module's
    `input_output_alias`). Raises `MlirRejected`, located in `text` where MLIR says.
    """
    import jax
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    with jax_mlir.make_ir_context():
        module = _parse_mlir(text)
        main = _main_function(module)
        arguments, results = _entry_values(main)
        constraints, op_shardings = _replicate_shardings(module.operation)
        try:
            module.operation.verify()
        except ir.MLIRError as exc:
            raise _mlir_rejected(exc) from None
        data = jax_mlir.module_to_bytecode(module)
    try:
        computation = xla_client._xla.mlir.mlir_module_to_xla_computation(
            data, use_tuple_args=False
        )
        hlo = computation.get_hlo_module().to_string()
    except jax.errors.JaxRuntimeError as exc:
        message = _strip_status(str(exc))
        where = re.search(r'loc\("-":(\d+):(\d+)\)', message)
        line, col = (int(where.group(1)), int(where.group(2))) if where else (None, None)
        raise MlirRejected(f"cannot convert it to HLO: {message}", line, col) from None
    return ConvertedModule(hlo, arguments, results, constraints, op_shardings)


def hlo_proto_to_hlo(data: bytes) -> str:
    """A serialized HloModuleProto -> HLO text (metadata kept). Raises `XlaRejected`."""
    import jax
    from jax._src.lib import xla_client

    try:
        return str(xla_client.hlo.HloModule.from_serialized_hlo_module_proto(data).to_string())
    except jax.errors.JaxRuntimeError as exc:
        raise XlaRejected(_strip_status(str(exc)), what="HloModuleProto") from None


def _parse_mlir(text: str | bytes) -> Any:
    """The module in `text`, or `MlirRejected` at the first error's line and column."""
    from jax._src.lib.mlir import ir

    try:
        return ir.Module.parse(text)
    except ir.MLIRError as exc:
        raise _mlir_rejected(exc) from None


def _mlir_rejected(exc: Any) -> MlirRejected:
    """MLIR's error as an `MlirRejected`, located by its first error diagnostic."""
    diagnostics = list(getattr(exc, "error_diagnostics", ()))
    if not diagnostics:
        return MlirRejected(str(exc))
    first = diagnostics[0]
    line, col = _text_position(first.location)
    notes = tuple((*_text_position(n.location), str(n.message)) for n in first.notes)
    if line is None:  # say where MLIR says, then
        return MlirRejected(f"{first.message} (at {first.location})", None, None, notes)
    return MlirRejected(str(first.message), line, col, notes)


def _text_position(location: Any) -> tuple[int | None, int | None]:
    match = _TEXT_LOCATION.match(str(location))
    return (int(match.group(1)), int(match.group(2))) if match else (None, None)


def _main_function(module: Any) -> Any:
    from jax._src.lib.mlir import ir

    functions = [op for op in module.body.operations if op.operation.name == "func.func"]
    for op in functions:
        if ir.StringAttr(op.attributes["sym_name"]).value == "main":
            return op
    names = ", ".join("@" + ir.StringAttr(op.attributes["sym_name"]).value for op in functions)
    raise MlirRejected(
        f"the module has no function @main (jax's entry point); it has {names or 'none'}"
    )


_SHARDING_ATTRS = ("sdy.sharding", "mhlo.sharding")


def _entry_values(main: Any) -> tuple[tuple[EntryArgument, ...], tuple[EntryResult, ...]]:
    """Read `main`'s argument and result attributes, then take the shardings off them and
    turn each `jax.buffer_donor` into a `tf.aliasing_output` where a result fits."""
    from jax._src.lib.mlir import ir

    signature = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
    arg_attrs = _attr_dicts(main, "arg_attrs", len(signature.inputs))
    res_attrs = _attr_dicts(main, "res_attrs", len(signature.results))
    block_args = list(main.regions[0].blocks[0].arguments)
    aliased = {
        int(ir.IntegerAttr(a["tf.aliasing_output"]).value)
        for a in arg_attrs
        if "tf.aliasing_output" in a
    }
    free = [j for j in range(len(signature.results)) if j not in aliased]
    arguments = []
    for i, attrs in enumerate(arg_attrs):
        named = _location_name(block_args[i].location)
        path = _string_attr(attrs.get("jax.arg_info")) or named
        if path is not None and named is None:  # the HLO parameter's name and op_name
            block_args[i].set_location(ir.Location.name(path))
        sharding = _sharding_text(attrs)
        alias = attrs.get("tf.aliasing_output")
        output = int(ir.IntegerAttr(alias).value) if alias is not None else None
        unpaired = False
        if (
            output is None
            and "jax.buffer_donor" in attrs
            and ir.BoolAttr(attrs["jax.buffer_donor"]).value
        ):
            fits = [j for j in free if str(signature.results[j]) == str(signature.inputs[i])]
            if fits:
                output = fits[0]
                free.remove(output)
                del attrs["jax.buffer_donor"]
                attrs["tf.aliasing_output"] = ir.IntegerAttr.get(
                    ir.IntegerType.get_signless(32), output
                )
            else:
                unpaired = True
        arguments.append(EntryArgument(path, sharding, output, unpaired))
    results = [
        EntryResult(_string_attr(attrs.get("jax.result_info")), _sharding_text(attrs))
        for attrs in res_attrs
    ]
    for attrs in (*arg_attrs, *res_attrs):
        for key in _SHARDING_ATTRS:
            attrs.pop(key, None)
    main.attributes["arg_attrs"] = ir.ArrayAttr.get([ir.DictAttr.get(a) for a in arg_attrs])
    main.attributes["res_attrs"] = ir.ArrayAttr.get([ir.DictAttr.get(a) for a in res_attrs])
    return tuple(arguments), tuple(results)


def _attr_dicts(op: Any, key: str, count: int) -> list[dict[str, Any]]:
    from jax._src.lib.mlir import ir

    if key not in op.attributes:
        return [{} for _ in range(count)]
    out = []
    for attr in ir.ArrayAttr(op.attributes[key]):
        d = ir.DictAttr(attr)
        out.append({d[i].name: d[i].attr for i in range(len(d))})
    return out


def _string_attr(attr: Any) -> str | None:
    from jax._src.lib.mlir import ir

    if attr is None:
        return None
    try:
        return str(ir.StringAttr(attr).value)
    except ValueError:  # another kind of attribute
        return None


def _sharding_text(attrs: Mapping[str, Any]) -> str | None:
    for key in _SHARDING_ATTRS:
        if key in attrs:
            return _string_attr(attrs[key]) or str(attrs[key])
    return None


_NAME_LOCATION = re.compile(r'^loc\("((?:[^"\\]|\\.)*)"(?:\(.*\))?\)$', re.DOTALL)


def _location_name(location: Any) -> str | None:
    """The name of a name location (`loc("x")`, `loc("x"(child))`), else None."""
    match = _NAME_LOCATION.match(str(location))
    if match is None:
        return None
    return re.sub(
        r"\\(\\|\"|[0-9A-Fa-f]{2})",
        lambda m: m.group(1) if m.group(1) in ("\\", '"') else chr(int(m.group(1), 16)),
        match.group(1),
    )


_SDY_MESH = re.compile(r"#sdy\.sharding<(.*?),\s*\[", re.DOTALL)
"""The mesh of an `#sdy.sharding<MESH, [dims...]...>`: a symbol or an inline mesh."""


_MANUAL_TARGETS = ('"SPMDFullToShardShape"', '"SPMDShardToFullShape"')
"""The custom calls around a shard_map's body in a GSPMD (`mhlo.sharding`) module."""


def _replicate_shardings(root: Any) -> tuple[int, int]:
    """Make every sharding constraint under `root` replicated; remove the other
    operations' sharding attributes. Returns (constraints that were not replicated,
    attributes removed). Raises `MlirRejected` for a shard_map, which has no
    single-device meaning."""
    from jax._src.lib.mlir import ir

    constraints = removed = 0
    pending = [root]  # depth first, in the text's order (the first shard_map is reported)
    while pending:
        op = pending.pop()
        inside = [o.operation for region in op.regions for b in region.blocks for o in b.operations]
        pending.extend(reversed(inside))
        name = op.name
        attrs = op.attributes
        if name == "sdy.manual_computation" or (
            name == "stablehlo.custom_call" and str(attrs["call_target_name"]) in _MANUAL_TARGETS
        ):
            raise MlirRejected(
                "a shard_map (manual computation) is in the module: its body is already "
                "partitioned by hand, and rhino plans single-device steps (lower the step "
                "without shard_map)",
                *_text_position(op.location),
            )
        if name in ("sdy.sharding_constraint", "sdy.reshard"):
            rank = ir.RankedTensorType(op.results[0].type).rank
            mesh = _SDY_MESH.match(str(op.attributes["sharding"]))
            if mesh is not None:
                dims = ", ".join(["{}"] * rank)
                replicated = ir.Attribute.parse(f"#sdy.sharding<{mesh.group(1)}, [{dims}]>")
                constraints += str(replicated) != str(op.attributes["sharding"])
                op.attributes["sharding"] = replicated
            continue
        if (
            name == "stablehlo.custom_call"
            and "mhlo.sharding" in attrs
            and str(attrs["call_target_name"]) == '"Sharding"'
        ):
            constraints += _string_attr(attrs["mhlo.sharding"]) != "{replicated}"
            attrs["mhlo.sharding"] = ir.StringAttr.get("{replicated}")
            continue
        for key in _SHARDING_ATTRS:
            if key in attrs:
                del attrs[key]
                removed += 1
    return constraints, removed


# --------------------------------------------------------------------------------------
# Shardy: the StableHLO module with sdy shardings (what jax's own lowering emits)


ShardingTranslator: TypeAlias = Callable[[str, Sequence[tuple[int, ...]]], "Sequence[str] | str"]
"""XLA HloSharding text and the shapes of the values it is for -> one sdy tensor sharding
per value in its short form (`<@mesh, [{"axis_0"}, {}]>`), or why it cannot be written."""


@dataclass(frozen=True)
class DroppedSharding:
    """An HloSharding of the converted module that has no sdy form: left out."""

    where: str
    """`%name`: the op's or argument's location (rhino's instruction name, a
    constraint's reader); or `result 0 of @main`."""
    sharding: str
    """The HloSharding text."""
    reason: str


@dataclass(frozen=True)
class ShardyModule:
    """A StableHLO module whose shardings are Shardy's (`sdy.mesh`, `sdy.sharding`,
    `sdy.sharding_constraint`) and none GSPMD's (`mhlo.sharding`)."""

    text: str
    """The module, printed with locations."""
    dropped: tuple[DroppedSharding, ...]
    constraints: int
    """`Sharding` custom calls turned into `sdy.sharding_constraint` ops."""
    pins: int
    """`sdy.sharding_constraint` ops added after annotated ops (one per result)."""


def hlo_to_shardy(
    hlo_text: str,
    mesh_axes: Sequence[tuple[str, int]],
    translate: ShardingTranslator,
    *,
    mesh_name: str = "mesh",
) -> ShardyModule:
    """Annotated HLO text -> StableHLO for Shardy (verified on 0.10.2, see BRIDGE_NOTES.md).

    The module goes through `hlo_to_stablehlo` with locations, then: `sdy.mesh
    @<mesh_name>` with `mesh_axes` (name, size) opens it; every `mhlo.sharding` (on an op,
    on `@main`'s arguments and results, on any function's) becomes `sdy.sharding` as
    `translate` says, and an op's results are read through an `sdy.sharding_constraint`
    to it (Shardy treats an op's own sharding as a hint; a constraint it keeps), except
    in a reducer's or comparator's region; every `Sharding` custom call (a GSPMD
    sharding constraint) becomes an `sdy.sharding_constraint` at the same location (the
    constraints keep their op's location: XLA names the collectives they cause after
    it, as for GSPMD); the module says its partition
    count (`mhlo.num_partitions`, the mesh's size). A sharding `translate` refuses is
    dropped, and a constraint with it removed (its operand read instead): `dropped` says
    where. Raises `XlaRejected` when XLA refuses the HLO text or the result does not
    verify.
    """
    import jax
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    module = _parse_module(hlo_text)
    try:
        data = xla_client._xla.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    except jax.errors.JaxRuntimeError as exc:
        raise XlaRejected(_strip_status(str(exc)), what="module (HLO -> StableHLO)") from None
    with jax_mlir.make_ir_context(), ir.Location.unknown():
        mlir_module = ir.Module.parse(data)
        rewriter = _ShardyRewriter(translate, mesh_name)
        rewriter.add_mesh(mlir_module, mesh_axes)
        for op in mlir_module.body.operations:
            rewriter.rewrite(op.operation)
        size = int(np.prod([n for _, n in mesh_axes], dtype=np.int64))
        i32 = ir.IntegerType.get_signless(32)
        mlir_module.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(i32, size)
        mlir_module.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(i32, 1)
        try:
            mlir_module.operation.verify()
        except ir.MLIRError as exc:
            raise XlaRejected(str(exc), what="module with Shardy shardings") from None
        text = str(mlir_module.operation.get_asm(enable_debug_info=True))
    return ShardyModule(text, tuple(rewriter.dropped), rewriter.constraints, rewriter.pins)


class _ShardyRewriter:
    """`mhlo.sharding` -> sdy, op by op (inside an MLIR context)."""

    def __init__(self, translate: ShardingTranslator, mesh_name: str) -> None:
        from jax._src.lib.mlir import ir
        from jax._src.lib.mlir.dialects import sdy

        self.ir, self.sdy = ir, sdy  # imported once, not per op
        self.translate = translate
        self.mesh_name = mesh_name
        self.dropped: list[DroppedSharding] = []
        self.constraints = 0
        self.pins = 0
        self.attributes: dict[str, Any] = {}
        """Attribute text -> the attribute (uniqued in the context: one parse per text)."""

    def attribute(self, text: str) -> Any:
        found = self.attributes.get(text)
        if found is None:
            found = self.attributes[text] = self.ir.Attribute.parse(text)
        return found

    def add_mesh(self, mlir_module: Any, mesh_axes: Sequence[tuple[str, int]]) -> None:
        from jax._src.lib.mlir import ir

        axes = ", ".join(f'"{name}"={size}' for name, size in mesh_axes)
        mesh = ir.Operation.parse(f"sdy.mesh @{self.mesh_name} = <[{axes}]>")
        ir.InsertionPoint.at_block_begin(mlir_module.body).insert(mesh)

    def shardings(
        self, text: str, types: Sequence[Any], where: Callable[[], str]
    ) -> list[str] | None:
        """The sdy tensor shardings for values of `types`, or None (recorded as dropped,
        at `where()`: read only then; naming every op's location took a tenth of the
        conversion of a 30k-instruction step)."""
        ranked = self.ir.RankedTensorType
        try:
            shapes = [tuple(ranked(t).shape) for t in types]
        except ValueError:  # a token, a tuple: no array to lay out
            if text != "{replicated}":  # which says nothing of one
                kinds = ", ".join(str(t) for t in types)
                self.dropped.append(DroppedSharding(where(), text, f"not an array value ({kinds})"))
            return None
        got = self.translate(text, shapes)
        if isinstance(got, str):
            self.dropped.append(DroppedSharding(where(), text, got))
            return None
        return [f"#sdy.sharding{s}" for s in got]

    def rewrite(self, op: Any) -> None:
        """This op, the ops of its regions, and a function's argument/result attributes."""
        for region in op.regions:
            for block in region.blocks:
                for inner in list(block.operations):
                    self.rewrite(inner.operation)
        if op.name == "func.func":
            self._function(op)
        if "mhlo.sharding" in op.attributes:
            self._op(op)

    def _op(self, op: Any) -> None:
        ir, sdy = self.ir, self.sdy
        text = ir.StringAttr(op.attributes["mhlo.sharding"]).value
        del op.attributes["mhlo.sharding"]
        found = self.shardings(
            text, [r.type for r in op.results], lambda: "%" + _op_name(op.location)
        )
        if _is_sharding_call(op):
            value = op.operands[0]
            if found is not None:
                with ir.InsertionPoint(op), op.location:
                    value = sdy.ShardingConstraintOp(value, self.attribute(found[0])).result
                self.constraints += 1
            op.results[0].replace_all_uses_with(value)
            op.erase()
        elif found is not None:
            per_value = ", ".join(s.removeprefix("#sdy.sharding") for s in found)
            op.attributes["sdy.sharding"] = self.attribute(
                f"#sdy.sharding_per_value<[{per_value}]>"
            )
            if _pinnable(op):
                self._pin(op, found)

    def _pin(self, op: Any, found: list[str]) -> None:
        """Each result of `op` read through a `sdy.sharding_constraint` to its sharding:
        Shardy's propagation overrides an op's own `sdy.sharding` (closed dimensions
        included), but not a constraint (verified, BRIDGE_NOTES.md)."""
        ir, sdy = self.ir, self.sdy
        for result, sharding in zip(op.results, found, strict=True):
            with ir.InsertionPoint.after(op), op.location:
                pinned = sdy.ShardingConstraintOp(result, self.attribute(sharding))
            result.replace_all_uses_except(pinned.result, pinned.operation)
            self.pins += 1

    def _function(self, op: Any) -> None:
        ir = self.ir
        signature = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
        name = ir.StringAttr(op.attributes["sym_name"]).value
        args = op.regions[0].blocks[0].arguments if op.regions[0].blocks else []

        def where(key: str, i: int) -> str:  # named only for a sharding dropped
            if key == "arg_attrs" and i < len(args):
                return f"%{_op_name(args[i].location)}"
            return f"result {i} of @{name}"

        for key, types in (("arg_attrs", signature.inputs), ("res_attrs", signature.results)):
            if key not in op.attributes:
                continue
            rewritten = []
            for i, (attrs, value_type) in enumerate(
                zip(ir.ArrayAttr(op.attributes[key]), types, strict=True)
            ):
                attr_dict = ir.DictAttr(attrs)
                entries = {
                    a.name: a.attr for a in map(attr_dict.__getitem__, range(len(attr_dict)))
                }
                if "mhlo.sharding" in entries:
                    text = ir.StringAttr(entries.pop("mhlo.sharding")).value
                    found = self.shardings(text, [value_type], functools.partial(where, key, i))
                    if found is not None:
                        entries["sdy.sharding"] = self.attribute(found[0])
                rewritten.append(ir.DictAttr.get(entries))
            op.attributes[key] = ir.ArrayAttr.get(rewritten)


_PINNED_IN = frozenset({"func.func", "stablehlo.while", "stablehlo.case", "stablehlo.if"})
"""Ops whose regions hold ordinary program ops (a reducer's or comparator's do not)."""


def _pinnable(op: Any) -> bool:
    """Whether `op` may be followed by a sharding constraint (not inside a reducer)."""
    parent = op.parent
    return parent is not None and parent.name in _PINNED_IN


def _is_sharding_call(op: Any) -> bool:
    from jax._src.lib.mlir import ir

    return (
        op.name == "stablehlo.custom_call"
        and ir.StringAttr(op.attributes["call_target_name"]).value == "Sharding"
    )


def _op_name(location: Any) -> str:
    """`loc("dot.3")` -> dot.3 (the instruction name `hlo_to_stablehlo` kept); another
    location as MLIR prints it."""
    return _location_name(location) or str(location)


# --------------------------------------------------------------------------------------
# Devices


def local_devices(platform: str | None, count: int) -> tuple[Any, ...]:
    """The first `count` devices of `platform` ("cpu", "gpu"; None: jax's default) that
    this process drives. Raises `ExecutionError` when there are fewer."""
    return _first_devices(platform, count, local=True)


def global_devices(platform: str | None, count: int) -> tuple[Any, ...]:
    """Like `local_devices`, but over every process of a `jax.distributed` job: the
    device list to compile for when several processes share one program."""
    return _first_devices(platform, count, local=False)


def _first_devices(platform: str | None, count: int, *, local: bool) -> tuple[Any, ...]:
    import jax

    if count < 1:
        raise ExecutionError(f"need at least 1 device, got a request for {count}")
    try:
        found = jax.local_devices(backend=platform) if local else jax.devices(platform)
    except RuntimeError as exc:
        raise ExecutionError(f"no {platform} platform available to jax: {exc}") from None
    if len(found) < count:
        name = platform or found[0].platform
        hint = (
            f"XLA_FLAGS=--xla_force_host_platform_device_count={count} before rhino starts"
            if name == "cpu"
            else "more visible devices"
        )
        raise ExecutionError(
            f"need {count} devices, have {len(found)} on {name} (set `devices` / {hint})"
        )
    return tuple(found[:count])


def device_count(platform: str | None) -> int:
    """How many devices of `platform` the whole job has (every process's)."""
    import jax

    try:
        return len(jax.devices(platform))
    except RuntimeError as exc:
        raise ExecutionError(f"no {platform} platform available to jax: {exc}") from None


# --------------------------------------------------------------------------------------
# Several processes (jax's distributed runtime)


@dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the job (index 0 of 1 without a distributed runtime)."""

    index: int
    """jax's process index: the `--process-id` it was started with."""
    count: int
    """Processes in the job."""


def backends_started() -> bool:
    """Whether jax has created its backends in this process (after which the device
    count and the distributed runtime can no longer be set). Never imports jax."""
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def set_cpu_device_count(n: int) -> None:
    """Have jax's CPU backend make `n` devices when it starts (`jax_num_cpu_devices`).

    Needed besides `--xla_force_host_platform_device_count` in XLA_FLAGS once anything
    has called into XLA (converting a StableHLO input does): XLA reads its flags once,
    at the first call, and a flag set after that is not seen."""
    import jax

    jax.config.update("jax_num_cpu_devices", n)


TRANSFER_SOCKETS = 4
"""Bulk sockets of a process's transfer server (jax's default count)."""


def init_distributed(
    coordinator: str,
    num_processes: int,
    process_id: int,
    *,
    timeout_s: int = 300,
    heartbeat_s: int = 100,
    address: str | None = None,
    transfer_address: str | None = None,
) -> None:
    """Join a job of `num_processes` processes whose process 0 serves at `coordinator`
    ("host:port"); blocks until all have joined (at most `timeout_s`).

    Must run before anything starts jax's backends (any device query or computation).
    Cross-process CPU collectives go over gloo (TCP), so CPU devices of several
    processes (or hosts) can form one mesh. Afterwards `global_devices` lists every
    process's devices, a program compiled for them runs when every process calls the same
    compiles and executions in the same order, and each process feeds and reads only its
    own partitions. With `transfer_address` ("host:port" the other processes reach this
    one at), arrays also move between processes (`send_to_devices` /
    `receive_from_devices`). Raises `ExecutionError` when the backends already started,
    the arguments are refused, or the coordinator cannot be reached in time.
    """
    import jax

    if backends_started():
        raise ExecutionError(
            "jax's backends are already initialised in this process; the distributed "
            "runtime must start first (run rhino in a fresh process)"
        )
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if transfer_address is not None:
        # jax 0.10.2's CPU client moves arrays between processes (`jax.device_put` to
        # another process's device) through a transfer server at this address
        jax.config.update("jax_cross_host_transfer_socket_address", transfer_address)
        if address is not None:
            # the bulk sockets the data goes over: jax's default binds 0.0.0.0 and tells
            # the peers that, which only a peer on this same machine can connect to
            host = f"[{address}]" if ":" in address else address
            bulk = ",".join([f"{host}:0"] * TRANSFER_SOCKETS)
            jax.config.update("jax_cross_host_transport_addresses", bulk)
    global _service
    host, port = _split(coordinator)
    bind: str | None = None  # where jax's own coordination service listens (jax's default)
    if process_id == 0:
        _check_port_free(None, port, f"the coordinator's port {port}")
        _service = _start_service(port, num_processes, heartbeat_s)
        # jax makes a coordination service in process 0 too: it gets a loopback port
        # nobody connects to, and the job's is `_service`'s
        bind = f"127.0.0.1:{_free_loopback_port()}"
    if transfer_address is not None:
        where, at = _split(transfer_address)
        _check_port_free(where, at, f"the transfer server's port {at} (at {where})")
    joined = threading.Event()
    failed: list[BaseException] = []

    def join() -> None:
        try:
            # jax aborts the process (a stack trace, no message of rhino's) when its
            # client's own timeout passes: it is given more, and this one waits less
            jax.distributed.initialize(
                coordinator,
                num_processes=num_processes,
                process_id=process_id,
                initialization_timeout=timeout_s + JOIN_GRACE_S,
                heartbeat_timeout_seconds=heartbeat_s,
                coordinator_bind_address=bind,
            )
        except BaseException as exc:  # JaxRuntimeError is a RuntimeError
            failed.append(exc)
        finally:
            joined.set()

    threading.Thread(target=join, name="rhino-join", daemon=True).start()
    if not joined.wait(timeout_s):
        raise JoinFailed(
            f"process {process_id} of {num_processes} could not join the job at "
            f"{coordinator} within {timeout_s} s: "
            + _why_not_joined(host, port, process_id, num_processes)
        )
    if failed:
        raise ExecutionError(
            f"process {process_id} of {num_processes} could not join the job at "
            f"{coordinator}: {_strip_status(str(failed[0]))}"
        ) from None
    if address is not None:
        _bind_cpu_collectives(address)


JOIN_GRACE_S = 120
"""Seconds jax's client waits past rhino's join timeout (see `init_distributed`)."""


class JoinFailed(ExecutionError):
    """The job did not gather in time. jax's client is still trying, on a thread of its
    own that no call can stop: the process must end (`os._exit`) rather than return."""


def _split(address: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 host in brackets) -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _check_port_free(host: str | None, port: int, what: str) -> None:
    """ExecutionError when `port` cannot be bound here (on `host`, or every address),
    as the server about to bind it would (address reuse on, as gRPC sets it)."""
    import socket

    family = socket.AF_INET6 if host is None or ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host if host is not None else "::", port))
        except OSError as exc:
            raise ExecutionError(
                f"{what} is in use on this host ({exc.strerror or exc}): stop what holds it, "
                "or choose another port"
            ) from None


def _why_not_joined(host: str, port: int, process_id: int, count: int) -> str:
    """What a connection to the coordinator shows, for a job that did not gather."""
    import socket

    start = f"start the same command on each of the {count} hosts, with --num-processes "
    start += f"{count} and its own --process-id"
    if process_id == 0:
        return f"not every process joined ({start})"
    try:
        with socket.create_connection((host, port), timeout=2.0):
            pass
    except ConnectionRefusedError:
        return f"nothing serves there, connection refused (is process 0 started? {start})"
    except TimeoutError:
        return "the coordinator does not answer (connection timed out): check the address"
    except OSError as exc:
        return f"the coordinator cannot be reached ({exc.strerror or exc}): check the address"
    return f"the coordinator answers, but not every process joined ({start})"


def _bind_cpu_collectives(address: str) -> None:
    """The CPU backend's gloo collectives listen at `address` (this host as the others
    reach it). jax's default lets gloo take the address its host name resolves to, which
    is 127.0.0.1 on many machines (a line "127.0.0.1 <hostname>" in /etc/hosts): peers on
    other hosts are then told to connect to their own loopback, and the first collective
    times out. jax 0.10.2 to 0.12.0.1 register the CPU client as
    `make_cpu_client(collectives=None)`; registered again with gloo bound here, before
    any backend starts."""
    from functools import partial

    from jax._src import distributed
    from jax._src import xla_bridge as jax_bridge
    from jax._src.lib import _jax

    collectives = _jax.make_gloo_tcp_collectives(
        distributed_client=distributed.global_state.client, hostname=address
    )
    jax_bridge.register_backend_factory(
        "cpu",
        partial(jax_bridge.make_cpu_client, collectives=collectives),
        priority=0,
        fail_quietly=False,
    )


@contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    """Send what native code writes on file descriptor 1 to stderr meanwhile.

    gloo prints "[Gloo] Rank 0 is connected to 1 peer ranks..." on stdout when a
    cross-process collective first runs; stdout must carry only rhino's report (--json).
    """
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def shutdown_distributed() -> None:
    """Leave the job (waits for the other processes); nothing without one."""
    import jax

    jax.distributed.shutdown()
    stop_service()


SERVICE_LINGER_S = 10.0
"""Seconds the job's coordination service outlives process 0 when that dies: the other
processes' watches (`JobWatch`, LOST_S) notice it gone and stop, naming it, before the
service goes (with it, jax would abort them at once)."""
_service: Any = None
"""Process 0's coordination service process (`_start_service`), while it runs."""
_SERVICE = """
import os, sys, time
from jax._src.lib import _jax
port, count, heartbeat, linger = sys.argv[1:]
service = _jax.get_distributed_runtime_service(
    f"[::]:{port}", int(count), heartbeat_timeout=int(heartbeat)
)
print("serving", flush=True)
# "now": process 0 leaves on purpose, and the service goes with it (its end of the pipe
# closes when it has); nothing: process 0 died, and the others need time to say so
if sys.stdin.readline().strip() == "now":
    sys.stdin.read()
else:
    time.sleep(float(linger))
os._exit(0)
"""


def _start_service(port: int, count: int, heartbeat_s: int) -> Any:
    """The job's coordination service (jax's) in a process of its own, for process 0.
    In process 0 itself (jax's way), its death would take the service with it, and
    jax's client aborts every other process at once, with a stack trace; on its own, it
    outlives process 0 by SERVICE_LINGER_S, and the others stop saying why. Process 0
    stops it when it leaves the job (`shutdown_distributed`, `leave_if_abandoned`)."""
    import subprocess

    argv = [sys.executable, "-c", _SERVICE, str(port), str(count), str(heartbeat_s)]
    argv += [str(SERVICE_LINGER_S)]
    process = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdout is not None
    if process.stdout.readline().strip() != b"serving":
        process.kill()
        process.wait()
        raise ExecutionError(f"the job's coordination service did not start on port {port}")
    return process


def stop_service() -> None:
    """Stop process 0's coordination service process, if it runs (`_start_service`),
    once this process has left the job."""
    global _service
    if _service is not None:
        _service.kill()
        _service.wait()
        _service = None


def release_service() -> None:
    """Have process 0's coordination service end with this process, which is about to
    exit at once (`os._exit`): stopped now, it would make jax's client here abort with a
    stack trace first."""
    if _service is not None and _service.stdin is not None:
        try:
            _service.stdin.write(b"now\n")
            _service.stdin.flush()
        except OSError:
            pass


def _free_loopback_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


FAILED_GRACE_S = 2.0
"""Seconds a process that sees another fail waits before it stops (`JobWatch`)."""
LAST_OUT_S = 3.0
"""Seconds process 0 waits, leaving a job on a failure, for the others to leave first
(`leave_if_abandoned`)."""
_abandoned: JobWatch | None = None
"""The watch of the job this process left on a failure (`JobWatch.stop`), if it did."""


def leave_if_abandoned(code: int) -> None:
    """End the process now with `code` if it left a job on a failure: jax's shutdown
    (or its client's destructor at exit) would wait at a barrier for the others, who
    may be gone or blocked. Process 0 serves the job: once it is gone, jax aborts every
    other process at once, before it can say why it stops; so it lets them leave first
    (at most LAST_OUT_S). Nothing when the process left no job on a failure."""
    if _abandoned is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if _abandoned.index == 0:
        _abandoned.wait_for_others(LAST_OUT_S)
    release_service()
    os._exit(code)


class JobWatch:
    """Each process of a job says it is alive every `beat_s` through the coordinator's
    key-value store and checks that the others do. A process none of whose beats arrive
    for `lost_s` (it died, or its host is unreachable), or a coordinator that does not
    answer for `lost_s`, ends this process at once through `on_lost` with a message
    naming it: its main thread may be blocked in a collective that never returns.
    `lost_s` is below jax's own heartbeat timeout, which otherwise aborts the process
    with a stack trace. A process that finished says so (`stop`): the others do not wait
    for its beats while they finish."""

    def __init__(
        self,
        address: str,
        lost_s: float,
        on_lost: Callable[[str], None],
        beat_s: float = 0.5,
    ) -> None:
        from jax._src import distributed

        client = distributed.global_state.client
        if client is None:
            raise ExecutionError("JobWatch: this process is in no job (init_distributed)")
        self._client: Any = client
        self._info = process_info()
        self._lost_s = lost_s
        self._beat_s = beat_s
        self._on_lost = on_lost
        self._stopped = threading.Event()
        self._heard: dict[int, float] = {}
        self._client.key_value_set(f"rhino/address/{self._info.index}", address)
        self._thread = threading.Thread(target=self._watch, name="rhino-job-watch", daemon=True)
        self._thread.start()

    def stop(self, failure: str | None = None) -> None:
        """This process is done (`failure`: it failed, so): stop watching, and tell the
        others, who stop too on a failure (they may be waiting in a collective for this
        process)."""
        global _abandoned
        self._stopped.set()
        self._thread.join()
        if failure is not None:
            _abandoned = self
        try:
            self._client.key_value_set(
                f"rhino/beat/{self._info.index}",
                "done" if failure is None else f"failed: {failure}",
                allow_overwrite=True,
            )
        except RuntimeError:
            pass  # the coordinator is gone: nobody is left to tell

    def _watch(self) -> None:
        me, count = self._info.index, self._info.count
        start = time.monotonic()
        heard = self._heard = dict.fromkeys(range(count), start)  # when its beat last changed
        last: dict[int, str | None] = {}
        failed: dict[int, float] = {}  # process -> when it was first seen failed
        answered = start  # when the coordinator last answered
        beat = 0
        while not self._stopped.wait(self._beat_s):
            now = time.monotonic()
            beat += 1
            try:
                self._client.key_value_set(f"rhino/beat/{me}", str(beat), allow_overwrite=True)
                seen = {p: self._try_get(f"rhino/beat/{p}") for p in range(count) if p != me}
            except RuntimeError as exc:
                if now - answered > self._lost_s:
                    self._lost(
                        f"process {me} lost the job's coordinator (process 0): no answer "
                        f"for {self._lost_s:g} s ({_strip_status(str(exc)).splitlines()[0]})"
                    )
                continue
            answered = now
            for p, value in seen.items():
                if value == "done":
                    heard[p] = now
                elif value is not None and value.startswith("failed: "):
                    # a moment first: this process may be failing the same way itself
                    # (processes that disagree on the job), and then says so on its own
                    if now - failed.setdefault(p, now) > FAILED_GRACE_S:
                        self._lost(
                            f"process {me} stops: process {p} of {count} failed "
                            f"({value.removeprefix('failed: ')})"
                        )
                elif value != last.get(p):
                    last[p], heard[p] = value, now
                elif now - heard[p] > self._lost_s:
                    where = self._try_get(f"rhino/address/{p}")
                    self._lost(
                        f"process {me} lost process {p} of {count}"
                        + (f" (at {where})" if where else "")
                        + f": no sign of life for {self._lost_s:g} s (it died, or its host "
                        "is unreachable); every process of the job stops"
                    )

    @property
    def index(self) -> int:
        return self._info.index

    def wait_for_others(self, timeout_s: float) -> None:
        """Wait until every other process has said it is done or failed, and a moment
        more for it to exit (at most `timeout_s`)."""
        end = time.monotonic() + timeout_s
        others = [p for p in range(self._info.count) if p != self._info.index]
        while time.monotonic() < end:
            try:
                said = [self._try_get(f"rhino/beat/{p}") or "" for p in others]
            except RuntimeError:
                return
            if all(v == "done" or v.startswith("failed: ") for v in said):
                time.sleep(min(0.5, max(0.0, end - time.monotonic())))
                return
            time.sleep(0.1)

    def confirm(self, timeout_s: float) -> None:
        """Wait until every other process has shown a sign of life since this call (or
        finished), so that an error just seen here is this process's own; where one
        is lost meanwhile, `on_lost` ends this process first. After `timeout_s`,
        return anyway."""
        since = time.monotonic()
        # a beat written just before a process died may be read just after this call:
        # only one read two beats later is a sign of life after it
        after = since + 2 * self._beat_s
        while time.monotonic() - since < timeout_s and not self._stopped.is_set():
            if all(t > after for p, t in self._heard.items() if p != self._info.index):
                return
            time.sleep(self._beat_s / 2)

    def _try_get(self, key: str) -> str | None:
        try:
            return str(self._client.key_value_try_get(key))
        except RuntimeError as exc:
            if "NOT_FOUND" in str(exc) or "not found" in str(exc).lower():
                return None
            raise

    def _lost(self, message: str) -> None:
        self._stopped.set()
        self._on_lost(message)


def process_info() -> ProcessInfo:
    """This process's index and the job's process count (starts no backend)."""
    if "jax" not in sys.modules:
        return ProcessInfo(0, 1)
    from jax._src import distributed

    state = distributed.global_state
    if state.client is None:
        return ProcessInfo(0, 1)
    return ProcessInfo(int(state.process_id), int(state.num_processes))


_agreements = itertools.count()
"""Sequence number of `check_agreement` calls: keys stay unique, and they match across
processes because every process makes the same calls in the same order."""


def check_agreement(what: str, value: str, *, timeout_s: int = 300) -> None:
    """Raise `ExecutionError` unless every process of the job passed the same `value`
    (`what` names it in the message, e.g. a digest of the program and its options).

    Guards collectives against processes that run different programs (they would hang
    or crash inside XLA). Goes through the coordinator's key-value store; a no-op in a
    job of one process. Every process must call it, in the same order.
    """
    info = process_info()
    theirs = _exchange(what, value, timeout_s)
    differ = {p: v for p, v in theirs.items() if v != value}
    if differ:
        p, v = min(differ.items())
        raise ExecutionError(
            f"process {info.index} and process {p} disagree on the {what} ({value} here, "
            f"{v} there): every process of the job must be given the same"
        )


def check_same_job(fields: Mapping[str, str], *, timeout_s: int = 300) -> None:
    """`check_agreement` of several named values at once (e.g. "rhino version", "HLO
    module (sha256)"): the message names each one that differs, with both values."""
    import json

    info = process_info()
    mine = json.dumps(dict(fields), sort_keys=True)
    theirs = _exchange("job (versions, module, plan, options)", mine, timeout_s)
    for p, text in sorted(theirs.items()):
        other = json.loads(text)
        differ = [k for k in fields if other.get(k) != fields[k]]
        if differ:
            raise ExecutionError(
                f"process {info.index} and process {p} differ in their "
                + "; ".join(f"{k} ({fields[k]} here, {other.get(k)} there)" for k in differ)
                + ": every process of the job must run the same rhino and jax on the same "
                "HLO, plan and options"
            )


def _exchange(what: str, value: str, timeout_s: int) -> dict[int, str]:
    """Every process's `value` (this one's included) through the key-value store, in
    a job of several; {} alone."""
    from jax._src import distributed

    client = distributed.global_state.client
    info = process_info()
    if client is None or info.count == 1:
        return {}
    key = f"rhino/agree/{next(_agreements)}"
    try:
        client.key_value_set(f"{key}/{info.index}", value)
        return {
            p: client.blocking_key_value_get(f"{key}/{p}", timeout_s * 1000)
            for p in range(info.count)
        }
    except RuntimeError as exc:
        raise ExecutionError(
            f"process {info.index}: the other processes did not report their {what} "
            f"within {timeout_s} s: {_strip_status(str(exc))}"
        ) from None


# --------------------------------------------------------------------------------------
# Compiling


@dataclass(frozen=True)
class ArraySpec:
    """One parameter or output of a compiled program, as XLA laid it out."""

    shape: tuple[int, ...]
    """Global (unpartitioned) dimensions."""
    dtype: np.dtype[Any]
    """Element type as numpy sees it (bfloat16 etc. via ml_dtypes)."""
    sharding: str
    """XLA's HloSharding text for it, e.g. `{devices=[2,1,4]<=[8] last_tile_dim_replicate}`."""
    shard_shape: tuple[int, ...]
    """Dimensions of the piece each device holds."""


@dataclass(frozen=True)
class MemoryStats:
    """XLA's buffer-assignment sizes for ONE device's program (the same program runs on
    every partition), in bytes."""

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    """Output bytes that alias (reuse) argument buffers."""
    temp_bytes: int
    """Scratch buffers live during the step."""
    generated_code_bytes: int
    peak_bytes: int
    """XLA's estimate of the most bytes live at once (not the plain sum of the above)."""


@dataclass(frozen=True)
class Compiled:
    """An SPMD executable loaded on `devices`, partition p running on devices[p]."""

    name: str
    """Module name."""
    devices: tuple[Any, ...]
    """jax devices, in partition order (logical id p in replica_groups is devices[p])."""
    parameters: tuple[ArraySpec, ...]
    outputs: tuple[ArraySpec, ...]
    """One per result; a ROOT tuple is flattened (nested tuples too)."""
    executable: Any = field(repr=False, compare=False)
    """jaxlib LoadedExecutable."""
    _in_shardings: tuple[Any, ...] = field(repr=False, compare=False)
    _out_shardings: tuple[Any, ...] = field(repr=False, compare=False)
    donates: bool = False
    """The program's outputs may reuse its arguments' buffers (`input_output_alias`, as a
    step jitted with `donate_argnums` has): a run consumes its placed inputs."""
    partitioner: str = "gspmd"
    """The XLA partitioner that compiled it: "gspmd" (`compile_spmd`) or "shardy"
    (`compile_shardy`)."""

    @property
    def num_partitions(self) -> int:
        return len(self.devices)

    @property
    def addressable(self) -> tuple[int, ...]:
        """Partitions whose device this process drives (all of them in one process)."""
        import jax

        me = jax.process_index()
        return tuple(p for p, d in enumerate(self.devices) if d.process_index == me)

    def partitioned_hlo(self) -> str:
        """The module after SPMD partitioning and optimization: per-device shapes, and
        the collectives XLA inserted (the measured communication)."""
        return str(self.executable.hlo_modules()[0].to_string())

    def memory_stats(self) -> MemoryStats:
        """Per-device sizes from XLA's buffer assignment (reported on CPU too)."""
        stats = self.executable.get_compiled_memory_stats()
        return MemoryStats(
            argument_bytes=int(stats.argument_size_in_bytes),
            output_bytes=int(stats.output_size_in_bytes),
            alias_bytes=int(stats.alias_size_in_bytes),
            temp_bytes=int(stats.temp_size_in_bytes),
            generated_code_bytes=int(stats.generated_code_size_in_bytes),
            peak_bytes=int(stats.peak_memory_in_bytes),
        )

    def cost_analysis(self) -> dict[str, float]:
        """XLA's per-device cost analysis ("flops", "bytes accessed", ...)."""
        return {str(k): float(v) for k, v in dict(self.executable.cost_analysis()).items()}


def compile_spmd(
    hlo_text: str, devices: Sequence[Any], *, num_partitions: int, optimize: bool = True
) -> Compiled:
    """Compile annotated HLO text for `num_partitions` SPMD partitions on `devices`.

    Sharding annotations in the text drive XLA's GSPMD partitioner (which logs that its
    propagation will be deprecated; `compile_shardy` is the Shardy path); unannotated
    instructions get shardings by XLA's propagation. Instructions of the partitioned
    module, collectives included, carry `metadata={op_name="<original name>"}` naming the
    instruction they came from (an instruction with its own metadata op_name keeps that).
    num_partitions=1 compiles the plain single-device program. Devices may belong to
    several processes (`global_devices`).
    Raises `XlaRejected` when the text does not parse, `ExecutionError` on any compile
    failure (XLA's message included) or on a program rhino cannot feed (tuple-shaped
    parameters, uneven shards). `optimize=False` turns the backend's (LLVM's)
    optimizations off for this compile: it takes about 40% less time, the program runs
    slower (for checks of numerics, not for timings).
    """
    from jax._src.lib import xla_client

    devices = tuple(devices)
    if num_partitions != len(devices):
        raise ExecutionError(
            f"num_partitions={num_partitions} but {len(devices)} devices were given"
        )
    module = _parse_module(hlo_text)
    program = xla_client.XlaComputation(module.as_serialized_hlo_module_proto()).program_shape()
    mlir_text = _stablehlo_of(module, locations=True)
    executable = _compile_mlir(module.name, mlir_text, devices, optimize=optimize, shardy=False)
    return _describe(
        module.name, devices, executable, program, donates=bool(_ALIASING.search(hlo_text))
    )


@functools.lru_cache(maxsize=1)
def compile_reference(hlo_text: str, device: Any) -> Compiled:
    """`compile_spmd(hlo_text, [device], num_partitions=1)`: the single-device program a
    run is verified against, compiled once per text and device in a process (the last
    one is kept). The runs of one module in one process (a script's or a test's, of
    several plans) then compile it once: on a corpus step, 3.5 s of each `rhino run`."""
    return compile_spmd(hlo_text, (device,), num_partitions=1)


def compile_shardy(mlir_text: str, devices: Sequence[Any], *, optimize: bool = True) -> Compiled:
    """Compile a StableHLO module with Shardy shardings (`hlo_to_shardy`'s, or jax's own
    lowering's) for one SPMD partition per device of `devices`, through XLA's Shardy
    partitioner (`use_shardy_partitioner`): no GSPMD propagation, no deprecation warning.

    The module's `sdy.mesh` must have as many devices as `devices`; its axes lie on them
    row-major (partition p is devices[p]). Returns the same `Compiled` as `compile_spmd`
    (collectives carry the op_name of the location they came from). Raises
    `XlaRejected` when the text does not parse as MLIR, `ExecutionError` as
    `compile_spmd` does; a module that still holds GSPMD `mhlo.sharding` attributes is
    refused (XLA would quietly fall back to GSPMD propagation for it).
    """
    from jax._src.lib import xla_client

    devices = tuple(devices)
    if "mhlo.sharding" in mlir_text:
        raise ExecutionError(
            "the module holds GSPMD shardings (mhlo.sharding), with which XLA disables "
            "Shardy; convert them (xla_bridge.hlo_to_shardy) or use compile_spmd"
        )
    for mesh, axes in _SDY_MESH_DECLARATION.findall(mlir_text):
        size = int(np.prod([int(n) for n in re.findall(r"=\s*(\d+)", axes)], dtype=np.int64))
        if size not in (1, len(devices)):
            raise ExecutionError(
                f"the module's mesh @{mesh} has {size} devices, but {len(devices)} were given"
            )
    try:
        computation = xla_client._xla.mlir.mlir_module_to_xla_computation(
            mlir_text.encode(), use_tuple_args=False, return_tuple=False
        )
    except Exception as exc:  # jaxlib raises a plain ValueError/RuntimeError here
        raise XlaRejected(_strip_status(str(exc)), what="StableHLO module") from None
    name = str(computation.name())
    executable = _compile_mlir(name, mlir_text, devices, optimize=optimize, shardy=True)
    donates = "tf.aliasing_output" in mlir_text or bool(_MLIR_ALIASING.search(mlir_text))
    compiled = _describe(name, devices, executable, computation.program_shape(), donates=donates)
    return replace(compiled, partitioner="shardy")


_SDY_MESH_DECLARATION = re.compile(r"^\s*sdy\.mesh @([\w.$-]+) = <\[([^\]]*)\]", re.MULTILINE)
"""An sdy mesh and its axes (`"axis_0"=2, "axis_1"=4`) in a module's text."""
_MLIR_ALIASING = re.compile(r"mhlo\.input_output_alias = \[[^\]]")


def _compile_mlir(
    name: str, mlir_text: str, devices: tuple[Any, ...], *, optimize: bool, shardy: bool
) -> Any:
    """XLA's SPMD compile of a StableHLO module, one partition per device."""
    import jax
    from jax._src.lib import xla_client

    options = xla_client.CompileOptions()
    build = options.executable_build_options
    build.num_replicas = 1
    build.num_partitions = len(devices)
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = shardy
    # Global device ids, not 0..N-1: in a multi-process job they are e.g. 0-3, 2048-2051.
    ids = np.array([[d.id for d in devices]], dtype=np.int32)
    build.device_assignment = xla_client.DeviceAssignment.create(ids)
    if not optimize:
        build.debug_options.xla_backend_optimization_level = 0
    backend = _backend_of(devices)
    try:
        return backend.compile_and_load(mlir_text, xla_client.DeviceList(devices), options)
    except jax.errors.JaxRuntimeError as exc:
        raise ExecutionError(
            f"XLA failed to compile {name} for {len(devices)} partition(s): "
            f"{_strip_status(str(exc))}"
        ) from None


_ALIASING = re.compile(r"^HloModule [^\n]*\binput_output_alias=\{", re.MULTILINE)


def _backend_of(devices: tuple[Any, ...]) -> Any:
    import jax.extend

    return jax.extend.backend.get_backend(devices[0].platform)


def _describe(
    name: str, devices: tuple[Any, ...], executable: Any, program: Any, *, donates: bool
) -> Compiled:
    """Read back what XLA decided: per-parameter/output sharding, shapes, layouts."""
    from jax._src.lib import xla_client

    in_shapes = list(program.parameter_shapes())
    for i, shape in enumerate(in_shapes):
        if shape.is_tuple():
            raise ExecutionError(
                f"{name}: parameter {i} is a tuple {shape}; rhino executes only programs "
                f"with array parameters"
            )
    out_shapes = _flatten_shape(program.result_shape())
    partitioned = executable.hlo_modules()[0].as_serialized_hlo_module_proto()
    local = xla_client.XlaComputation(partitioned).program_shape()
    local_in = list(local.parameter_shapes())
    local_out = _flatten_shape(local.result_shape())

    device_list = xla_client.DeviceList(devices)
    in_protos = _shardings_or_replicated(executable.get_parameter_shardings(), len(in_shapes))
    out_protos = _shardings_or_replicated(executable.get_output_shardings(), len(out_shapes))
    if len(devices) == 1:  # the partitioner does not run; XLA reports no shardings
        in_protos = [None] * len(in_shapes)
        out_protos = [None] * len(out_shapes)
    if len(in_protos) != len(in_shapes) or len(out_protos) != len(out_shapes):
        raise ExecutionError(
            f"{name}: XLA reports {len(in_protos)} parameter / {len(out_protos)} output "
            f"shardings for {len(in_shapes)} parameters / {len(out_shapes)} outputs"
        )

    params = [
        _array_spec(f"{name}: parameter {i}", device_list, *shapes)
        for i, shapes in enumerate(zip(in_shapes, local_in, in_protos, strict=True))
    ]
    outs = [
        _array_spec(f"{name}: output {i}", device_list, *shapes)
        for i, shapes in enumerate(zip(out_shapes, local_out, out_protos, strict=True))
    ]
    _check_default_layouts(name, executable, params, outs)
    return Compiled(
        name=name,
        devices=devices,
        parameters=tuple(p for p, _ in params),
        outputs=tuple(o for o, _ in outs),
        executable=executable,
        _in_shardings=tuple(s for _, s in params),
        _out_shardings=tuple(s for _, s in outs),
        donates=donates,
    )


def _array_spec(
    what: str, device_list: Any, shape: Any, local_shape: Any, proto: Any
) -> tuple[ArraySpec, Any]:
    """The spec of one parameter/output and the jax sharding that places it.

    The jax sharding is built over the executable's own device list (as jax's pjit
    does), so arrays made with it hold their buffers in partition order, which is the
    order `execute_sharded` expects.
    """
    from jax._src.lib import xla_client
    from jax._src.sharding import IndivisibleError
    from jax._src.sharding_impls import GSPMDSharding

    hlo_sharding = (
        xla_client.HloSharding.replicate()
        if proto is None
        else xla_client.HloSharding.from_proto(proto)
    )
    sharding = GSPMDSharding(device_list, hlo_sharding)
    dims = tuple(int(d) for d in shape.dimensions())
    got = tuple(int(d) for d in local_shape.dimensions())
    try:
        want = tuple(int(d) for d in sharding.shard_shape(dims))
    except IndivisibleError:
        want = ()
    if want != got:
        raise ExecutionError(
            f"{what} {shape} has sharding {hlo_sharding} and per-device shape "
            f"{local_shape} (XLA pads uneven shards); rhino executes only shardings that "
            f"divide every dimension evenly"
        )
    return ArraySpec(dims, np.dtype(shape.numpy_dtype()), str(hlo_sharding), got), sharding


def _flatten_shape(shape: Any) -> list[Any]:
    if shape.is_tuple():
        return [leaf for element in shape.tuple_shapes() for leaf in _flatten_shape(element)]
    return [shape]


def _shardings_or_replicated(protos: Sequence[Any] | None, count: int) -> list[Any]:
    if not protos:
        return [None] * count
    # XLA reports one sharding for a whole output tuple when all its elements share it.
    if len(protos) == 1 and count > 1:
        return list(protos) * count
    return list(protos)


def _check_default_layouts(
    name: str,
    executable: Any,
    params: list[tuple[ArraySpec, Any]],
    outs: list[tuple[ArraySpec, Any]],
) -> None:
    """Inputs are built and outputs read in row-major layout; refuse anything else."""
    for kind, specs, layouts in (
        ("parameter", params, executable.get_parameter_layouts()),
        ("output", outs, executable.get_output_layouts()),
    ):
        for i, ((spec, _), layout) in enumerate(zip(specs, layouts, strict=True)):
            default = "{" + ",".join(str(d) for d in reversed(range(len(spec.shape)))) + "}"
            if spec.shape and str(layout) != default:
                raise ExecutionError(
                    f"{name}: {kind} {i} has layout {layout}, expected row-major {default}"
                )


# --------------------------------------------------------------------------------------
# Placing inputs, executing, timing


@dataclass(frozen=True)
class DeviceShards:
    """An input given piece by piece: partition index -> the array that device holds.

    Must cover exactly the partitions this process drives (`Compiled.addressable`)."""

    by_partition: Mapping[int, np.ndarray]


ShardFn: TypeAlias = Callable[[Index], np.ndarray]
"""An input given as a function from a shard's global index to its data (called once per
addressable device; the global array never exists). Useful for large models."""

Input: TypeAlias = "np.ndarray | DeviceShards | ShardFn"
"""A global numpy array (sliced per device), per-device shards, or a shard function."""


@dataclass(frozen=True)
class Shard:
    """One device's piece of an output."""

    partition: int
    """Logical partition id (index into `Compiled.devices`)."""
    index: Index
    """Where the piece sits in the global array."""
    data: np.ndarray


def place(compiled: Compiled, inputs: Sequence[Input]) -> list[jax.Array]:
    """Put every input on the devices, each device receiving only its own shard, laid out
    as the executable's parameter shardings say. Checks shapes and dtypes first."""
    import jax

    if len(inputs) != len(compiled.parameters):
        raise ExecutionError(
            f"{compiled.name} takes {len(compiled.parameters)} inputs, got {len(inputs)}"
        )
    placed: list[jax.Array] = []
    for i, (value, spec, sharding) in enumerate(
        zip(inputs, compiled.parameters, compiled._in_shardings, strict=True)
    ):
        if isinstance(value, np.ndarray):
            _check_array(compiled, f"input {i}", value, spec.shape, spec.dtype)
            placed.append(jax.make_array_from_callback(spec.shape, sharding, value.__getitem__))
        elif isinstance(value, DeviceShards):
            placed.append(_place_shards(compiled, i, value, spec, sharding))
        elif callable(value):
            placed.append(_place_callback(compiled, i, value, spec, sharding))
        else:
            raise ExecutionError(
                f"{compiled.name}: input {i} is a {type(value).__name__}; expected a numpy "
                f"array, DeviceShards or a shard function"
            )
    return placed


def _place_callback(compiled: Compiled, i: int, fn: ShardFn, spec: ArraySpec, sharding: Any) -> Any:
    import jax

    def checked(index: Any) -> np.ndarray:
        data = np.asarray(fn(index))
        _check_array(compiled, f"input {i} shard {index}", data, spec.shard_shape, spec.dtype)
        return data

    return jax.make_array_from_callback(spec.shape, sharding, checked)


def _place_shards(
    compiled: Compiled, i: int, shards: DeviceShards, spec: ArraySpec, sharding: Any
) -> Any:
    import jax

    want = set(compiled.addressable)
    if set(shards.by_partition) != want:
        raise ExecutionError(
            f"{compiled.name}: input {i} has shards for partitions "
            f"{sorted(shards.by_partition)}, expected {sorted(want)}"
        )
    arrays = []
    for p in sorted(want):
        data = np.asarray(shards.by_partition[p])
        _check_array(compiled, f"input {i} partition {p}", data, spec.shard_shape, spec.dtype)
        arrays.append(jax.device_put(data, compiled.devices[p]))
    return jax.make_array_from_single_device_arrays(spec.shape, sharding, arrays)


def _check_array(
    compiled: Compiled, what: str, data: np.ndarray, shape: tuple[int, ...], dtype: np.dtype[Any]
) -> None:
    if tuple(data.shape) != shape or data.dtype != dtype:
        raise ExecutionError(
            f"{compiled.name}: {what} is {data.dtype}{list(data.shape)}, "
            f"expected {dtype}{list(shape)}"
        )


def _run(compiled: Compiled, placed: Sequence[Any]) -> list[list[Any]]:
    """One step; returns, per output, the single-device arrays of this process."""
    import jax

    try:
        results = compiled.executable.execute_sharded(list(placed))
        return [list(per_out) for per_out in results.disassemble_into_single_device_arrays()]
    except jax.errors.JaxRuntimeError as exc:
        raise ExecutionError(
            f"XLA failed to run {compiled.name}: {_strip_status(str(exc))}"
        ) from None


def execute_shards(compiled: Compiled, inputs: Sequence[Input]) -> tuple[tuple[Shard, ...], ...]:
    """Run one step; per output, the shards held by this process's devices."""
    outputs = _run(compiled, place(compiled, inputs))
    partition_of = {d: p for p, d in enumerate(compiled.devices)}
    result = []
    for spec, sharding, arrays in zip(
        compiled.outputs, compiled._out_shardings, outputs, strict=True
    ):
        where = sharding.devices_indices_map(spec.shape)
        shards = []
        for array in arrays:
            (device,) = array.devices()
            shards.append(Shard(partition_of[device], tuple(where[device]), np.asarray(array)))
        result.append(tuple(sorted(shards, key=lambda s: s.partition)))
    return tuple(result)


def execute(compiled: Compiled, inputs: Sequence[Input]) -> tuple[np.ndarray, ...]:
    """Run one step and assemble every output as a global numpy array.

    Needs every device to be driven by this process; in a multi-process job use
    `execute_shards`. Replicated pieces are taken from the lowest partition holding them.
    """
    if len(compiled.addressable) != compiled.num_partitions:
        raise ExecutionError(
            f"{compiled.name}: this process drives {len(compiled.addressable)} of "
            f"{compiled.num_partitions} devices; use execute_shards to get its local pieces"
        )
    assembled = []
    for spec, shards in zip(compiled.outputs, execute_shards(compiled, inputs), strict=True):
        out = np.empty(spec.shape, dtype=spec.dtype)
        for shard in reversed(shards):  # lowest partition written last, wins
            out[shard.index] = shard.data
        assembled.append(out)
    return tuple(assembled)


def time_execution(
    compiled: Compiled, inputs: Sequence[Input], *, warmup: int, steps: int
) -> tuple[float, ...]:
    """Wall-clock seconds of each of `steps` runs after `warmup` runs, inputs placed once,
    each step timed until all outputs are ready on every local device."""
    import jax

    if warmup < 0 or steps < 1:
        raise ExecutionError(f"need warmup >= 0 and steps >= 1, got {warmup} and {steps}")
    placed = place(compiled, inputs)
    times = []
    for step in range(warmup + steps):
        if step and compiled.donates:  # the last run consumed them
            placed = place(compiled, inputs)
        start = time.perf_counter()
        outputs = _run(compiled, placed)
        jax.block_until_ready(outputs)
        if step >= warmup:
            times.append(time.perf_counter() - start)
    return tuple(times)


# --------------------------------------------------------------------------------------
# Arrays that stay on the devices (pipeline stages: one program's results feed the next)


def move_input(compiled: Compiled, index: int, value: np.ndarray | jax.Array) -> jax.Array:
    """Put a host array, or copy a device array (another program's result, possibly on
    other devices of this process), where parameter `index` of `compiled` expects it; a
    device array already there is returned as it is."""
    import jax

    sharding = compiled._in_shardings[index]
    if isinstance(value, np.ndarray):
        spec = compiled.parameters[index]
        _check_array(compiled, f"input {index}", value, spec.shape, spec.dtype)
    elif value.sharding.is_equivalent_to(sharding, value.ndim):
        return value
    return jax.device_put(value, sharding)


def parameter_sharding(compiled: Compiled, index: int) -> jax.sharding.Sharding:
    """The jax sharding parameter `index` of `compiled` must be placed with (a sharding
    over the executable's device list, as `move_input` places it)."""
    return compiled._in_shardings[index]


def output_sharding(compiled: Compiled, index: int) -> jax.sharding.Sharding:
    """The jax sharding output `index` of `compiled` comes back with."""
    return compiled._out_shardings[index]


def execute_arrays(compiled: Compiled, arrays: Sequence[jax.Array]) -> list[jax.Array]:
    """Run one step on device arrays placed by `move_input` (checked: a
    misplaced buffer would crash the process); the results stay on the devices, one
    global array per output. Does not wait for them (see `wait_ready`)."""
    import jax

    if len(arrays) != len(compiled.parameters):
        raise ExecutionError(
            f"{compiled.name} takes {len(compiled.parameters)} inputs, got {len(arrays)}"
        )
    for i, (array, spec, sharding) in enumerate(
        zip(arrays, compiled.parameters, compiled._in_shardings, strict=True)
    ):
        if tuple(array.shape) != spec.shape or np.dtype(array.dtype) != spec.dtype:
            raise ExecutionError(
                f"{compiled.name}: input {i} is {array.dtype}{list(array.shape)}, "
                f"expected {spec.dtype}{list(spec.shape)}"
            )
        if not array.sharding.is_equivalent_to(sharding, array.ndim):
            raise ExecutionError(
                f"{compiled.name}: input {i} is on {array.sharding}, expected {sharding}"
            )
    pieces = _run(compiled, arrays)
    return [
        jax.make_array_from_single_device_arrays(spec.shape, sharding, per_device)
        for spec, sharding, per_device in zip(
            compiled.outputs, compiled._out_shardings, pieces, strict=True
        )
    ]


def wait_ready(arrays: Sequence[jax.Array]) -> None:
    """Block until every array is computed."""
    import jax

    jax.block_until_ready(list(arrays))


def to_host(array: jax.Array) -> np.ndarray:
    """A device array as a numpy array (every piece must be in this process)."""
    return np.asarray(array)


def process_of(device: Any) -> int:
    """The index of the process that drives `device`."""
    return int(device.process_index)


def _canonical(devices: Sequence[Any], shape: tuple[int, ...]) -> Any:
    """The layout an array has in flight between processes, known to both sides without
    asking: split on dimension 0 over the devices when it divides, else replicated."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(list(devices), dtype=object), ("stage",))
    split = len(devices) > 1 and bool(shape) and shape[0] % len(devices) == 0
    return NamedSharding(mesh, PartitionSpec("stage") if split else PartitionSpec())


def send_to_devices(array: jax.Array, sources: Sequence[Any], devices: Sequence[Any]) -> None:
    """Send an array from `sources`, devices of this process (it is first laid out over
    them as it travels), to `devices` of another process, which must call
    `receive_from_devices` for it; both processes must make their sends and receives
    between them in the same order. Returns once it is sent."""
    import jax

    shape = tuple(array.shape)
    try:
        staged = jax.device_put(array, _canonical(sources, shape))
        jax.block_until_ready(jax.device_put(staged, _canonical(devices, shape)))
    except (ValueError, RuntimeError) as exc:
        raise ExecutionError(
            f"sending to {devices[0]}... failed: {_strip_status(str(exc))}"
        ) from None


def receive_from_devices(
    shape: tuple[int, ...], dtype: np.dtype[Any], sources: Sequence[Any], devices: Sequence[Any]
) -> jax.Array:
    """The array another process sends (`send_to_devices`) from its `sources` devices to
    this process's `devices`."""
    import jax

    incoming = jax.make_array_from_single_device_arrays(
        shape, _canonical(sources, shape), [], dtype=dtype
    )
    try:
        received = jax.device_put(incoming, _canonical(devices, shape))
        jax.block_until_ready(received)
    except (ValueError, RuntimeError) as exc:
        raise ExecutionError(
            f"receiving from {sources[0]}... failed: {_strip_status(str(exc))}"
        ) from None
    return received
