"""The HLO IR: a module of computations of instructions, as XLA prints them.

Instructions keep their attributes as text (`attrs`, verbatim from the input) and decode
a value only when something asks for it (`attr()`), through the decoder table in
`rhino.hlo.attrs`. An attribute or opcode rhino does not model is therefore kept and
printed back unchanged. `users` is kept right by the mutators of this module.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rhino.hlo.attrs import decode_attr
from rhino.hlo.errors import HloParseError, SourceSpan, TextError
from rhino.hlo.lexemes import ATTR_ITEM
from rhino.hlo.opcode import Opcode
from rhino.hlo.shape import Shape

# attributes whose value names called computations
CALLED_COMPUTATION_KEYS = (
    "to_apply",
    "calls",
    "body",
    "condition",
    "true_computation",
    "false_computation",
    "branch_computations",
    "called_computations",
    "select",
    "scatter",
)


class Source:
    """The text a module was parsed from, for turning offsets into file:line:col."""

    def __init__(self, filename: str, text: str) -> None:
        self.filename = filename
        self.text = text
        self._line_starts: list[int] | None = None

    def span(self, offset: int) -> SourceSpan:
        if self._line_starts is None:
            starts = [0]
            find = self.text.find
            i = find("\n")
            while i >= 0:
                starts.append(i + 1)
                i = find("\n", i + 1)
            self._line_starts = starts
        line = bisect.bisect_right(self._line_starts, offset) - 1
        start = self._line_starts[line]
        end = self.text.find("\n", start)
        source_line = self.text[start : end if end >= 0 else len(self.text)]
        return SourceSpan(self.filename, line + 1, offset - start + 1, source_line)

    def error(self, message: str, offset: int) -> HloParseError:
        return HloParseError(message, self.span(offset))


class Instruction:
    """One HLO instruction: `name = shape opcode(operands), key=value, ...`."""

    # rare fields default at class level, so a parsed instruction stores only what it has
    parameter_number: int | None = None
    literal: str | None = None
    called: tuple[Computation, ...] = ()
    control_predecessors: tuple[Instruction, ...] = ()
    pos: int = -1
    """Offset of the instruction's text in its module's source (-1 if not parsed)."""
    literal_pos: int = -1
    """Offset of the constant's literal text in the source (-1 if not parsed)."""
    _attrs: dict[str, str] | None = None
    # the attribute tail `, key=value, ...` as parsed, split into `_attrs` on first read
    _attr_text: str | None = None
    _attr_text_pos: int = 0
    _attr_pos: dict[str, int] | None = None
    _decoded: dict[str, Any] | None = None

    def __init__(
        self,
        name: str,
        opcode: Opcode,
        shape: Shape,
        operands: list[Instruction] | None = None,
        attrs: dict[str, str] | None = None,
        *,
        opcode_text: str | None = None,
        parameter_number: int | None = None,
        literal: str | None = None,
    ) -> None:
        self.name = name
        """Unique name within the module, without the `%` sigil."""
        self.opcode = opcode
        """The opcode; `Opcode.UNKNOWN` for one rhino does not model."""
        self.opcode_text = opcode_text if opcode_text is not None else opcode.value
        """The opcode as written (differs from `opcode.value` only for UNKNOWN)."""
        self.shape = shape
        """Result shape (a tuple shape for multi-output instructions)."""
        self.operands: list[Instruction] = []
        """Operands in order; each operand lists this instruction among its `users`."""
        self.users: dict[Instruction, None] = {}
        """Instructions that take this one as an operand (insertion ordered, unique)."""
        if attrs:
            self._attrs = dict(attrs)
        self.parent: Computation | None = None
        """The computation this instruction belongs to."""
        if parameter_number is not None:
            self.parameter_number = parameter_number
        if literal is not None:
            self.literal = literal
        for op in operands or ():
            self.append_operand(op)

    @classmethod
    def parsed(
        cls,
        parent: Computation,
        name: str,
        opcode: Opcode,
        opcode_text: str,
        shape: Shape,
        operands: list[Instruction],
        pos: int,
        attr_text: str | None,
        attr_text_pos: int,
    ) -> Instruction:
        """An instruction read from text at offset `pos`, appended to `parent`.

        The parser's constructor, for speed: it takes `operands` as they are (no copy) and
        checks nothing, so the caller has checked that `name` is new in `parent` and that
        the operands are defined there. `attr_text` is the attribute tail as written,
        `, key=value, ...`, starting at offset `attr_text_pos` (split on first read); a
        parser that splits the attributes itself sets `attrs` and `attr_offsets` instead.
        """
        inst = object.__new__(cls)
        inst.name = name
        inst.opcode = opcode
        inst.opcode_text = opcode_text
        inst.shape = shape
        inst.operands = operands
        inst.users = {}
        inst.parent = parent
        inst.pos = pos
        if attr_text:
            inst._attr_text = attr_text
            inst._attr_text_pos = attr_text_pos
        for op in operands:
            op.users[inst] = None
        parent.instructions.append(inst)
        parent._by_name[name] = inst
        return inst

    def clone(self, operands: list[Instruction]) -> Instruction:
        """A copy of this instruction, in no computation, on `operands`: the same name,
        opcode, shape, attributes (texts, decoded values and source offsets), parameter
        number, literal and source offsets. `called` and `control_predecessors` are left
        empty for the caller to map."""
        new = Instruction(
            self.name,
            self.opcode,
            self.shape,
            operands,
            opcode_text=self.opcode_text,
            parameter_number=self.parameter_number,
            literal=self.literal,
        )
        if self._attrs is not None:
            new._attrs = dict(self._attrs)
        elif self._attr_text is not None:
            new._attr_text = self._attr_text
            new._attr_text_pos = self._attr_text_pos
        if self._attr_pos is not None:
            new._attr_pos = dict(self._attr_pos)
        if self._decoded is not None:
            new._decoded = dict(self._decoded)
        new.pos = self.pos
        if self.literal_pos >= 0:
            new.literal_pos = self.literal_pos
        return new

    # -- operands and users ---------------------------------------------------------
    def append_operand(self, op: Instruction) -> None:
        self.operands.append(op)
        op.users[self] = None

    def replace_operand(self, index: int, new: Instruction) -> None:
        old = self.operands[index]
        self.operands[index] = new
        if old not in self.operands:
            old.users.pop(self, None)
        new.users[self] = None

    def replace_all_uses_with(self, new: Instruction) -> None:
        """Make every user of this instruction use `new` instead."""
        for user in list(self.users):
            for i, op in enumerate(user.operands):
                if op is self:
                    user.replace_operand(i, new)

    # -- attributes -------------------------------------------------------------------
    @property
    def attrs(self) -> dict[str, str]:
        """Attribute texts, verbatim, in print order (`{"dimensions": "{0}"}`).

        Parsed instructions keep their attribute tail as one string until this is read.
        """
        attrs = self._attrs
        if attrs is None:
            attrs = self._attrs = self._split_attr_text() if self._attr_text else {}
        return attrs

    @attrs.setter
    def attrs(self, value: dict[str, str]) -> None:
        self._attrs = dict(value)
        self._attr_text = None

    @property
    def attr_text(self) -> str:
        """The attributes as printed: `, key=value, ...` (empty when there are none)."""
        if self._attrs is None:
            return self._attr_text or ""
        return "".join(f", {k}={v}" for k, v in self._attrs.items())

    @property
    def unsplit_attr_text(self) -> str | None:
        """The attribute tail as parsed, `, key=value, ...`, while nothing has read
        `attrs` (which splits it); else None."""
        return self._attr_text if self._attrs is None else None

    def split_attrs_like(self, other: Instruction) -> None:
        """Split this instruction's attribute tail as `other`'s was split: `other` was
        parsed with the same tail text and has read `attrs`. The same texts, offsets
        moved to this tail, no regex run."""
        assert other._attrs is not None and self._attr_text == other._attr_text
        shift = self._attr_text_pos - other._attr_text_pos
        self._attrs = dict(other._attrs)
        self._attr_pos = {key: offset + shift for key, offset in other.attr_offsets.items()}

    def _split_attr_text(self) -> dict[str, str]:
        text = self._attr_text or ""
        base = self._attr_text_pos
        attrs: dict[str, str] = {}
        positions = self._attr_pos if self._attr_pos is not None else {}
        for m in ATTR_ITEM.finditer(text):
            key = m.group(1)
            if key in attrs:
                raise self._located(f"attribute {key} given twice", base + m.start(1))
            attrs[key] = m.group(2)
            positions[key] = base + m.start(2)
        self._attr_pos = positions
        return attrs

    @property
    def attr_offsets(self) -> dict[str, int]:
        """Offset of each attribute's value in the source text (for parsed instructions;
        empty for built ones)."""
        if self._attrs is None and self._attr_text:
            self._attrs = self._split_attr_text()  # which records the offsets
        return self._attr_pos if self._attr_pos is not None else {}

    @attr_offsets.setter
    def attr_offsets(self, value: dict[str, int]) -> None:
        self._attr_pos = value

    def _located(self, message: str, offset: int) -> Exception:
        module = self.parent.parent if self.parent else None
        if module is not None and module.source is not None:
            return module.source.error(message, offset)
        return HloParseError(message, SourceSpan("<ir>", 0, 1, self.name))

    def attr(self, key: str, default: Any = None) -> Any:
        """The decoded value of attribute `key` (decoded once, then cached)."""
        decoded = self._decoded
        if decoded is not None and key in decoded:
            return decoded[key]
        text = self.attrs.get(key)
        if text is None:
            return default
        try:
            value = decode_attr(key, text)
        except TextError as e:
            raise self.attr_error(key, e) from None
        if decoded is None:
            decoded = self._decoded = {}
        decoded[key] = value
        return value

    def set_attr(self, key: str, value: Any) -> None:
        """Set attribute `key` to `value` (a decoded value, a bool, int, tuple, or text)."""
        from rhino.hlo.attrs import format_attr

        self.attrs[key] = format_attr(value)
        if self._decoded is None:
            self._decoded = {}
        self._decoded[key] = value

    def del_attr(self, key: str) -> None:
        self.attrs.pop(key, None)
        if self._decoded is not None:
            self._decoded.pop(key, None)

    def attr_error(self, key: str, e: TextError) -> Exception:
        """The error for attribute `key`, whose text `e` says is malformed: at its
        file:line:col when the parser recorded where it was."""
        if self._attr_pos is None or key not in self._attr_pos:
            return HloParseError(
                f"attribute {key}={self.attrs.get(key)} of %{self.name}: {e.message}",
                SourceSpan("<ir>", 0, 1, f"{self.name} ... {key}={self.attrs.get(key)}"),
            )
        return self._located(f"{key}: {e.message}", self._attr_pos[key] + e.offset)

    @property
    def sharding(self) -> Any:
        """The decoded `sharding=` attribute (an HloSharding), or None."""
        return self.attr("sharding")

    @property
    def is_root(self) -> bool:
        return self.parent is not None and self.parent.root is self

    def span(self) -> SourceSpan | None:
        """Where this instruction was parsed from, if it was."""
        module = self.parent.parent if self.parent else None
        if module is None or module.source is None or self.pos < 0:
            return None
        return module.source.span(self.pos)

    def __repr__(self) -> str:
        return f"<{self.opcode_text} %{self.name}: {self.shape}>"


class Computation:
    """A named list of instructions in definition order, one of them the ROOT."""

    def __init__(self, name: str, *, is_entry: bool = False, signature: str | None = None) -> None:
        self.name = name
        """Unique name within the module, without the `%` sigil."""
        self.is_entry = is_entry
        """Is this the module's ENTRY computation?"""
        self.signature = signature
        """Text between the name and `{`, verbatim (`(p: f32[2]) -> f32[2]`), if any."""
        self.attrs: dict[str, str] = {}
        """Attributes after the closing brace (`}, execution_thread="host"`), verbatim."""
        self.instructions: list[Instruction] = []
        """Instructions in definition order (operands before users)."""
        self.root: Instruction | None = None
        """The ROOT instruction (the last one when none is marked)."""
        self.parent: Module | None = None
        """The module this computation belongs to."""
        self._by_name: dict[str, Instruction] = {}

    def add(self, inst: Instruction, *, root: bool = False) -> Instruction:
        """Append `inst` (its operands must already be in this computation)."""
        if inst.name in self._by_name:
            raise ValueError(f"computation {self.name} already has an instruction %{inst.name}")
        inst.parent = self
        self.instructions.append(inst)
        self._by_name[inst.name] = inst
        if root:
            self.root = inst
        return inst

    def insert_before(self, anchor: Instruction, inst: Instruction) -> Instruction:
        """Insert `inst` just before `anchor` in definition order."""
        self.insert_all_before(anchor, [inst])
        return inst

    def insert_all_before(self, anchor: Instruction, insts: Sequence[Instruction]) -> None:
        """Insert `insts`, in their order, just before `anchor` (one search for the anchor
        and one splice, where an insert each cost a search through the list each)."""
        self._adopt(insts)
        at = self.instructions.index(anchor)
        self.instructions[at:at] = insts

    def _adopt(self, insts: Sequence[Instruction]) -> None:
        """Make `insts` this computation's by name (ValueError where a name is taken, or
        given twice), not yet placed in the list."""
        names = [inst.name for inst in insts]
        taken = [n for n in names if n in self._by_name]
        if taken or len(set(names)) < len(names):
            name = taken[0] if taken else next(n for n in names if names.count(n) > 1)
            raise ValueError(f"computation {self.name} already has an instruction %{name}")
        for inst in insts:
            inst.parent = self
            self._by_name[inst.name] = inst

    def remove(self, inst: Instruction) -> None:
        """Remove an instruction that has no users."""
        self._unlink(inst)
        self.instructions.remove(inst)

    def _unlink(self, inst: Instruction) -> None:
        """Forget `inst`, which must have no users, by name and as its operands' user
        (its place in the list is the caller's to drop)."""
        if inst.users:
            users = ", ".join(f"%{u.name}" for u in inst.users)
            raise ValueError(f"cannot remove %{inst.name}: still used by {users}")
        for op in set(inst.operands):
            op.users.pop(inst, None)
        del self._by_name[inst.name]

    def splice(self, replaced: Mapping[Instruction, Sequence[Instruction]]) -> None:
        """Put each instruction of `replaced` (none of them used any more, as for
        `remove`) out, and its instructions, in their order, where it stood: one pass over
        the list, where an `insert_all_before` and a `remove` for each searched it (the
        538 calls inlined into T5-large's 26k-instruction entry: a tenth of its graph's
        build)."""
        used = next((old for old in replaced if old.users), None)
        if used is not None:
            self._unlink(used)  # raises, before anything is changed
        self._adopt([inst for insts in replaced.values() for inst in insts])
        for old in replaced:
            self._unlink(old)
        out: list[Instruction] = []
        for inst in self.instructions:
            new = replaced.get(inst)
            if new is None:
                out.append(inst)
            else:
                out.extend(new)
        self.instructions[:] = out

    def get(self, name: str) -> Instruction | None:
        return self._by_name.get(name)

    @property
    def by_name(self) -> Mapping[str, Instruction]:
        """The instructions by name (read-only: `add`, `insert_before`, `remove` and
        `rename` keep it)."""
        return self._by_name

    def rename(self, inst: Instruction, name: str) -> None:
        """Give `inst` (of this computation) the name `name`, which none here has."""
        if name in self._by_name:
            raise ValueError(f"computation {self.name} already has an instruction %{name}")
        del self._by_name[inst.name]
        inst.name = name
        self._by_name[name] = inst

    def unused_name(self, base: str) -> str:
        """`base`, or `base.1`, `base.2`, ...: the first no instruction here has."""
        k, candidate = 0, base
        while candidate in self._by_name:
            k += 1
            candidate = f"{base}.{k}"
        return candidate

    def __getitem__(self, name: str) -> Instruction:
        return self._by_name[name]

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def __len__(self) -> int:
        return len(self.instructions)

    @property
    def parameters(self) -> list[Instruction]:
        """Parameter instructions ordered by parameter number."""
        params = [i for i in self.instructions if i.opcode is Opcode.PARAMETER]
        return sorted(params, key=lambda i: i.parameter_number or 0)

    def __repr__(self) -> str:
        return f"<computation {self.name}: {len(self.instructions)} instructions>"


@dataclass
class Module:
    """An HloModule: header attributes, computations, the ENTRY one among them."""

    name: str
    """The module name from `HloModule <name>`."""
    attrs: dict[str, str] = field(default_factory=dict)
    """Header attributes, verbatim (`entry_computation_layout`, `is_scheduled`, ...)."""
    computations: list[Computation] = field(default_factory=list)
    """Computations in print order (callees before callers, as XLA prints them)."""
    sections: list[str] = field(default_factory=list)
    """Verbatim blocks between the header and the first computation (FileNames, StackFrames)."""
    percent_names: bool = False
    """Print names with the `%` sigil (as the input did)."""
    source: Source | None = None
    """The text this module was parsed from (for error locations)."""

    def __post_init__(self) -> None:
        self._by_name: dict[str, Computation] = {}
        for c in self.computations:
            self._register(c)

    def _register(self, comp: Computation) -> None:
        if comp.name in self._by_name:
            raise ValueError(f"module {self.name} already has a computation {comp.name}")
        comp.parent = self
        self._by_name[comp.name] = comp

    def add_computation(self, comp: Computation) -> Computation:
        self._register(comp)
        self.computations.append(comp)
        return comp

    def computation(self, name: str) -> Computation | None:
        return self._by_name.get(name)

    def retain_computations(self, names: Collection[str]) -> None:
        """Keep only the computations named in `names`, in their order (the caller makes
        sure that none kept calls one dropped)."""
        self.computations = [c for c in self.computations if c.name in names]
        self._by_name = {c.name: c for c in self.computations}

    @property
    def entry(self) -> Computation:
        for c in self.computations:
            if c.is_entry:
                return c
        if not self.computations:
            raise ValueError(f"module {self.name} has no computations")
        return self.computations[-1]

    def instructions(self) -> Iterator[Instruction]:
        """All instructions of all computations."""
        for c in self.computations:
            yield from c.instructions

    @property
    def instruction_count(self) -> int:
        return sum(len(c.instructions) for c in self.computations)

    def __repr__(self) -> str:
        return (
            f"<HloModule {self.name}: {len(self.computations)} computations, "
            f"{self.instruction_count} instructions>"
        )
