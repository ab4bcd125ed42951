"""XLA's HloSharding in its text form: parsed into a frozen dataclass and printed back.

The grammar, as XLA 0.10.2 prints and parses it (xla/hlo/parser/hlo_parser.cc
`ParseSharding`, `ParseSingleSharding`, `ParseTileAssignment`; xla/hlo/ir/hlo_sharding.cc
`HloSharding::Print`; xla/hlo/ir/tile_assignment.cc)::

    sharding     ::= '{' '}'                                  -- empty tuple
                   | '{' single (',' single)* '}'             -- tuple (flat, never nested)
                   | single
    single       ::= '{' item* '}' | '{' named '}'
    item         ::= 'replicated' | 'manual' | 'unknown' | 'unreduced'
                   | 'maximal' | 'device=' int
                   | 'devices=' '[' ints? ']' (ints | iota)   -- '[]' only as XLA prints it
                   | 'last_tile_dim_replicate'
                   | 'last_tile_dims=' '{' type (',' type)* '}'
                   | ('shard_as' | 'shard_like') int
                   | 'metadata=' '{' ... '}'                  -- kept verbatim
    iota         ::= '<=' '[' ints ']' ('T' '(' ints ')')?    -- T(...) iff >1 reshape dim
    type         ::= 'manual' | 'replicated' | 'unreduced' | 'maximal'
    named        ::= ('mesh' | 'maximal_mesh' | 'single_device') ...  -- kept verbatim
                                       (XLA from jaxlib 0.12 prints maximal_mesh as single_device)

Whitespace and `/* ... */` comments may separate tokens; an attribute name is glued to
its '='. XLA prints items in the order: kind or tile assignment, last_tile_dim_replicate,
last_tile_dims, shard_as/shard_like, metadata; a tuple puts `/*index=N*/` before every
fifth element. This module prints the same way, so parse then print is the identity on
XLA's printing. It does not apply XLA's semantic canonicalisations (sorting partial
replication groups, dropping size-1 subgroup dims, turning `[1,2] last_tile_dim_replicate`
into `{replicated}`); what was written is what is printed.

It is stricter than XLA where XLA accepts nonsense: repeated or conflicting keywords,
device lists that are not a permutation of range(n), a transpose that is not a
permutation, `last_tile_dim_replicate` together with `last_tile_dims=` (XLA aborts).
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rhino.hlo.errors import TextError

SUBGROUP_TYPES = ("manual", "replicated", "unreduced", "maximal")
"""The sharding types allowed in `last_tile_dims={...}`."""


class ShardingKind(enum.Enum):
    """What a sharding does with a tensor; TUPLE holds one sharding per tuple leaf."""

    REPLICATED = "replicated"
    MANUAL = "manual"
    MAXIMAL = "maximal"
    TILED = "tiled"
    TUPLE = "tuple"
    UNKNOWN = "unknown"
    UNREDUCED = "unreduced"
    NAMED = "named"
    """A mesh-axis sharding (`{mesh[...], [...]}`, `{maximal_mesh[...]}`,
    `{single_device[...]}`); kept verbatim."""


_KEYWORD_KINDS = {
    "replicated": ShardingKind.REPLICATED,
    "manual": ShardingKind.MANUAL,
    "unknown": ShardingKind.UNKNOWN,
    "unreduced": ShardingKind.UNREDUCED,
    "maximal": ShardingKind.MAXIMAL,
}
_DEVICELESS_KINDS = (
    ShardingKind.REPLICATED,
    ShardingKind.MANUAL,
    ShardingKind.UNKNOWN,
    ShardingKind.UNREDUCED,
)


@dataclass(frozen=True)
class ShardGroup:
    """`shard_as N` / `shard_like N`: shardings in one group are made equal (or alike)."""

    mode: str
    """"shard_as" or "shard_like"."""
    group_id: int
    """The group number."""

    def __post_init__(self) -> None:
        if self.mode not in ("shard_as", "shard_like"):
            raise ValueError(f"shard group mode must be shard_as or shard_like, got {self.mode!r}")

    def __str__(self) -> str:
        return f"{self.mode} {self.group_id}"


@dataclass(frozen=True)
class HloSharding:
    """One HloSharding value; build it with the static constructors or `parse_sharding`."""

    kind: ShardingKind
    """What sort of sharding this is."""
    tile_shape: tuple[int, ...] = ()
    """TILED: tile-assignment dims, the tensor's data dims followed by subgroup dims."""
    device_ids: tuple[int, ...] | None = None
    """TILED: the explicit device list, row-major; None when given as an iota."""
    iota_reshape: tuple[int, ...] | None = None
    """TILED: the `[2,4]` of `<=[2,4]T(1,0)`; None for an explicit device list."""
    iota_transpose: tuple[int, ...] | None = None
    """TILED: the `(1,0)` of `T(1,0)`; None when the iota has one reshape dim."""
    last_tile_dim_replicate: bool = False
    """TILED: the last tile dim holds replicas (XLA's older spelling of a subgroup)."""
    subgroup_types: tuple[str, ...] = ()
    """TILED: types of the trailing subgroup dims, from `last_tile_dims={...}`."""
    device: int | None = None
    """MAXIMAL: the one device that holds the whole tensor."""
    elements: tuple[HloSharding, ...] = ()
    """TUPLE: one sharding per leaf of the tuple shape, in order."""
    shard_group: ShardGroup | None = None
    """`shard_as N` / `shard_like N`, when present."""
    metadata: str | None = None
    """The value of `metadata=`, braces included, verbatim."""
    named_text: str | None = None
    """NAMED: the whole sharding text, braces included, verbatim."""

    def __post_init__(self) -> None:
        problem = _structure_problem(self)
        if problem is not None:
            raise ValueError(problem)

    # ----------------------------------------------------------------- constructors

    @staticmethod
    def replicated() -> HloSharding:
        return HloSharding(ShardingKind.REPLICATED)

    @staticmethod
    def manual() -> HloSharding:
        return HloSharding(ShardingKind.MANUAL)

    @staticmethod
    def unknown() -> HloSharding:
        return HloSharding(ShardingKind.UNKNOWN)

    @staticmethod
    def maximal(device: int) -> HloSharding:
        return HloSharding(ShardingKind.MAXIMAL, device=device)

    @staticmethod
    def tiled(
        tile_shape: Sequence[int],
        devices: Sequence[int],
        *,
        last_tile_dim_replicate: bool = False,
        subgroup_types: Sequence[str] = (),
    ) -> HloSharding:
        """A tiled sharding; devices are listed row-major over `tile_shape`.

        Printed in XLA's compact iota form (`<=[2,2]T(1,0)`, canonicalised as XLA does)
        when the device list is a transposed iota, else as an explicit list.
        """
        shape = tuple(int(d) for d in tile_shape)
        ids = tuple(int(d) for d in devices)
        problem = _tile_shape_problem(shape) or _device_list_problem(shape, ids)
        if problem is not None:
            raise ValueError(problem)
        iota = _find_iota(ids)
        reshape, transpose = iota if iota is not None else (None, None)
        return HloSharding(
            ShardingKind.TILED,
            tile_shape=shape,
            device_ids=None if iota is not None else ids,
            iota_reshape=reshape,
            iota_transpose=transpose,
            last_tile_dim_replicate=last_tile_dim_replicate,
            subgroup_types=tuple(subgroup_types),
        )

    @staticmethod
    def tuple_(elements: Sequence[HloSharding]) -> HloSharding:
        return HloSharding(ShardingKind.TUPLE, elements=tuple(elements))

    # ----------------------------------------------------------------- queries

    def devices(self) -> tuple[int, ...]:
        """Device ids in tile-assignment order (row-major), the iota expanded."""
        if self.kind is ShardingKind.MAXIMAL:
            assert self.device is not None
            return (self.device,)
        if self.kind is not ShardingKind.TILED:
            raise ValueError(f"a {self.kind.value} sharding has no device list: {self}")
        if self.device_ids is not None:
            return self.device_ids
        assert self.iota_reshape is not None
        return _iota_devices(self.iota_reshape, self.iota_transpose)

    def num_devices(self) -> int:
        """How many devices the tile assignment names (1 for MAXIMAL)."""
        if self.kind is ShardingKind.TILED:
            return math.prod(self.tile_shape)
        return len(self.devices())

    def subgroup_kinds(self) -> tuple[str, ...]:
        """Types of the trailing subgroup dims, `last_tile_dim_replicate` as "replicated"."""
        if self.last_tile_dim_replicate:
            return ("replicated",)
        return self.subgroup_types

    def data_tile_shape(self) -> tuple[int, ...]:
        """Tile counts for the tensor's own dims (the subgroup dims stripped)."""
        if self.kind is not ShardingKind.TILED:
            raise ValueError(f"a {self.kind.value} sharding has no tile shape: {self}")
        return self.tile_shape[: len(self.tile_shape) - len(self.subgroup_kinds())]

    def is_equivalent(self, other: HloSharding) -> bool:
        """Same placement of data, whatever the spelling (iota or explicit list).

        Metadata and shard groups are ignored; NAMED shardings compare by text.
        """
        if self.kind is not other.kind:
            return False
        if self.kind is ShardingKind.TUPLE:
            return len(self.elements) == len(other.elements) and all(
                a.is_equivalent(b) for a, b in zip(self.elements, other.elements, strict=True)
            )
        if self.kind is ShardingKind.TILED:
            return (
                self.tile_shape == other.tile_shape
                and self.subgroup_kinds() == other.subgroup_kinds()
                and self.devices() == other.devices()
            )
        return self.device == other.device and self.named_text == other.named_text

    # ----------------------------------------------------------------- printing

    def __str__(self) -> str:
        if self.kind is ShardingKind.TUPLE:
            parts = []
            for i, element in enumerate(self.elements):
                index = f"/*index={i}*/" if i > 0 and i % 5 == 0 else ""
                parts.append(index + str(element))
            return "{" + ", ".join(parts) + "}"
        if self.kind is ShardingKind.NAMED:
            assert self.named_text is not None
            return self.named_text
        if self.kind is ShardingKind.MAXIMAL:
            text = f"maximal device={self.device}"
        elif self.kind is ShardingKind.TILED:
            text = self._tile_assignment_text()
        else:
            text = self.kind.value
        if self.last_tile_dim_replicate:
            text += " last_tile_dim_replicate"
        if self.subgroup_types:
            text += " last_tile_dims={" + ", ".join(self.subgroup_types) + "}"
        if self.shard_group is not None:
            text += f" {self.shard_group}"
        if self.metadata is not None:
            text += f" metadata={self.metadata}"
        return "{" + text + "}"

    def _tile_assignment_text(self) -> str:
        text = "devices=[" + _ints(self.tile_shape) + "]"
        if self.device_ids is not None:
            return text + _ints(self.device_ids)
        assert self.iota_reshape is not None
        text += "<=[" + _ints(self.iota_reshape) + "]"
        if self.iota_transpose is not None:
            text += "T(" + _ints(self.iota_transpose) + ")"
        return text


def _ints(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values)


# --------------------------------------------------------------------- validation


def _structure_problem(s: HloSharding) -> str | None:
    """Why `s` is not a valid sharding, or None (the parser has checked most of it already)."""
    tiled_fields = (
        s.tile_shape
        or s.device_ids is not None
        or s.iota_reshape is not None
        or s.iota_transpose is not None
        or s.last_tile_dim_replicate
        or s.subgroup_types
    )
    if s.kind is ShardingKind.TUPLE:
        if tiled_fields or s.device is not None or s.metadata or s.shard_group:
            return "a tuple sharding carries only its elements (metadata goes on elements)"
        for element in s.elements:
            if element.kind is ShardingKind.TUPLE:
                return f"tuple shardings do not nest; got element {element}"
        return None
    if s.elements:
        return f"only a tuple sharding has elements, not a {s.kind.value} one"
    if s.kind is ShardingKind.NAMED:
        if s.named_text is None or tiled_fields or s.device is not None:
            return "a named sharding is kept only as its verbatim text"
        return None
    if s.named_text is not None:
        return f"only a named sharding has verbatim text, not a {s.kind.value} one"
    if s.kind is ShardingKind.MAXIMAL:
        if s.device is None or s.device < 0:
            return f"a maximal sharding needs a device id >= 0, got {s.device}"
        if tiled_fields:
            return "a maximal sharding takes no tile assignment"
        return None
    if s.device is not None:
        return f"device={s.device} is only valid in a maximal sharding, not {s.kind.value}"
    if s.kind in _DEVICELESS_KINDS:
        if tiled_fields:
            return f"a {s.kind.value} sharding takes no tile assignment"
        return None
    problem = _tile_assignment_problem(s.tile_shape, s.device_ids, s.iota_reshape, s.iota_transpose)
    if problem is not None:
        return problem[1]
    return _subgroup_problem(s.tile_shape, s.last_tile_dim_replicate, s.subgroup_types)


def _tile_assignment_problem(
    tile_shape: tuple[int, ...],
    device_ids: tuple[int, ...] | None,
    iota_reshape: tuple[int, ...] | None,
    iota_transpose: tuple[int, ...] | None,
) -> tuple[str, str] | None:
    """(part, message) for the first problem in a tile assignment, or None.

    part names where the problem is: "shape", "devices", "reshape" or "transpose".
    """
    shape_problem = _tile_shape_problem(tile_shape)
    if shape_problem is not None:
        return "shape", shape_problem
    n = math.prod(tile_shape)
    if (device_ids is None) == (iota_reshape is None):
        return "devices", "give either an explicit device list or an iota, not both or neither"
    if device_ids is not None:
        problem = _device_list_problem(tile_shape, device_ids)
        if problem is not None:
            return "devices", problem
        if len(device_ids) < 2:
            return "devices", "an explicit device list needs more than one device (XLA rule)"
        return None
    assert iota_reshape is not None
    if not iota_reshape or any(d < 1 for d in iota_reshape):
        return "reshape", f"iota reshape dims must be >= 1, got [{_ints(iota_reshape)}]"
    if math.prod(iota_reshape) != n:
        return "reshape", (
            f"iota reshape [{_ints(iota_reshape)}] has {math.prod(iota_reshape)} devices, "
            f"tile shape [{_ints(tile_shape)}] needs {n}"
        )
    if len(iota_reshape) == 1:
        if iota_transpose is not None:
            return "transpose", "a one-dim iota takes no transpose T(...)"
        return None
    if iota_transpose is None:
        return "transpose", (
            f"an iota with {len(iota_reshape)} reshape dims needs a transpose T(...)"
        )
    if sorted(iota_transpose) != list(range(len(iota_reshape))):
        return "transpose", (
            f"transpose T({_ints(iota_transpose)}) is not a permutation of "
            f"0..{len(iota_reshape) - 1}"
        )
    return None


def _tile_shape_problem(tile_shape: tuple[int, ...]) -> str | None:
    # No tile dims at all is legal: XLA prints `{devices=[]<=[1]}` for a one-device
    # sharding of a scalar (though its own parser then rejects that text).
    if any(d < 1 for d in tile_shape):
        return f"tile dims must be >= 1, got [{_ints(tile_shape)}]"
    return None


def _device_list_problem(tile_shape: tuple[int, ...], device_ids: tuple[int, ...]) -> str | None:
    n = math.prod(tile_shape)
    if len(device_ids) != n:
        return f"{len(device_ids)} device ids for tile shape [{_ints(tile_shape)}], which needs {n}"
    if sorted(device_ids) != list(range(n)):
        return f"device ids must be a permutation of 0..{n - 1}, got {_ints(device_ids)}"
    return None


def _subgroup_problem(
    tile_shape: tuple[int, ...], last_tile_dim_replicate: bool, subgroup_types: tuple[str, ...]
) -> str | None:
    if last_tile_dim_replicate and subgroup_types:
        return "last_tile_dim_replicate and last_tile_dims= cannot both be given"
    for t in subgroup_types:
        if t not in SUBGROUP_TYPES:
            return f"unknown subgroup type {t!r}; expected one of {', '.join(SUBGROUP_TYPES)}"
    count = 1 if last_tile_dim_replicate else len(subgroup_types)
    if count > len(tile_shape):
        return f"{count} subgroup dims but only {len(tile_shape)} tile dims"
    return None


# --------------------------------------------------------------------- iota helpers


def _iota_devices(reshape: Sequence[int], transpose: Sequence[int] | None) -> tuple[int, ...]:
    """range(n) reshaped to `reshape`, transposed by `transpose`, flattened."""
    array = np.arange(math.prod(reshape)).reshape(tuple(reshape))
    if transpose is not None:
        array = array.transpose(tuple(transpose))
    return tuple(int(d) for d in array.reshape(-1))


def _canonical_iota(
    reshape: Sequence[int], transpose: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """XLA's canonical spelling of an iota: size-1 dims dropped, runs merged.

    A run is a stretch of the transpose that reads k, k+1, ..., k+m: those reshape dims
    stay adjacent and in order after the transpose, so they are one dim.
    """
    perm = [p for p in transpose if reshape[p] != 1]
    runs: list[list[int]] = []
    for p in perm:
        if runs and _next_kept(reshape, runs[-1][-1]) == p:
            runs[-1].append(p)
        else:
            runs.append([p])
    if not runs:
        return (1,), None
    by_first = sorted(runs, key=lambda run: run[0])
    new_reshape = tuple(math.prod(reshape[p] for p in run) for run in by_first)
    new_perm = tuple(by_first.index(run) for run in runs)
    if len(new_reshape) == 1:
        return new_reshape, None
    return new_reshape, new_perm


def _next_kept(reshape: Sequence[int], p: int) -> int | None:
    """The next reshape dim after p that is not of size 1."""
    for q in range(p + 1, len(reshape)):
        if reshape[q] != 1:
            return q
    return None


def _find_iota(devices: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...] | None] | None:
    """(reshape, transpose) in canonical form with `_iota_devices(...) == devices`, or None.

    Reads the position dims from minor to major: a dim starts at position `block` (the
    product of the inner dims), its device stride is `devices[block]`, and it runs as
    long as `devices[t * block] == t * stride`. The strides, sorted, must then be those
    of a row-major array; the dims sorted by stride give the reshape, their order the
    transpose. The result is checked by expanding it.
    """
    n = len(devices)
    if n == 0 or devices[0] != 0:
        return None
    dims: list[tuple[int, int]] = []  # (size, device stride), minor dim first
    block = 1
    while block < n:
        stride = devices[block]
        size = 1
        while size * block < n and devices[size * block] == size * stride:
            size += 1
        if size == 1 or n % (size * block) != 0:
            return None
        dims.append((size, stride))
        block *= size
    by_stride = sorted(dims, key=lambda dim: dim[1])
    expected = 1
    for size, stride in by_stride:
        if stride != expected:
            return None
        expected *= size
    major_first = list(reversed(dims))
    reshape = [size for size, _ in reversed(by_stride)]
    strides = [stride for _, stride in reversed(by_stride)]
    transpose = [strides.index(stride) for _, stride in major_first]
    result = _canonical_iota(reshape or [1], transpose or [0])
    if _iota_devices(*result) != tuple(devices):
        return None
    return result


# --------------------------------------------------------------------- parser


@dataclass(frozen=True)
class _Token:
    kind: str
    """"{", "}", "[", "]", "(", ")", ",", "<=", "int", "word", "attr" or "eof"."""
    text: str
    """The token's text ("devices" for the attribute `devices=`)."""
    start: int
    end: int

    def describe(self) -> str:
        if self.kind == "eof":
            return "end of text"
        if self.kind == "int":
            return f"integer {self.text}"
        if self.kind == "attr":
            return f"'{self.text}='"
        return f"'{self.text}'"


_PUNCT = "{}[](),"
_WORD_START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
_WORD_CHARS = _WORD_START + "0123456789.-"


class _Parser:
    """A recursive-descent parser over one sharding's text; offsets index that text."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    # -- lexing

    def _skip_space(self) -> None:
        text = self.text
        while self.pos < len(text):
            if text[self.pos].isspace():
                self.pos += 1
            elif text.startswith("/*", self.pos):
                end = text.find("*/", self.pos + 2)
                if end < 0:
                    raise TextError("unterminated /* comment", self.pos)
                self.pos = end + 2
            else:
                return

    def peek(self) -> _Token:
        self._skip_space()
        text, start = self.text, self.pos
        if start >= len(text):
            return _Token("eof", "", start, start)
        c = text[start]
        if c in _PUNCT:
            return _Token(c, c, start, start + 1)
        if text.startswith("<=", start):
            return _Token("<=", "<=", start, start + 2)
        if c.isdigit() or (c == "-" and text[start + 1 : start + 2].isdigit()):
            end = start + 1
            while end < len(text) and text[end].isdigit():
                end += 1
            return _Token("int", text[start:end], start, end)
        if c in _WORD_START:
            end = start + 1
            while end < len(text) and text[end] in _WORD_CHARS:
                end += 1
            if text.startswith("=", end):
                return _Token("attr", text[start:end], start, end + 1)
            return _Token("word", text[start:end], start, end)
        raise TextError(f"unexpected character {c!r} in sharding", start)

    def next(self) -> _Token:
        token = self.peek()
        self.pos = token.end
        return token

    def expect(self, kind: str, what: str) -> _Token:
        token = self.peek()
        if token.kind != kind:
            raise TextError(f"expected {what}, found {token.describe()}", token.start)
        return self.next()

    def parse_optional(self, kind: str) -> _Token | None:
        if self.peek().kind == kind:
            return self.next()
        return None

    def parse_int(self, what: str) -> int:
        return int(self.expect("int", what).text)

    def parse_int_list(self, what: str) -> tuple[int, ...]:
        """ints ::= int (',' int)*"""
        values = [self.parse_int(what)]
        while self.parse_optional(","):
            values.append(self.parse_int(what))
        return tuple(values)

    def parse_braced_verbatim(self, start: int) -> str:
        """The text from the '{' at `start` to its matching '}', strings respected."""
        text = self.text
        depth = 0
        i = start
        while i < len(text):
            c = text[i]
            if c in "\"'":
                i = self._skip_string(i)
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    self.pos = i + 1
                    return text[start : i + 1]
            i += 1
        raise TextError("unbalanced '{' in sharding: no matching '}'", start)

    def _skip_string(self, start: int) -> int:
        quote = self.text[start]
        i = start + 1
        while i < len(self.text):
            if self.text[i] == "\\":
                i += 2
            elif self.text[i] == quote:
                return i + 1
            else:
                i += 1
        raise TextError("unterminated string in sharding", start)

    # -- grammar

    def parse_sharding(self) -> HloSharding:
        """sharding ::= '{' '}' | '{' single (',' single)* '}' | single"""
        open_brace = self.expect("{", "'{' to start a sharding")
        if self.parse_optional("}"):
            return HloSharding.tuple_(())
        if self.peek().kind != "{":
            return self.parse_single_body(open_brace.start)
        elements = [self.parse_single()]
        while self.parse_optional(","):
            elements.append(self.parse_single())
        self.expect("}", "',' or '}' after a tuple sharding element")
        return HloSharding.tuple_(elements)

    def parse_single(self) -> HloSharding:
        """single ::= '{' item* '}'"""
        open_brace = self.expect("{", "'{' to start a tuple sharding element")
        token = self.peek()
        if token.kind == "{":
            raise TextError("tuple shardings do not nest: expected a sharding keyword", token.start)
        if token.kind == "}":
            raise TextError(
                "expected a sharding inside '{}' (only the whole sharding may be an empty tuple)",
                token.start,
            )
        return self.parse_single_body(open_brace.start)

    def parse_single_body(self, open_offset: int) -> HloSharding:
        """The items of one sharding, up to and including its '}'."""
        first = self.peek()
        if first.kind == "word" and first.text in ("mesh", "maximal_mesh", "single_device"):
            text = self.parse_braced_verbatim(open_offset)
            return HloSharding(ShardingKind.NAMED, named_text=text)
        items = _Items(open_offset)
        while self.peek().kind != "}":
            self.parse_item(items)
        self.next()
        return items.build()

    def parse_item(self, items: _Items) -> None:
        token = self.next()
        if token.kind == "word" and token.text in _KEYWORD_KINDS:
            items.see("kind", token)
            items.kind = _KEYWORD_KINDS[token.text]
        elif token.kind == "word" and token.text == "last_tile_dim_replicate":
            items.see("last_tile_dim_replicate", token)
            items.last_tile_dim_replicate = True
        elif token.kind == "word" and token.text in ("shard_as", "shard_like"):
            items.see("shard_group", token)
            group_id = self.parse_int(f"an integer group id after '{token.text}'")
            items.shard_group = ShardGroup(token.text, group_id)
        elif token.kind == "attr" and token.text == "device":
            items.see("device", token)
            items.device = self.parse_int("an integer after 'device='")
        elif token.kind == "attr" and token.text == "devices":
            items.see("devices", token)
            self.parse_tile_assignment(items)
        elif token.kind == "attr" and token.text == "last_tile_dims":
            items.see("subgroup_types", token)
            items.subgroup_types = self.parse_subgroup_types()
        elif token.kind == "attr" and token.text == "metadata":
            items.see("metadata", token)
            brace = self.peek()
            if brace.kind != "{":
                raise TextError(
                    f"expected '{{' after 'metadata=', found {brace.describe()}", brace.start
                )
            items.metadata = self.parse_braced_verbatim(brace.start)
        else:
            raise TextError(
                "expected a sharding item (replicated, manual, maximal, unknown, unreduced, "
                "device=, devices=, last_tile_dim_replicate, last_tile_dims=, shard_as, "
                f"shard_like, metadata=) or '}}', found {token.describe()}",
                token.start,
            )

    def parse_tile_assignment(self, items: _Items) -> None:
        """'[' ints? ']' (ints | '<=' '[' ints ']' ('T' '(' ints ')')?)"""
        items.offsets["shape"] = self.expect("[", "'[' after 'devices='").end
        if self.peek().kind != "]":
            items.tile_shape = self.parse_int_list("an integer tile dim")
        self.expect("]", "',' or ']' after the tile dims")
        leq = self.parse_optional("<=")
        if leq is None:
            token = self.peek()
            items.offsets["devices"] = token.start
            if token.kind != "int":
                raise TextError(
                    f"expected device ids or '<=[' after 'devices=[...]', found {token.describe()}",
                    token.start,
                )
            items.device_ids = self.parse_int_list("a device id")
            return
        items.offsets["devices"] = leq.start
        items.offsets["reshape"] = self.expect("[", "'[' after '<='").end
        items.iota_reshape = self.parse_int_list("an integer iota reshape dim")
        self.expect("]", "',' or ']' after the iota reshape dims")
        token = self.peek()
        items.offsets["transpose"] = token.start
        if token.kind == "word" and token.text == "T":
            self.next()
            self.expect("(", "'(' after 'T'")
            items.iota_transpose = self.parse_int_list("an integer in the transpose T(...)")
            self.expect(")", "',' or ')' to end the transpose T(...)")

    def parse_subgroup_types(self) -> tuple[str, ...]:
        """'{' type (',' type)* '}'"""
        self.expect("{", "'{' after 'last_tile_dims='")
        types = []
        while True:
            token = self.next()
            if token.kind != "word" or token.text not in SUBGROUP_TYPES:
                raise TextError(
                    f"expected a subgroup type ({', '.join(SUBGROUP_TYPES)}), "
                    f"found {token.describe()}",
                    token.start,
                )
            types.append(token.text)
            if not self.parse_optional(","):
                break
        self.expect("}", "',' or '}' to end last_tile_dims")
        return tuple(types)


class _Items:
    """The items seen in one `{...}` and where they were, turned into an HloSharding."""

    def __init__(self, open_offset: int) -> None:
        self.open_offset = open_offset
        self.seen: dict[str, _Token] = {}
        """The token that introduced each item, by item name."""
        self.offsets: dict[str, int] = {}
        """Where each part of the tile assignment starts ("shape", "devices", ...)."""
        self.kind: ShardingKind | None = None
        self.tile_shape: tuple[int, ...] = ()
        self.device_ids: tuple[int, ...] | None = None
        self.iota_reshape: tuple[int, ...] | None = None
        self.iota_transpose: tuple[int, ...] | None = None
        self.last_tile_dim_replicate = False
        self.subgroup_types: tuple[str, ...] = ()
        self.device: int | None = None
        self.shard_group: ShardGroup | None = None
        self.metadata: str | None = None

    def see(self, name: str, token: _Token) -> None:
        """Record item `name`; each may appear once, and only one kind keyword."""
        earlier = self.seen.get(name)
        if earlier is not None:
            if earlier.text == token.text:
                message = f"{token.describe()} given twice in one sharding"
            else:
                message = f"{token.describe()} conflicts with {earlier.describe()} in one sharding"
            raise TextError(message, token.start)
        self.seen[name] = token

    def _error_at(self, name: str, message: str) -> TextError:
        token = self.seen.get(name)
        return TextError(message, token.start if token else self.open_offset)

    def build(self) -> HloSharding:
        kind = self.kind
        if kind is None:
            if "devices" not in self.seen:
                raise TextError(
                    "expected 'replicated', 'manual', 'maximal device=N', 'unknown', "
                    "'unreduced' or 'devices=[...]' in sharding",
                    self.open_offset,
                )
            kind = ShardingKind.TILED
        elif "devices" in self.seen:
            raise self._error_at("devices", f"a {kind.value} sharding takes no 'devices='")
        if "device" in self.seen and kind is not ShardingKind.MAXIMAL:
            raise self._error_at("device", "'device=' belongs to 'maximal' only")
        if kind is ShardingKind.MAXIMAL and "device" not in self.seen:
            raise self._error_at("kind", "'maximal' needs 'device=N'")
        if kind is ShardingKind.MAXIMAL and self.device is not None and self.device < 0:
            raise self._error_at("device", f"device id must be >= 0, got {self.device}")
        for name in ("last_tile_dim_replicate", "subgroup_types"):
            if name in self.seen and kind is not ShardingKind.TILED:
                raise self._error_at(name, f"{self.seen[name].describe()} needs a tiled sharding")
        if kind is ShardingKind.TILED:
            self._check_tile_assignment()
        return HloSharding(
            kind,
            tile_shape=self.tile_shape,
            device_ids=self.device_ids,
            iota_reshape=self.iota_reshape,
            iota_transpose=self.iota_transpose,
            last_tile_dim_replicate=self.last_tile_dim_replicate,
            subgroup_types=self.subgroup_types,
            device=self.device,
            shard_group=self.shard_group,
            metadata=self.metadata,
        )

    def _check_tile_assignment(self) -> None:
        problem = _tile_assignment_problem(
            self.tile_shape, self.device_ids, self.iota_reshape, self.iota_transpose
        )
        if problem is not None:
            part, message = problem
            raise TextError(message, self.offsets.get(part, self.open_offset))
        subgroup_message = _subgroup_problem(
            self.tile_shape, self.last_tile_dim_replicate, self.subgroup_types
        )
        if subgroup_message is not None:
            name = "subgroup_types" if self.subgroup_types else "last_tile_dim_replicate"
            raise self._error_at(name, subgroup_message)


@functools.lru_cache(maxsize=4096)
def parse_sharding(text: str) -> HloSharding:
    """Parse a whole sharding value, e.g. `{devices=[2,1,4]<=[8] last_tile_dim_replicate}`.

    Raises TextError with the offset into `text` of the first problem. Memoized (the
    value is frozen): a module repeats a few distinct shardings over thousands of
    instructions, and the Shardy conversion of a 30k-instruction step parsed 9.7k of them.
    """
    parser = _Parser(text)
    sharding = parser.parse_sharding()
    parser.expect("eof", "end of sharding")
    return sharding
