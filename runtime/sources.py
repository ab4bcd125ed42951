"""Read a training step in any form a JAX user has it: the one loader of every command.

    kind        what it is                                  how it is read
    hlo         HLO text (`HloModule ...`; any text that    rhino's parser, as always
                is not MLIR)
    stablehlo   MLIR text starting `module`, `#loc`,        jaxlib (`xla_bridge.stablehlo_
                `func.func` or `builtin.module`; MLIR       to_hlo`), then rhino's parser
                bytecode (`ML\\xefR`)
    hlo-proto   binary: a serialized HloModuleProto, or     jaxlib (`xla_bridge.hlo_proto_
                the HloProto of `--xla_dump_hlo_as_proto`   to_hlo`), then rhino's parser
    xla-dump    a folder written by                         one of its `module_NNNN.NAME.
                `XLA_FLAGS=--xla_dump_to=DIR`               before_optimizations.txt` (or
                                                            `.hlo.pb`), read as above

The kind is told from the first bytes (after a `.gz` is unpacked), never by jax: reading
HLO text imports neither jax nor numpy. `-` reads standard input.

StableHLO is what `jax.jit(f).lower(*args).as_text()` prints (`sdy` shardings, jax's
default, or `mhlo.sharding` ones; with or without `debug_info=True`), converted the way
jax makes `as_text(dialect="hlo")`. An MLIR parse or verify error is an `HloParseError`
at the user's FILE:LINE:COL. Sharding annotations the module carries are DROPPED, with a
note: rhino plans every layout itself, and a layout to keep is a pin (`rhino plan
--pin`; a jax annotation names the user's jax mesh, not rhino's). Parameters and results
lose theirs; a sharding constraint inside stays an identity custom call `Sharding`, made
replicated (what a `dialect="hlo"` dump of an unsharded step already holds for a
`jax.random` key, and what rhino plans replicated); other operations' sharding
attributes go. What was taken off is kept in the tables below. Donation
(`tf.aliasing_output`; a `jax.buffer_donor` paired with the first free result of its
type) becomes the HLO module's `input_output_alias`. Instruction names and
`metadata={op_name=...}` come from jax's locations (`jit(step)/jvp()/dot_general`); in a
module printed without them, each instruction's metadata names its line in the file
(`source_file="step.mlir" source_line=12`).

HLO text that rhino's parser refuses only for operands such as `%t#0` (tuple elements,
as jax 0.12's XLA prints them in dumps) is re-printed by XLA's parser, with
get-tuple-element instructions, and a note.

Besides the `Module`, `Loaded` holds what `--emit-shardings` and the like need, keyed by
JAX pytree path:
- `Loaded.parameters`: per HLO entry parameter, its number, instruction name, pytree
  path, the sharding the input gave it and the output leaf it is donated to. The path
  is the parameter's `metadata={op_name=...}`, where jax and XLA write it (XLA dumps'
  before-optimizations modules, `compiler_ir("hlo")` protos, converted
  `as_text(debug_info=True)` text, and a `jax.arg_info` of older jax, which the
  conversion writes there too). None where the input does not say: jax 0.10.2's plain
  `as_text()` prints no argument paths, `as_text(dialect="hlo")` no metadata.
- `Loaded.outputs`: per leaf of the entry's result, its `jax.result_info` path
  (`result[0]['dense']['kernel']`) and the sharding it carried (StableHLO only).
`Loaded.to_json()` is the `input` object of every command's `--json`: `kind`, `file`,
`source` (the file read: a dump's pick), `converted`, `notes`, `candidates` (dumps:
`file`, `number`, `name`, `instructions`, `dots`, the pick first), `parameters`
(`number`, `name`, `path`, `sharding`, `aliased_output`), `outputs` (`index`, `path`,
`sharding`).

XLA dump folders hold a module per jit (wrappers, `jax.random` helpers, the step): the
`before_optimizations` module with the most dot/convolution instructions wins, then the
one with the most instructions, then the later module number; `module=` picks one by
name (`jit_step`; the latest of that name), number (`20`, `0020`) or file name. The note
and `Loaded.candidates` say which was read and what else was there.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rhino.hlo.errors import ConfigError, HloParseError, RhinoError, SourceSpan
from rhino.hlo.ir import Module
from rhino.hlo.parser import parse_module, read_bytes

KINDS = ("hlo", "stablehlo", "hlo-proto", "xla-dump")
"""The kinds of input `load` reads."""


class InputError(RhinoError):
    """An input that is none of the kinds rhino reads, or a dump with nothing to read."""


@dataclass(frozen=True)
class EntryParameter:
    """One parameter of the entry computation and what the input said about it."""

    number: int
    """Its parameter number."""
    name: str
    """The HLO instruction's name (what plans and pins name)."""
    path: str | None
    """Its JAX pytree path (`params['dense']['kernel']`), or None when unknown."""
    sharding: str | None
    """The sharding the input gave it, as written (StableHLO: removed from the module;
    HLO: still on the instruction)."""
    aliased_output: int | None
    """The output leaf it is donated to (`input_output_alias`), or None."""


@dataclass(frozen=True)
class EntryOutput:
    """One leaf of the entry computation's result."""

    index: int
    """Its position among the result's leaves."""
    path: str | None
    """`jax.result_info` (`result[0]['dense']['kernel']`), or None."""
    sharding: str | None
    """The sharding the input gave it (removed from the module)."""


@dataclass(frozen=True)
class DumpCandidate:
    """One `before_optimizations` module of an XLA dump folder."""

    file: str
    """Its path."""
    number: int
    """NNNN of `module_NNNN.NAME...`."""
    name: str
    """NAME, the module's name (`jit_step`)."""
    instructions: int
    """Instructions in the module (all computations)."""
    dots: int
    """Dot and convolution instructions among them."""

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "number": self.number,
            "name": self.name,
            "instructions": self.instructions,
            "dots": self.dots,
        }


@dataclass(frozen=True)
class Loaded:
    """A training step as read from the user's input (see the module docstring)."""

    module: Module
    """The step, as HLO."""
    kind: str
    """One of KINDS: what the user gave."""
    file: str
    """The path the user gave (`<stdin>` for `-`)."""
    source: str
    """The file the module was read from: `file`, or the dump module picked."""
    converted: bool
    """Whether the HLO was made by XLA from another form (StableHLO, a proto)."""
    notes: tuple[str, ...] = ()
    """What the loader did that the user should know (a pick, dropped shardings)."""
    candidates: tuple[DumpCandidate, ...] = ()
    """A dump's `before_optimizations` modules, the picked one first."""
    output_paths: tuple[str | None, ...] = ()
    """StableHLO: `jax.result_info` of each result leaf."""
    output_shardings: tuple[str | None, ...] = ()
    """StableHLO: the sharding each result leaf carried."""
    argument_paths: tuple[str | None, ...] = ()
    """StableHLO: each argument's pytree path as the bridge read it."""
    argument_shardings: tuple[str | None, ...] = ()
    """StableHLO: the sharding each argument carried."""
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def parameters(self) -> tuple[EntryParameter, ...]:
        """The entry parameters, in parameter-number order (computed when first read)."""
        if "parameters" not in self._cache:
            self._cache["parameters"] = _parameters(self)
        found: tuple[EntryParameter, ...] = self._cache["parameters"]
        return found

    @property
    def outputs(self) -> tuple[EntryOutput, ...]:
        """The entry result's leaves (paths and shardings from StableHLO only)."""
        root = self.module.entry.root
        count = len(root.shape.leaves()) if root is not None else 0
        return tuple(
            EntryOutput(
                i,
                self.output_paths[i] if i < len(self.output_paths) else None,
                self.output_shardings[i] if i < len(self.output_shardings) else None,
            )
            for i in range(count)
        )

    def to_json(self) -> dict[str, Any]:
        """The `input` object of a command's `--json`."""
        doc: dict[str, Any] = {
            "kind": self.kind,
            "file": self.file,
            "source": self.source,
            "converted": self.converted,
            "notes": list(self.notes),
        }
        if self.kind == "xla-dump":
            doc["candidates"] = [c.to_json() for c in self.candidates]
        doc["parameters"] = [
            {
                "number": p.number,
                "name": p.name,
                "path": p.path,
                "sharding": p.sharding,
                "aliased_output": p.aliased_output,
            }
            for p in self.parameters
        ]
        doc["outputs"] = [
            {"index": o.index, "path": o.path, "sharding": o.sharding} for o in self.outputs
        ]
        return doc


def load(path: str | Path, *, module: str | None = None, lazy: bool = True) -> Loaded:
    """Read the training step at `path` (any of KINDS; `-`: standard input).

    `module` picks a module of an XLA dump folder by name, number or file name (an
    error for any other kind of input). `lazy` as `rhino.hlo.parser.parse_module`.
    Raises `HloParseError` (file:line:col) for malformed text, `InputError` for an input
    of no known kind, `ConfigError` for a `module` that names nothing.
    """
    name = str(path)
    if name != "-" and Path(name).is_dir():
        return _load_dump(name, module, lazy)
    if module is not None:
        raise ConfigError(
            f"module {module!r}: {name} is not an XLA dump folder (`module` picks one module "
            "of a folder written by XLA_FLAGS=--xla_dump_to=DIR)",
            "module",
        )
    shown = "<stdin>" if name == "-" else name
    return _load_bytes(shown, read_bytes(name), lazy)


def _load_bytes(shown: str, data: bytes, lazy: bool) -> Loaded:
    kind = sniff(data)
    if kind == "hlo":
        text = _text(data, shown)
        try:
            return Loaded(parse_module(text, shown, lazy=lazy), "hlo", shown, shown, False)
        except HloParseError as e:
            if not _TUPLE_OPERAND.search(text):
                raise
            return _load_reprinted(shown, text, lazy, e)
    if kind == "stablehlo":
        return _load_stablehlo(shown, data, lazy)
    return _load_proto(shown, data, lazy)


_TUPLE_OPERAND = re.compile(r"[(,][ \t]*%?[\w.\-]+#\d+[ \t]*[,)]")
"""An operand `%t#0`: element 0 of tuple `t`, as XLA from jax 0.12 prints it in dumps."""


def _load_reprinted(shown: str, text: str, lazy: bool, error: HloParseError) -> Loaded:
    """HLO text with tuple-element operands (`%t#0`, which rhino's parser does not read),
    re-printed by XLA's own parser with get-tuple-element instructions; `error` (rhino's)
    when XLA cannot read it either."""
    from rhino.runtime import xla_bridge

    try:
        hlo = xla_bridge.xla_parse(text).text
    except xla_bridge.XlaRejected:
        raise error from None
    module = parse_module(hlo, f"{shown} (re-printed by XLA)", lazy=lazy)
    note = (
        f"{shown}: its tuple-element operands (`%t#0`, as newer XLA prints them) were "
        "re-printed by XLA's parser as get-tuple-element instructions"
    )
    return Loaded(module, "hlo", shown, shown, True, (note,))


# -- reading and telling kinds apart ------------------------------------------------------------


_MLIR_START = re.compile(rb"(?:module\b|#|func\.func\b|builtin\.module\b|\"builtin\.module\")")
_SKIP = re.compile(rb"(?:\s+|//[^\n]*)*")
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0e-\x1f\x7f]")
"""Bytes no text holds (a proto's field tags and lengths do)."""


def sniff(data: bytes) -> str:
    """The kind of a file's bytes: "hlo", "stablehlo" or "hlo-proto" (binary).

    MLIR text starts (after blanks and `//` comments) with `module`, an alias (`#loc1 =
    ...`), `func.func` or `builtin.module`; MLIR bytecode with `ML\\xefR`. Bytes that are
    not UTF-8 text, or hold control characters, are binary; any other text is HLO (its
    parser says what is wrong)."""
    if data.startswith(b"ML\xefR"):
        return "stablehlo"
    head = data[:4096]
    if _CONTROL.search(head) or not _is_utf8(head):
        return "hlo-proto"
    start = _SKIP.match(data)
    at = start.end() if start else 0
    return "stablehlo" if _MLIR_START.match(data, at) else "hlo"


def _is_utf8(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start >= len(head) - 3  # a character cut by the 4 KiB window
    return True


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise HloParseError("the file is not UTF-8 text", SourceSpan(name, line, col, "")) from None


# -- StableHLO ----------------------------------------------------------------------------------


def _load_stablehlo(shown: str, data: bytes, lazy: bool) -> Loaded:
    from rhino.runtime import xla_bridge

    text: str | bytes = data if data.startswith(b"ML\xefR") else _text(data, shown)
    try:
        converted = xla_bridge.stablehlo_to_hlo(text)
    except xla_bridge.MlirRejected as e:
        if e.line is not None or not isinstance(text, str) or "loc(" not in text:
            raise _located(e, shown, text if isinstance(text, str) else "") from None
        # `debug_info=True` locates operations in the user's Python files, and so does a
        # verifier error: the same text without locations puts it in the file itself
        try:
            xla_bridge.stablehlo_to_hlo(blank_locations(text))
        except xla_bridge.MlirRejected as again:
            raise _located(again if again.line is not None else e, shown, text) from None
        raise _located(e, shown, text) from None
    hlo = _name_source(converted.text, shown)
    module = parse_module(hlo, f"{shown} (converted to HLO)", lazy=lazy)
    args = converted.arguments
    notes = _stablehlo_notes(shown, converted)
    return Loaded(
        module,
        "stablehlo",
        shown,
        shown,
        True,
        tuple(notes),
        output_paths=tuple(r.path for r in converted.results),
        output_shardings=tuple(r.sharding for r in converted.results),
        argument_paths=tuple(a.path for a in args),
        argument_shardings=tuple(a.sharding for a in args),
    )


def blank_locations(text: str) -> str:
    """`text` with every `loc(...)` and `#loc... = loc(...)` replaced by spaces: the
    same lines and columns, no debug locations."""
    out = list(text)
    i = text.find("loc(")
    while i >= 0:
        if i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_.$#"):  # `alloc(`
            i = text.find("loc(", i + 1)
            continue
        end = _balanced_end(text, i + 3)
        for k in range(i, end):
            if out[k] != "\n":
                out[k] = " "
        i = text.find("loc(", end)
    for match in re.finditer(r"^#loc[\w.$-]*\s*=", text, re.MULTILINE):
        for k in range(match.start(), match.end()):
            out[k] = " "
    return "".join(out)


def _balanced_end(text: str, open_at: int) -> int:
    """Index just past the `)` closing the `(` at `open_at` (strings skipped)."""
    depth, k = 0, open_at
    while k < len(text):
        c = text[k]
        if c == '"':
            k += 1
            while k < len(text) and text[k] != '"':
                k += 2 if text[k] == "\\" else 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return k + 1
        k += 1
    return len(text)


def _located(e: Any, shown: str, text: str) -> RhinoError:
    """The bridge's `MlirRejected` at the user's FILE:LINE:COL (or FILE when unlocated)."""
    notes = "".join(
        f"; {message} at {shown}:{line}:{col}" if line is not None else f"; {message}"
        for line, col, message in e.notes
    )
    if e.line is None:
        return InputError(f"{shown}: {e.message}{notes}")
    lines = text.splitlines()
    source_line = lines[e.line - 1] if 0 < e.line <= len(lines) else ""
    return HloParseError(e.message + notes, SourceSpan(shown, e.line, e.col or 1, source_line))


def _name_source(hlo: str, shown: str) -> str:
    """XLA names a location in MLIR text given as a string `-`: name the user's file
    (its base name, so that a plan made for `dir/step.mlir` fits `./step.mlir`)."""
    base = Path(shown).name
    quoted = '"' + base.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return hlo.replace('source_file="-"', f"source_file={quoted}")


def _stablehlo_notes(shown: str, converted: Any) -> list[str]:
    notes = []
    args = sum(a.sharding is not None for a in converted.arguments)
    results = sum(r.sharding is not None for r in converted.results)
    if args or results or converted.constraints or converted.op_shardings:
        parts = [
            _count(n, what)
            for n, what in (
                (args, "parameter sharding"),
                (results, "output sharding"),
                (converted.op_shardings, "operation sharding"),
            )
            if n
        ]
        if converted.constraints:
            parts.append(
                _count(converted.constraints, "sharding constraint") + " (made replicated)"
            )
        notes.append(
            f"{shown}: dropped the module's {', '.join(parts)}: rhino plans every layout "
            "itself (keep a layout with a `pin`)"
        )
    for i, a in enumerate(converted.arguments):
        if a.donor_unpaired:
            notes.append(
                f"{shown}: argument {i} is donated (jax.buffer_donor) but no result has its "
                "type; it is not paired with an output"
            )
    if converted.arguments and all(a.path is None for a in converted.arguments):
        notes.append(
            f"{shown}: the module names no argument paths (jax prints them with "
            "`lower(...).as_text(debug_info=True)`)"
        )
    return notes


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


# -- HloModuleProto -----------------------------------------------------------------------------


def _load_proto(shown: str, data: bytes, lazy: bool) -> Loaded:
    from rhino.runtime import xla_bridge

    try:
        hlo = xla_bridge.hlo_proto_to_hlo(module_proto(data))
    except xla_bridge.XlaRejected as e:
        raise InputError(
            f"{shown}: not HLO text, StableHLO/MLIR text or a serialized HloModuleProto "
            f"(binary, and XLA cannot read it as a proto: {e.xla_message})"
        ) from None
    module = parse_module(hlo, f"{shown} (converted to HLO)", lazy=lazy)
    return Loaded(module, "hlo-proto", shown, shown, True)


def module_proto(data: bytes) -> bytes:
    """The HloModuleProto in `data`: `data` itself, or the module inside an HloProto
    (what `--xla_dump_hlo_as_proto` writes). Both start with field 1, length-delimited
    (tag 0x0a): a module's is its name (text), an HloProto's the module, whose own
    first byte is again the tag 0x0a."""
    if data[:1] != b"\x0a":
        return data
    length, start = _varint(data, 1)
    if length is None or start + length > len(data) or data[start : start + 1] != b"\x0a":
        return data
    return data[start : start + length]


def _varint(data: bytes, at: int) -> tuple[int | None, int]:
    value = shift = 0
    while at < len(data) and shift < 64:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if not byte & 0x80:
            return value, at
        shift += 7
    return None, at


# -- XLA dump folders ---------------------------------------------------------------------------

_DUMP_FILE = re.compile(r"^module_(\d+)\.(.+)\.before_optimizations\.(txt|hlo\.pb)$")
_INSTRUCTION = re.compile(r"^[ \t]*(?:ROOT[ \t]+)?%?[^\s=]+[ \t]*=[ \t]*\S", re.MULTILINE)
_DOT = re.compile(r" (?:dot|convolution)\(")


def _load_dump(folder: str, module: str | None, lazy: bool) -> Loaded:
    candidates = dump_candidates(folder)
    if module is None:
        ranked = sorted(candidates, key=lambda c: (c.dots, c.instructions, c.number), reverse=True)
        picked = ranked[0]
        why = "the most dot/convolution instructions, then the most instructions"
    else:
        picked = _named(candidates, module, folder)
        why = f"module {module!r}"
    others = [c for c in candidates if c is not picked]
    loaded = _load_bytes(picked.file, read_bytes(picked.file), lazy)
    note = (
        f"{folder}: read {Path(picked.file).name} ({picked.name}: {picked.instructions} "
        f"instructions, {picked.dots} dot/convolution), picked by {why} among "
        f"{len(candidates)} modules before optimizations"
        + (
            f" (others: {', '.join(f'{c.number:04d} {c.name}' for c in others[:8])}"
            + (f" and {len(others) - 8} more" if len(others) > 8 else "")
            + "; `module` picks one by name or number)"
            if others
            else ""
        )
    )
    return Loaded(
        loaded.module,
        "xla-dump",
        folder,
        picked.file,
        loaded.converted,
        (note, *loaded.notes),
        (picked, *others),
    )


def dump_candidates(folder: str) -> list[DumpCandidate]:
    """The `before_optimizations` modules of an XLA dump folder, by module number (a
    module's text when dumped, else its `.hlo.pb`). Raises `InputError` for none."""
    found: dict[int, tuple[str, Path]] = {}
    names: dict[int, str] = {}
    for path in sorted(Path(folder).iterdir()):
        match = _DUMP_FILE.match(path.name)
        if match is None or not path.is_file():
            continue
        number = int(match.group(1))
        if number not in found or match.group(3) == "txt":
            found[number] = (match.group(3), path)
            names[number] = match.group(2)
    if not found:
        raise InputError(
            f"{folder}: a folder, but it holds no module_NNNN.NAME.before_optimizations.txt "
            "(or .hlo.pb): is it an XLA dump (XLA_FLAGS=--xla_dump_to=DIR)?"
        )
    out = []
    for number in sorted(found):
        suffix, path = found[number]
        text = _dump_text(path, suffix)
        out.append(
            DumpCandidate(
                str(path),
                number,
                names[number],
                len(_INSTRUCTION.findall(text)),
                len(_DOT.findall(text)),
            )
        )
    return out


def _dump_text(path: Path, suffix: str) -> str:
    data = read_bytes(str(path))
    if suffix == "txt":
        return data.decode("utf-8", errors="replace")
    from rhino.runtime import xla_bridge

    try:
        return xla_bridge.hlo_proto_to_hlo(module_proto(data))
    except xla_bridge.XlaRejected as e:
        raise InputError(f"{path}: XLA cannot read this HloProto: {e.xla_message}") from None


def _named(candidates: list[DumpCandidate], module: str, folder: str) -> DumpCandidate:
    """The candidate `module` names: by file name, number, or name (the latest of that
    name when several)."""
    for c in candidates:
        if Path(c.file).name == module:
            return c
    if module.isdigit():
        numbered = [c for c in candidates if c.number == int(module)]
        if numbered:
            return numbered[0]
    named = [c for c in candidates if c.name == module]
    if named:
        return max(named, key=lambda c: c.number)
    listed = ", ".join(f"{c.number:04d} {c.name}" for c in candidates)
    raise ConfigError(
        f"module {module!r}: no such module before optimizations in {folder} (it has {listed})",
        "module",
    )


# -- the parameter table ------------------------------------------------------------------------

_ALIAS = re.compile(r"\{\s*(\d*)\s*\}\s*:\s*\(\s*(\d+)\s*,\s*\{\s*\}")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')


def _parameters(loaded: Loaded) -> tuple[EntryParameter, ...]:
    module = loaded.module
    aliased: dict[int, int] = {}
    for out, param in _ALIAS.findall(module.attrs.get("input_output_alias", "")):
        aliased.setdefault(int(param), int(out) if out else 0)
    params = sorted(module.entry.parameters, key=lambda p: p.parameter_number or 0)
    out = []
    for p in params:
        number = p.parameter_number or 0
        path = _op_name(p.attrs.get("metadata", ""))
        if path is None and number < len(loaded.argument_paths):
            path = loaded.argument_paths[number]
        sharding = p.attrs.get("sharding")
        if sharding is None and number < len(loaded.argument_shardings):
            sharding = loaded.argument_shardings[number]
        out.append(EntryParameter(number, p.name, path, sharding, aliased.get(number)))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _op_name(metadata: str) -> str | None:
    match = _OP_NAME.search(metadata)
    if match is None:
        return None
    return re.sub(
        r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), match.group(1)
    )
