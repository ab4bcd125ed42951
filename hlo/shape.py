"""Element types and shapes, as XLA prints them.

A `Shape` is immutable and interned by its text form while parsing, so the thousands of
instructions that share `f32[8,1024]{1,0}` share one object.

Grammar (what `parse_shape` accepts):

    shape       := array_shape | tuple_shape
    tuple_shape := '(' [shape (',' shape)*] ')'
    array_shape := dtype '[' [dim (',' dim)*] ']' [layout]
    dim         := INT | '<=' INT | '?'
    layout      := '{' minor_to_major [':' tiling and memory-space suffixes] '}'

Layout suffixes (tiling `T(8,128)`, element size `E(4)`, memory space `S(1)`, ...) are
kept verbatim; rhino only reads minor_to_major.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from rhino.hlo.errors import TextError
from rhino.hlo.lexemes import DTYPE

# bits per element; sub-byte types count as a fraction of a byte
DTYPE_BITS: dict[str, int] = {
    "pred": 8,
    "s1": 1,
    "s2": 2,
    "s4": 4,
    "s8": 8,
    "s16": 16,
    "s32": 32,
    "s64": 64,
    "u1": 1,
    "u2": 2,
    "u4": 4,
    "u8": 8,
    "u16": 16,
    "u32": 32,
    "u64": 64,
    "f4e2m1fn": 4,
    "f8e3m4": 8,
    "f8e4m3": 8,
    "f8e4m3fn": 8,
    "f8e4m3b11fnuz": 8,
    "f8e4m3fnuz": 8,
    "f8e5m2": 8,
    "f8e5m2fnuz": 8,
    "f8e8m0fnu": 8,
    "bf16": 16,
    "f16": 16,
    "f32": 32,
    "f64": 64,
    "c64": 64,
    "c128": 128,
    "token": 0,
    "opaque": 0,
}

FLOAT_DTYPES = frozenset(k for k in DTYPE_BITS if k.startswith(("f", "bf")) or k in ("c64", "c128"))


@dataclass(frozen=True)
class Shape:
    """An array shape, or a tuple of shapes (then `dtype == "tuple"`)."""

    dtype: str
    """Element type as XLA spells it ("f32", "bf16", "pred", ...), or "tuple"."""
    dims: tuple[int, ...] = ()
    """Dimension sizes (the bound, for a dynamic dimension). Empty for scalars and tuples."""
    layout: str | None = None
    """Layout text between the braces, verbatim ("1,0", "1,0:T(8,128)"); None if absent."""
    dynamic: tuple[bool, ...] = ()
    """Per dim: is it dynamic (`<=N` or `?`)? Empty when no dim is dynamic."""
    elements: tuple[Shape, ...] = ()
    """Element shapes of a tuple."""

    @property
    def is_tuple(self) -> bool:
        return self.dtype == "tuple"

    @property
    def rank(self) -> int:
        return len(self.dims)

    @cached_property
    def numel(self) -> int:
        """Number of elements of an array shape (1 for a scalar, 0 for a tuple/token)."""
        if self.is_tuple or self.dtype in ("token", "opaque"):
            return 0
        n = 1
        for d in self.dims:
            n *= d
        return n

    @cached_property
    def byte_size(self) -> int:
        """Bytes of the data, summed over tuple elements (sub-byte types rounded up)."""
        if self.is_tuple:
            return sum(e.byte_size for e in self.elements)
        return (self.numel * DTYPE_BITS[self.dtype] + 7) // 8

    @property
    def element_bytes(self) -> float:
        return DTYPE_BITS[self.dtype] / 8

    @cached_property
    def minor_to_major(self) -> tuple[int, ...] | None:
        if self.layout is None:
            return None
        head = self.layout.split(":", 1)[0].strip()
        return tuple(int(x) for x in head.split(",")) if head else ()

    def leaves(self) -> list[Shape]:
        """Array shapes in a (nested) tuple, depth first; [self] for an array."""
        if not self.is_tuple:
            return [self]
        out: list[Shape] = []
        for e in self.elements:
            out.extend(e.leaves())
        return out

    def with_dims(self, dims: tuple[int, ...]) -> Shape:
        """The same element type with other dims and the default layout."""
        layout = ",".join(str(i) for i in reversed(range(len(dims)))) if dims else None
        return Shape(self.dtype, tuple(dims), layout)

    def __str__(self) -> str:
        return self.text

    @cached_property
    def text(self) -> str:
        """The shape as XLA prints it (`f32[8,16]{1,0}`), made once: shapes are shared by
        the instructions that have them, and a module printed (for its hash, a plan's
        file, `--emit-hlo`) spent 40% of the time making their texts again."""
        return _shape_text(self)


def _shape_text(s: Shape) -> str:
    if s.is_tuple:
        return "(" + ", ".join(_shape_text(e) for e in s.elements) + ")"
    if s.dynamic:
        dims = ",".join(
            f"<={d}" if dyn else str(d) for d, dyn in zip(s.dims, s.dynamic, strict=True)
        )
    else:
        dims = ",".join(map(str, s.dims))
    text = f"{s.dtype}[{dims}]"
    if s.layout is not None:
        text += "{" + s.layout + "}"
    return text


def array_shape(dtype: str, dims: tuple[int, ...] | list[int]) -> Shape:
    """A dense array shape with XLA's default (major-to-minor) layout."""
    if dtype not in DTYPE_BITS:
        raise ValueError(f"unknown element type {dtype!r}")
    return Shape(dtype, (), None).with_dims(tuple(dims))


def tuple_shape(elements: list[Shape] | tuple[Shape, ...]) -> Shape:
    return Shape("tuple", (), None, (), tuple(elements))


_ARRAY_RE = re.compile(r"(" + DTYPE + r")\[([^\]]*)\](?:\{([^{}]*)\})?")
_COMMENT_WS_RE = re.compile(r"(?:\s+|/\*.*?\*/)*", re.S)
_DIM_RE = re.compile(r"\s*(<=)?\s*(\d+|\?)\s*$")
_SIMPLE_DIMS_RE = re.compile(r"(?:\d+(?:,\d+)*)?")

# an array shape (group 1, as _ARRAY_RE matches it) and the ',' after it in a tuple,
# with the spaces and comments around the ',' (possessive, as `_skip` reads them: a
# comment ends at its first `*/`)
_ARRAY_THEN_COMMA = re.compile(
    r"(" + _ARRAY_RE.pattern + r")" + _COMMENT_WS_RE.pattern + r"+," + _COMMENT_WS_RE.pattern,
    re.S,
)

_cache: dict[str, Shape] = {}


def parse_shape_at(text: str, pos: int) -> tuple[Shape, int]:
    """Parse a shape starting at `pos`; return it and the position just after it.

    Raises TextError (with an absolute offset into `text`) on malformed input.
    """
    if pos < len(text) and text[pos] == "(":
        return _parse_tuple_at(text, pos)
    m = _ARRAY_RE.match(text, pos)
    if m is None:
        raise TextError(f"expected a shape like f32[8,16]{{1,0}}, got {_snippet(text, pos)}", pos)
    key = m.group(0)
    shape = _cache.get(key)
    if shape is None:
        shape = _make_array(m)
        if len(_cache) < 100_000:
            _cache[key] = shape
    return shape, m.end()


def _make_array(m: re.Match[str]) -> Shape:
    dtype, dims_text, layout = m.group(1), m.group(2), m.group(3)
    if dtype not in DTYPE_BITS:
        raise TextError(f"unknown element type {dtype!r}", m.start(1))
    if _SIMPLE_DIMS_RE.fullmatch(dims_text):
        dims = tuple(int(d) for d in dims_text.split(",")) if dims_text else ()
        dynamic: tuple[bool, ...] = ()
    else:
        dims_l: list[int] = []
        dyn_l: list[bool] = []
        offset = m.start(2)
        for part in dims_text.split(","):
            dm = _DIM_RE.match(part)
            if dm is None:
                raise TextError(f"bad dimension {part.strip()!r} in shape", offset)
            bound = dm.group(2)
            dims_l.append(-1 if bound == "?" else int(bound))
            dyn_l.append(dm.group(1) is not None or bound == "?")
            offset += len(part) + 1
        dims, dynamic = tuple(dims_l), tuple(dyn_l)
        if not any(dynamic):
            dynamic = ()
    if layout is not None:
        head = layout.split(":", 1)[0]
        if head.strip():
            try:
                m2m = [int(x) for x in head.split(",")]
            except ValueError:
                raise TextError(f"bad layout {{{layout}}}", m.start(3)) from None
            if sorted(m2m) != list(range(len(dims))):
                raise TextError(
                    f"layout {{{head}}} is not a permutation of the {len(dims)} dims of the shape",
                    m.start(3),
                )
        elif dims:
            raise TextError(f"empty layout {{}} for a rank-{len(dims)} shape", m.start(3))
    return Shape(dtype, dims, layout, dynamic)


def _parse_tuple_at(text: str, pos: int) -> tuple[Shape, int]:
    start = pos
    pos += 1
    elements: list[Shape] = []
    pos = _skip(text, pos)
    if pos < len(text) and text[pos] == ")":
        return tuple_shape(()), pos + 1
    while True:
        m = _ARRAY_THEN_COMMA.match(text, pos)
        if m is not None and m.group(1) in _cache:  # the common element, in one match
            elements.append(_cache[m.group(1)])
            pos = m.end()
            continue
        shape, pos = parse_shape_at(text, pos)
        elements.append(shape)
        pos = _skip(text, pos)
        if pos >= len(text):
            raise TextError("unterminated tuple shape: expected ')'", start)
        c = text[pos]
        if c == ")":
            return tuple_shape(tuple(elements)), pos + 1
        if c != ",":
            raise TextError(f"expected ',' or ')' in tuple shape, got {_snippet(text, pos)}", pos)
        pos = _skip(text, pos + 1)


def _skip(text: str, pos: int) -> int:
    return _COMMENT_WS_RE.match(text, pos).end()  # type: ignore[union-attr]


def _snippet(text: str, pos: int) -> str:
    frag = text[pos : pos + 20].split("\n", 1)[0]
    return repr(frag) if frag else "end of line"


def parse_shape(text: str) -> Shape:
    """Parse a whole string as one shape."""
    shape, end = parse_shape_at(text, _skip(text, 0))
    end = _skip(text, end)
    if end != len(text):
        raise TextError(f"unexpected text after shape: {_snippet(text, end)}", end)
    return shape
