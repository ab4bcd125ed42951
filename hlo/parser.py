"""Parse HLO text (as XLA and JAX print it) into a `Module`.

Grammar (whitespace and `/* ... */` comments may appear between any two tokens):

    module       := ['HloModule' NAME (',' attribute)*] section* computation*
    section      := ('FileNames' | 'FunctionNames' | 'FileLocations' | 'StackFrames')
                    lines up to a blank line                      (kept verbatim)
    computation  := ['ENTRY'] ['%'] NAME [signature] '{' instruction* '}'
    signature    := '(' [NAME ':' shape (',' NAME ':' shape)*] ')' '->' shape
    instruction  := ['ROOT'] ['%'] NAME '=' shape OPCODE '(' operands ')' (',' attribute)*
    operands     := INT                      (parameter)
                  | literal                  (constant; kept verbatim)
                  | [operand (',' operand)*]
    operand      := [shape] ['%'] NAME       (old dumps print the operand's shape)
    attribute    := KEY '=' value            (value kept verbatim; decoded on demand)
    value        := (STRING | '{' ... '}' | '[' ... ']' | '(' ... ')' | ATOM)+

An instruction ends at the end of its line (a `,` at the end of a line continues it, and
brackets may span lines). Attribute values are checked for balanced brackets and strings
here and decoded lazily by `rhino.hlo.attrs`; `parse_module(..., lazy=False)` decodes
every attribute and literal up front, so that all syntax errors surface at parse time.

Every error is an `HloParseError` with file:line:col.
"""

from __future__ import annotations

import gzip
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from rhino.hlo.collector import collector_paused
from rhino.hlo.errors import HloParseError, TextError
from rhino.hlo.ir import CALLED_COMPUTATION_KEYS, Computation, Instruction, Module, Source
from rhino.hlo.lexemes import (
    ATTR_KEY,
    BRACED1,
    DTYPE,
    INSTRUCTION_HEAD,
    INSTRUCTION_LHS,
    INSTRUCTION_LINE,
    NAME,
    OPCODE_CALL,
    STRING,
)
from rhino.hlo.opcode import OPCODE_BY_TEXT, Opcode
from rhino.hlo.shape import Shape, parse_shape_at

_References = tuple[list[tuple[str, list[tuple[str, int]]]], tuple[Instruction, ...]]
"""An instruction's called computations, `[(key, [(name, offset)])]`, and its control
predecessors."""

_CONTROL_PREDECESSORS = "control-predecessors"
# an attribute tail that names computations or instructions
_REFERENCE_KEYS = re.compile(
    r"[, ](?:"
    + "|".join(re.escape(k) for k in (*CALLED_COMPUTATION_KEYS, _CONTROL_PREDECESSORS))
    + r")="
)

# an enum member read through its class costs ~80 ns on Python 3.11; build_fast reads
# three a line
_UNKNOWN, _PARAMETER, _CONSTANT = Opcode.UNKNOWN, Opcode.PARAMETER, Opcode.CONSTANT

_WS = re.compile(r"(?:[ \t\r\n]+|/\*.*?\*/|//[^\n]*)*", re.S)
_INLINE_WS = re.compile(r"(?:[ \t\r]+|/\*.*?\*/|//[^\n]*)*", re.S)
_NAME = re.compile(r"%?(" + NAME + r")")
_PARAM_NUMBER = re.compile(r"[ \t]*(\d+)[ \t]*\)")
_SIMPLE_OPERANDS = re.compile(r"[ \t]*((?:%?" + NAME + r"[ \t]*,[ \t]*)*%?" + NAME + r")?[ \t]*\)")
_SIMPLE_LITERAL = re.compile(r"([^()\"\n]*)\)")
_ATTR_KEY = re.compile(r"(" + ATTR_KEY + r")[ \t]*=[ \t]*")
# a value of the usual forms, followed by what may follow a value
_FAST_VALUE = re.compile(
    r"(?:" + BRACED1 + r"|" + STRING + r"|[^\s,{}()\"\[\]]+)(?=[ \t]*(?:,|\n|$|/\*))"
)
_SHAPE_START = re.compile(DTYPE + r"\[|\(")
# what scan_balanced may step over at once: characters that open, close, quote or
# comment nothing, and bracket pairs with only such characters inside
_PLAIN = r'[^"{}\[\]()\n/]'
_BALANCED_RUN = re.compile(
    r"(?:" + _PLAIN + r"+|\[" + _PLAIN + r"*\]|\{" + _PLAIN + r"*\}|\(" + _PLAIN + r"*\))+"
)
_SECTION_NAMES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_CLOSERS = {"{": "}", "[": "]", "(": ")"}
# a line that starts a new instruction or closes a computation: an open bracket never spans it
_NEXT_STATEMENT = re.compile(
    r"[ \t]*(?:\}[ \t]*(?:\n|$)|(?:ROOT[ \t]+)?%?" + NAME + r"[ \t]*=[ \t]*[(a-z])"
)


def parse_module(
    text: str, filename: str = "<string>", *, lazy: bool = True, fast: bool = True
) -> Module:
    """Parse HLO module text. With `lazy=False`, decode every attribute and literal too.

    `fast=False` turns off the one-regex path for ordinary lines (the result is the same;
    the differential tests compare both).
    """
    # ~10 objects an instruction, none freed: the cyclic GC would rescan them over and over
    with collector_paused():
        module = _Parser(text, filename, fast=fast).parse()
        if not lazy:
            force_decode(module)
    return module


def read_bytes(name: str) -> bytes:
    """A file's bytes (`-`: standard input's), ungzipped where it is gzip (by its `.gz`
    name or its magic bytes); RhinoError when it cannot be read or ungzipped."""
    from rhino.hlo.errors import RhinoError

    if name == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            data = Path(name).read_bytes()
        except OSError as e:
            raise RhinoError(f"{name}: cannot read: {e.strerror}") from None
    if name.endswith(".gz") or data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as e:
            raise RhinoError(f"{name}: not a valid gzip file: {e}") from None
    return data


def parse_file(path: str | Path, *, lazy: bool = True) -> Module:
    """Parse an HLO file: plain text, `.gz`, or `-` for standard input."""
    name = str(path)
    if name == "-":
        return parse_module(sys.stdin.read(), "<stdin>", lazy=lazy)
    data = read_bytes(name)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        from rhino.hlo.errors import SourceSpan

        line = data[: e.start].count(b"\n") + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise HloParseError(
            "the file is not UTF-8 text (is it a binary HloModuleProto?)",
            SourceSpan(name, line, col, ""),
        ) from None
    return parse_module(text, name, lazy=lazy)


def force_decode(module: Module) -> None:
    """Decode every attribute and constant literal, raising on the first malformed one.

    Instructions whose attribute tails are the same text (the 72-layer GPT has 7,750
    tails, 31 different) decode the same, since decoding reads only the text: the first
    is split and decoded, the others take its split (`split_attrs_like`) and decode
    their values when read, from `decode_attr`'s shared values.
    """
    from rhino.hlo.literal import check_literal

    first_with_tail: dict[str, Instruction] = {}
    for inst in module.instructions():
        tail = inst.unsplit_attr_text
        first = first_with_tail.get(tail) if tail is not None else None
        if first is not None:
            inst.split_attrs_like(first)
        else:
            for key in inst.attrs:
                inst.attr(key)
            if tail is not None:
                first_with_tail[tail] = inst
        if inst.literal is not None:
            try:
                check_literal(inst.literal, inst.shape)
            except TextError as e:
                offset = inst.literal_pos if inst.literal_pos >= 0 else inst.pos
                raise (
                    module.source.error(e.message, offset + e.offset) if module.source else e
                ) from None


_HEADER_PROGRAM_SHAPES = ("entry_computation_layout",)
"""Header attributes that hold a program shape (checked, kept verbatim)."""


_MLIR = re.compile(r"(module\b|func\.func\b|#loc|\"?builtin\.module)")
"""How MLIR text (StableHLO) starts, where HLO text starts `HloModule`."""


class _Parser:
    def __init__(self, text: str, filename: str, *, fast: bool = True) -> None:
        self.text = text
        self.fast = fast
        self.source = Source(filename, text)
        self.pos = 0
        # (instruction, key, [(name, offset)]) to resolve once all computations are known
        self.pending_calls: list[tuple[Instruction, str, list[tuple[str, int]]]] = []
        # shape text -> Shape, for the shapes of this module (most are repeated)
        self.shapes: dict[str, Shape] = {}

    # -- helpers ------------------------------------------------------------------------
    def error(self, message: str, offset: int | None = None) -> HloParseError:
        return self.source.error(message, self.pos if offset is None else offset)

    def skip(self, pos: int) -> int:
        return _WS.match(self.text, pos).end()  # type: ignore[union-attr]

    def got(self, pos: int) -> str:
        if pos >= len(self.text):
            return "end of file"
        frag = self.text[pos : pos + 24].split("\n", 1)[0]
        return repr(frag) if frag else "end of line"

    def shape_at(self, pos: int) -> tuple[Shape, int]:
        try:
            return parse_shape_at(self.text, pos)
        except TextError as e:
            raise self.error(e.message, e.offset) from None

    # -- module -------------------------------------------------------------------------
    def parse(self) -> Module:
        text = self.text
        pos = self.skip(0)
        if _MLIR.match(text, pos):
            raise self.error(
                "this is StableHLO/MLIR text (what `jax.jit(f).lower(...).as_text()` prints); "
                'rhino reads HLO text: `jax.jit(f).lower(...).as_text(dialect="hlo")`, or '
                "`jax.jit(f).lower(...).compile().as_text()` for XLA's optimized module",
                pos,
            )
        if text.startswith("HloModule", pos):
            pos = self.skip(pos + len("HloModule"))
            m = _NAME.match(text, pos)
            if m is None:
                raise self.error(
                    f"expected a module name after 'HloModule', got {self.got(pos)}", pos
                )
            module = Module(name=m.group(1), source=self.source)
            attrs, offsets, pos = self.parse_attributes(m.end())
            for key in _HEADER_PROGRAM_SHAPES:
                if key in attrs:
                    self.check_program_shape(attrs[key], offsets[key], key)
            module.attrs = attrs
            pos = self.skip(pos)
        elif pos < len(text) and _NAME.match(text, pos):
            # XLA also reads bare computations; it names the module after the entry
            module = Module(name="", source=self.source)
        else:
            raise self.error(
                f"expected 'HloModule' at the start of the module, got {self.got(pos)}", pos
            )
        pos = self.parse_sections(module, pos)
        while pos < len(text):
            pos = self.parse_computation(module, pos)
            pos = self.skip(pos)
        if not module.computations:
            raise self.error("the module has no computations", len(text))
        if not any(c.is_entry for c in module.computations):
            module.computations[-1].is_entry = True
        if not module.name:
            module.name = f"module_{module.entry.name}"
        self.resolve_calls(module)
        uniquify_names(module)
        return module

    def check_program_shape(self, value: str, pos: int, key: str) -> None:
        """A header's program shape, `{(PARAM_SHAPE, ...)->RESULT_SHAPE}`, parsed like any
        other shape (the header keeps the text verbatim)."""
        end = pos + len(value)
        if not value.startswith("{"):
            raise self.error(
                f"{key}: expected '{{' before the program shape, got {self.got(pos)}", pos
            )
        _, at = self.shape_at(self.skip(pos + 1))
        at = self.skip(at)
        if not self.text.startswith("->", at):
            raise self.error(
                f"{key}: expected '->' after the parameter shapes, got {self.got(at)}", at
            )
        _, at = self.shape_at(self.skip(at + 2))
        at = self.skip(at)
        if at != end - 1 or not value.endswith("}"):
            raise self.error(f"{key}: expected '}}' after the result shape, got {self.got(at)}", at)

    def parse_sections(self, module: Module, pos: int) -> int:
        text = self.text
        while text.startswith(_SECTION_NAMES, pos):
            end = text.find("\n\n", pos)
            end = len(text) if end < 0 else end
            module.sections.append(text[pos:end].rstrip())
            pos = self.skip(end)
        return pos

    def resolve_calls(self, module: Module) -> None:
        for inst, key, names in self.pending_calls:
            for name, offset in names:
                comp = module.computation(name)
                if comp is None:
                    raise self.error(f"{key} refers to an unknown computation %{name}", offset)
                inst.called = (*inst.called, comp)

    # -- computations -------------------------------------------------------------------
    def parse_computation(self, module: Module, pos: int) -> int:
        text = self.text
        is_entry = False
        if text.startswith("ENTRY", pos) and not _is_name_char(text, pos + 5):
            is_entry = True
            pos = self.skip(pos + 5)
        m = _NAME.match(text, pos)
        if m is None:
            raise self.error(f"expected a computation name, got {self.got(pos)}", pos)
        name = m.group(1)
        if m.group(0).startswith("%"):
            module.percent_names = True
        name_end = m.end()
        brace = self.parse_signature(name_end)
        signature = text[name_end:brace].strip() or None
        comp = Computation(name, is_entry=is_entry, signature=signature)
        if module.computation(name) is not None:
            raise self.error(f"duplicate computation name %{name}", m.start())
        if is_entry and any(c.is_entry for c in module.computations):
            raise self.error("a second ENTRY computation", m.start())
        module.add_computation(comp)
        pos = brace + 1
        root: Instruction | None = None
        while True:
            if self.fast:
                pos, root = self.fast_lines(comp, pos, root)
            pos = self.skip(pos)
            if pos >= len(text):
                raise self.error(f"computation {name} is not closed: expected '}}'", len(text))
            if text[pos] == "}":
                after = _INLINE_WS.match(text, pos + 1).end()  # type: ignore[union-attr]
                if after < len(text) and text[after] == ",":  # `}, execution_thread="host"`
                    comp.attrs, _, pos = self.parse_attributes(pos + 1)
                else:
                    pos += 1
                break
            inst, is_root, pos = self.parse_instruction(comp, pos)
            if is_root:
                if root is not None:
                    raise self.error(f"a second ROOT in computation {name}", inst.pos)
                root = inst
        if not comp.instructions:
            raise self.error(f"computation {name} has no instructions", brace)
        comp.root = root if root is not None else comp.instructions[-1]
        return pos

    def parse_signature(self, pos: int) -> int:
        """Skip an optional `(params) -> shape` and attributes; return the offset of '{'."""
        text = self.text
        pos = self.skip(pos)
        if pos < len(text) and text[pos] == "(":
            pos = self.skip(self.scan_balanced(pos))
            if not text.startswith("->", pos):
                raise self.error(
                    f"expected '->' after the parameter list, got {self.got(pos)}", pos
                )
            _, pos = self.shape_at(self.skip(pos + 2))
            pos = self.skip(pos)
        while pos < len(text) and text[pos] == ",":
            m = _ATTR_KEY.match(text, self.skip(pos + 1))
            if m is None:
                raise self.error(f"expected an attribute, got {self.got(pos + 1)}", pos + 1)
            pos = self.skip(self.scan_value(m.end()))
        if pos >= len(text) or text[pos] != "{":
            raise self.error(
                f"expected '{{' to open the computation body, got {self.got(pos)}", pos
            )
        return pos

    # -- instructions -------------------------------------------------------------------
    def parse_instruction(self, comp: Computation, pos: int) -> tuple[Instruction, bool, int]:
        """An `instruction` token by token (the exact path); return it, is-root and the end."""
        text = self.text
        start = pos
        is_root, name, name_pos, shape, opcode_text, pos = self.parse_head(pos)
        opcode = OPCODE_BY_TEXT.get(opcode_text, Opcode.UNKNOWN)
        operands: list[Instruction] = []
        parameter_number: int | None = None
        literal: str | None = None
        literal_pos = -1
        if opcode is Opcode.PARAMETER:
            pm = _PARAM_NUMBER.match(text, pos)
            if pm is None:
                raise self.error(
                    f"expected a parameter number like parameter(0), got {self.got(pos)}", pos
                )
            parameter_number = int(pm.group(1))
            pos = pm.end()
        elif opcode is Opcode.CONSTANT:
            lm = _SIMPLE_LITERAL.match(text, pos)
            end = lm.end() if lm is not None else self.scan_balanced(pos - 1)
            literal_pos = self.skip(pos)
            literal = text[literal_pos : end - 1].rstrip()
            pos = end
        else:
            pos = self.parse_operands(comp, operands, pos)
        attrs: dict[str, str] = {}
        attr_pos: dict[str, int] = {}
        references: _References | None = None
        if pos < len(text) and text[pos] == "\n":
            pass  # no attributes: the common case, skip the attribute scanner
        else:
            attrs, attr_pos, pos = self.parse_attributes(pos)
            if attrs:
                references = self.references(comp, attrs, attr_pos)
        if name in comp.by_name:
            raise self.error(
                f"duplicate instruction name %{name} in computation {comp.name}", name_pos
            )
        inst = Instruction.parsed(comp, name, opcode, opcode_text, shape, operands, start, None, 0)
        if parameter_number is not None:
            inst.parameter_number = parameter_number
        if literal is not None:
            inst.literal = literal
            inst.literal_pos = literal_pos
        if attrs:
            inst.attrs = attrs
            inst.attr_offsets = attr_pos
        if references is not None:
            self.note_references(inst, references)
        return inst, is_root, pos

    def fast_lines(
        self, comp: Computation, pos: int, root: Instruction | None
    ) -> tuple[int, Instruction | None]:
        """Read the ordinary instruction lines of `comp` from `pos` on (INSTRUCTION_LINE
        and build_fast), up to the first line they leave to the exact path; return where
        that line starts and the ROOT so far (`root`: the one before `pos`, if any)."""
        text, match, build, by_name = (
            self.text,
            INSTRUCTION_LINE.match,
            self.build_fast,
            comp.by_name,
        )
        m = match(text, pos)
        while m is not None:
            inst = build(comp, by_name, m)
            if inst is None:
                break
            pos = m.end()
            if m.group(1) is not None:
                if root is not None:
                    raise self.error(f"a second ROOT in computation {comp.name}", inst.pos)
                root = inst
            m = match(text, pos)
        return pos, root

    def build_fast(
        self, comp: Computation, by_name: Mapping[str, Instruction], m: re.Match[str]
    ) -> Instruction | None:
        """The instruction of a line INSTRUCTION_LINE matched (`by_name`: the instructions
        of `comp`), or None to leave the line to the exact path.

        Nothing is changed before every check has passed, so a None costs only time.
        """
        is_root, name, shape_text, opcode_text, args, tail = m.groups()
        if name in by_name:
            return None
        shape = self.shapes.get(shape_text)
        if shape is None:
            try:
                shape, _ = parse_shape_at(shape_text, 0)
            except TextError:
                return None
            self.shapes[shape_text] = shape
        opcode = OPCODE_BY_TEXT.get(opcode_text, _UNKNOWN)
        operands: list[Instruction] = []
        parameter_number: int | None = None
        literal: str | None = None
        literal_pos = -1
        if opcode is _PARAMETER:
            if not args.isdigit():
                return None
            parameter_number = int(args)
        elif opcode is _CONSTANT:
            literal = args.strip()
            literal_pos = m.start(5) + len(args) - len(args.lstrip())
        elif args:
            # as XLA prints them, `a, b` or `%a, %b`: split at C speed (when every piece
            # names an instruction, each was a bare name and the split was right)
            for ref in args[1:].split(", %") if args[0] == "%" else args.split(", "):
                op = by_name.get(ref)
                if op is None:
                    found = _operands(args, by_name)
                    if found is None:
                        return None
                    operands = found
                    break
                operands.append(op)
        if is_root:
            start = m.start(1)
        else:
            start = m.start(2)
            if self.text[start - 1] == "%":
                start -= 1
        inst = Instruction.parsed(
            comp, name, opcode, opcode_text, shape, operands, start, tail, m.start(6) if tail else 0
        )
        if parameter_number is not None:
            inst.parameter_number = parameter_number
        elif literal is not None:
            inst.literal = literal
            inst.literal_pos = literal_pos
        if tail and _REFERENCE_KEYS.search(tail):
            self.note_references(inst, self.references(comp, inst.attrs, inst.attr_offsets))
        return inst

    def parse_head(self, pos: int) -> tuple[bool, str, int, Shape, str, int]:
        """`[ROOT] [%]name = shape opcode(`: one match of INSTRUCTION_HEAD for an array
        shape, else its left-hand side, the shape parser and `opcode(` in turn (tuple
        shapes, comments, errors). Return is-root, name, its offset, shape, opcode, end."""
        text = self.text
        m = INSTRUCTION_HEAD.match(text, pos)
        if m is not None:
            shape_text = m.group(3)
            shape = self.shapes.get(shape_text)
            if shape is None:
                shape, _ = self.shape_at(m.start(3))
                self.shapes[shape_text] = shape
            return m.group(1) is not None, m.group(2), m.start(2), shape, m.group(4), m.end()
        m = INSTRUCTION_LHS.match(text, pos)
        if m is None:
            m2 = _NAME.match(text, pos)
            if m2 is None or m2.group(1) == "ROOT":
                raise self.error(f"expected an instruction or '}}', got {self.got(pos)}", pos)
            after = self.skip(m2.end())
            raise self.error(
                f"expected '=' after instruction name %{m2.group(1)}, got {self.got(after)}", after
            )
        shape, at = self.shape_at(m.end())
        at = _INLINE_WS.match(text, at).end()  # type: ignore[union-attr]
        om = OPCODE_CALL.match(text, at)
        if om is None:
            raise self.error(
                f"expected an opcode like add(...) after the shape, got {self.got(at)}", at
            )
        return m.group(1) is not None, m.group(2), m.start(2), shape, om.group(1), om.end()

    def parse_operands(self, comp: Computation, operands: list[Instruction], pos: int) -> int:
        """`operand (',' operand)* ')'` at `pos`, appended to `operands`; return the end."""
        text = self.text
        m = _SIMPLE_OPERANDS.match(text, pos)
        if m is not None:
            names = m.group(1)
            if names:
                by_name = comp.by_name
                for part in names.split(","):
                    ref = part.strip()
                    op = by_name.get(ref[1:] if ref[0] == "%" else ref)
                    if op is None:
                        raise self.undefined_in(comp, names, m.start(1), part)
                    operands.append(op)
            return m.end()
        # general form: comments, operand shapes, or line breaks in the list
        pos = self.skip(pos)
        if pos < len(text) and text[pos] == ")":
            return pos + 1
        while True:
            if _SHAPE_START.match(text, pos):
                _, pos = self.shape_at(pos)
                pos = self.skip(pos)
            nm = _NAME.match(text, pos)
            if nm is None:
                raise self.error(f"expected an operand name, got {self.got(pos)}", pos)
            op = comp.get(nm.group(1))
            if op is None:
                raise self.undefined(comp, nm.group(1), pos)
            operands.append(op)
            pos = self.skip(nm.end())
            if pos >= len(text):
                raise self.error("unterminated operand list: expected ')'", pos)
            if text[pos] == ")":
                return pos + 1
            if text[pos] != ",":
                raise self.error(
                    f"expected ',' or ')' in the operand list, got {self.got(pos)}", pos
                )
            pos = self.skip(pos + 1)

    def undefined_in(self, comp: Computation, names: str, offset: int, bad: str) -> HloParseError:
        """The error for operand `bad` of the comma-separated `names` starting at `offset`."""
        for part in names.split(","):
            if part is bad or part == bad:
                lead = len(part) - len(part.lstrip())
                return self.undefined(comp, part.strip().lstrip("%"), offset + lead)
            offset += len(part) + 1
        return self.undefined(comp, bad.strip(), offset)

    def undefined(self, comp: Computation, name: str, offset: int) -> HloParseError:
        return self.error(
            f"use of undefined instruction %{name} in computation {comp.name}", offset
        )

    def references(
        self, comp: Computation, attrs: dict[str, str], offsets: dict[str, int]
    ) -> _References:
        """The names in attributes `attrs` (value offsets `offsets`): called computations
        as written, control predecessors resolved in `comp`."""
        calls: list[tuple[str, list[tuple[str, int]]]] = []
        for key in CALLED_COMPUTATION_KEYS:
            value = attrs.get(key)
            if value is not None:
                calls.append((key, self.name_list(value, offsets[key], key)))
        preds: list[Instruction] = []
        value = attrs.get(_CONTROL_PREDECESSORS)
        if value is not None:
            offset = offsets[_CONTROL_PREDECESSORS]
            for ref, ref_pos in self.name_list(value, offset, _CONTROL_PREDECESSORS):
                op = comp.get(ref)
                if op is None:
                    raise self.undefined(comp, ref, ref_pos)
                preds.append(op)
        return calls, tuple(preds)

    def note_references(self, inst: Instruction, references: _References) -> None:
        """Give `inst` its control predecessors; its calls resolve once all computations
        are known (`resolve_calls`)."""
        calls, preds = references
        for key, names in calls:
            self.pending_calls.append((inst, key, names))
        if preds:
            inst.control_predecessors = preds

    def name_list(self, value: str, offset: int, key: str) -> list[tuple[str, int]]:
        """`%a` or `{%a, %b}` -> [(name, offset)]."""
        inner, base = (value[1:-1], offset + 1) if value.startswith("{") else (value, offset)
        out: list[tuple[str, int]] = []
        pos = 0
        for part in inner.split(","):
            ref = part.strip()
            if ref:
                m = _NAME.fullmatch(ref)
                if m is None:
                    raise self.error(
                        f"{key}: expected a computation or instruction name, got {ref!r}",
                        base + pos,
                    )
                out.append((m.group(1), base + pos + len(part) - len(part.lstrip())))
            pos += len(part) + 1
        return out

    # -- attributes ---------------------------------------------------------------------
    def parse_attributes(self, pos: int) -> tuple[dict[str, str], dict[str, int], int]:
        """Parse `(',' key '=' value)*` up to the end of the line; return texts, offsets, end."""
        text = self.text
        attrs: dict[str, str] = {}
        attr_pos: dict[str, int] = {}
        n = len(text)
        while True:
            pos = _INLINE_WS.match(text, pos).end()  # type: ignore[union-attr]
            if pos >= n or text[pos] == "\n" or text[pos] == "}":
                return attrs, attr_pos, pos
            if text[pos] != ",":
                raise self.error(f"expected ',' or the end of the line, got {self.got(pos)}", pos)
            pos = self.skip(pos + 1)
            km = _ATTR_KEY.match(text, pos)
            if km is None:
                raise self.error(f"expected an attribute like key=value, got {self.got(pos)}", pos)
            key = km.group(1)
            if key in attrs:
                raise self.error(f"attribute {key} given twice", pos)
            vstart = km.end()
            fm = _FAST_VALUE.match(text, vstart)
            vend = fm.end() if fm is not None else self.scan_value(vstart)
            if vend == vstart:
                raise self.error(
                    f"expected a value for attribute {key}, got {self.got(vstart)}", vstart
                )
            attrs[key] = text[vstart:vend]
            attr_pos[key] = vstart
            pos = vend

    def scan_value(self, pos: int) -> int:
        """End of an attribute value: atoms, strings and balanced brackets, up to , or space.

        A brace group after spaces continues the value (XLA prints `mesh[...] {'axis_0'}`
        for replica groups and `s32[2]{0} {1, 2}` for a custom-call's literal).
        """
        text = self.text
        n = len(text)
        while pos < n:
            c = text[pos]
            if c in "{[(":
                pos = self.scan_balanced(pos)
            elif c == '"':
                pos = self.scan_string(pos)
            elif c in " \t":
                # `mesh[...] {'axis_0'}` and `s32[2]{0} {1, 2}`: a brace group after
                # spaces still belongs to the value
                after = _INLINE_WS.match(text, pos).end()  # type: ignore[union-attr]
                if after < n and text[after] == "{":
                    pos = after
                else:
                    break
            elif c in ",\n\r})]":
                if c in "})]":
                    raise self.error(f"unbalanced '{c}'", pos)
                break
            else:
                pos += 1
        return pos

    def scan_balanced(self, pos: int) -> int:
        """Given an opening bracket at `pos`, return the offset after its closer."""
        text = self.text
        stack = [_CLOSERS[text[pos]]]
        opened = [pos]
        i = pos + 1
        n = len(text)
        while i < n:
            c = text[i]
            if c == '"':
                i = self.scan_string(i)
                continue
            if c in "{[(":
                stack.append(_CLOSERS[c])
                opened.append(i)
            elif c in "}])":
                if c != stack[-1]:
                    raise self.error(
                        f"expected '{stack[-1]}' to close '{text[opened[-1]]}', got '{c}'", i
                    )
                stack.pop()
                opened.pop()
                if not stack:
                    return i + 1
            elif c == "\n" and _NEXT_STATEMENT.match(text, i + 1):
                raise self.error(f"'{text[opened[-1]]}' is never closed", opened[-1])
            elif c == "/" and text.startswith("/*", i):
                j = text.find("*/", i + 2)
                if j < 0:
                    raise self.error("unterminated comment", i)
                i = j + 2
                continue
            elif c != "/" and c != "\n":
                # plain text, and brackets with only plain text inside (`[512,512]`,
                # `{1,0}`: balanced, so the stack is as before) in one step
                i = _BALANCED_RUN.match(text, i).end()  # type: ignore[union-attr]
                continue
            i += 1
        raise self.error(f"'{text[opened[-1]]}' is never closed", opened[-1])

    def scan_string(self, pos: int) -> int:
        text = self.text
        i = pos + 1
        n = len(text)
        while i < n:
            c = text[i]
            if c == "\\":
                i += 2
                continue
            if c == '"':
                return i + 1
            if c == "\n":
                break
            i += 1
        raise self.error("unterminated string", pos)


def _operands(args: str, by_name: Mapping[str, Instruction]) -> list[Instruction] | None:
    """The instructions named in `args`, the text between an opcode's parentheses
    (`[%]a, [%]b`, any spacing, read part by part), or None if a name is not in
    `by_name`."""
    if not args.strip():
        return []
    operands = []
    for part in args.split(","):
        ref = part.strip()
        op = by_name.get(ref[1:] if ref[:1] == "%" else ref)
        if op is None:
            return None
        operands.append(op)
    return operands


def uniquify_names(module: Module) -> None:
    """Rename instructions whose name an earlier computation already used, as XLA does.

    XLA's parser accepts the same name in two computations and renames the later one
    (`t` -> `t.1`); rhino keeps names unique across the module so a plan can key on them.
    """
    used: set[str] = set()
    for comp in module.computations:
        names = comp.by_name.keys()
        if used.isdisjoint(names):  # the common case: nothing to rename, at C speed
            used.update(names)
            continue
        for inst in comp.instructions:
            name = inst.name
            if name in used:
                base, _, suffix = name.rpartition(".")
                stem, n = (base, int(suffix)) if base and suffix.isdigit() else (name, 0)
                while f"{stem}.{n + 1}" in used or f"{stem}.{n + 1}" in names:
                    n += 1
                comp.rename(inst, f"{stem}.{n + 1}")
            used.add(inst.name)


def _is_name_char(text: str, pos: int) -> bool:
    return pos < len(text) and (text[pos].isalnum() or text[pos] in "_.-")
