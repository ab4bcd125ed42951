"""Decode the literal of a `constant(...)` into numpy values, checked against its shape.

Grammar:

    literal := scalar | array | tuple
    scalar  := NUMBER | 'true' | 'false' | 'inf' | '-inf' | 'nan' | '-nan' | complex
    complex := '(' NUMBER ',' NUMBER ')'
    array   := '{' [literal (',' literal)*] '}'      nested once per dimension
    tuple   := '(' literal (',' literal)* ')'         for tuple shapes

An elided literal `{...}` (XLA's print_large_constants=false) decodes to None.
Values come back as float64 / int64 / bool / complex128 arrays (bf16 and f8 widen to
float64); the planner only reads small constants (trip counts, iota bounds).
`check_literal` reads a literal as `decode_literal` does without building the arrays
(and so, for the usual values, without importing numpy: `rhino parse` checks every
literal and needs none of their values).
"""

from __future__ import annotations

import re
from typing import Any

from rhino.hlo.errors import TextError
from rhino.hlo.shape import Shape

_TOKEN = re.compile(r"[-+]?nan\(0x[0-9a-fA-F]+\)|/\*.*?\*/|[{}(),]|[^\s{}(),/]+|\S", re.S)
_NUMBER = re.compile(
    r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|inf|nan(?:\(0x[0-9a-fA-F]+\))?)"
)


def decode_literal(text: str, shape: Shape) -> Any:
    """numpy array (or tuple of them) for `text` as a literal of `shape`; TextError if not.

    XLA prints large constants as `{...}` when asked to elide them; their value is
    unknown and decodes to None.
    """
    return _read(text, shape, build=True)


def check_literal(text: str, shape: Shape) -> None:
    """Raise what `decode_literal(text, shape)` would raise, and nothing if it would
    succeed; arrays are built (numpy imported) only for values numpy might refuse."""
    _read(text, shape, build=False)


def decode_scalar(text: str, shape: Shape) -> bool | int | float | complex | None:
    """The value of a literal of one element (an array `shape` whose numel is 1) as a
    Python bool, int, float or complex, read as `decode_literal` reads it but without
    numpy (a trip count in `rhino parse`); None where it is elided. TextError if not."""
    if text.strip() == "{...}" or shape.dtype == "token":
        return None
    reader = _reader(text, build=False)
    values: list[Any] = []
    reader.array(shape, 0, values)
    reader.finish()
    return values[0]


def _read(text: str, shape: Shape, *, build: bool) -> Any:
    if text.strip() == "{...}":
        return None
    reader = _reader(text, build=build)
    value = reader.literal(shape)
    reader.finish()
    return value


def _reader(text: str, *, build: bool) -> _Reader:
    tokens = [
        (m.group(0), m.start()) for m in _TOKEN.finditer(text) if not m.group(0).startswith("/*")
    ]
    return _Reader(tokens, text, build=build)


class _Reader:
    def __init__(self, tokens: list[tuple[str, int]], text: str, *, build: bool) -> None:
        self.tokens = tokens
        self.text = text
        self.i = 0
        self.build = build
        """Return numpy arrays; else None where numpy would surely accept the values."""

    def finish(self) -> None:
        """Raise TextError where tokens are left after the literal."""
        if self.i != len(self.tokens):
            tok, pos = self.tokens[self.i]
            raise TextError(f"unexpected {tok!r} after the end of the literal", pos)

    def peek(self) -> tuple[str, int]:
        if self.i >= len(self.tokens):
            return "", len(self.text)
        return self.tokens[self.i]

    def expect(self, tok: str) -> None:
        got, pos = self.peek()
        if got != tok:
            raise TextError(f"expected {tok!r} in literal, got {got or 'end of literal'!r}", pos)
        self.i += 1

    def literal(self, shape: Shape) -> Any:
        if shape.is_tuple:
            self.expect("(")
            out = []
            for k, element in enumerate(shape.elements):
                if k:
                    self.expect(",")
                out.append(self.literal(element))
            self.expect(")")
            return tuple(out)
        if shape.dtype == "token":
            return None
        values: list[Any] = []
        self.array(shape, 0, values)
        if not self.build and _numpy_accepts(shape, values):
            return None
        import numpy as np

        kind = _kind(shape.dtype)
        arr = np.array(values, dtype=kind) if values else np.zeros((0,), dtype=kind)
        return arr.reshape(shape.dims)

    def array(self, shape: Shape, depth: int, out: list[Any]) -> None:
        if depth == shape.rank:
            out.append(self.scalar(shape.dtype))
            return
        self.expect("{")
        n = shape.dims[depth]
        for k in range(n):
            if k:
                self.expect(",")
            self.array(shape, depth + 1, out)
        got, pos = self.peek()
        if got != "}":
            raise TextError(
                f"literal has more than {n} elements along dimension {depth} of {shape}", pos
            )
        self.i += 1

    def scalar(self, dtype: str) -> Any:
        tok, pos = self.peek()
        if dtype in ("c64", "c128"):
            self.expect("(")
            re_ = self.number(dtype)
            self.expect(",")
            im = self.number(dtype)
            self.expect(")")
            return complex(re_, im)
        return self.number(dtype)

    def number(self, dtype: str) -> Any:
        tok, pos = self.peek()
        self.i += 1
        if dtype == "pred":
            if tok in ("true", "false"):
                return tok == "true"
            if tok in ("0", "1"):
                return tok == "1"
            raise TextError(f"expected true or false, got {tok!r}", pos)
        if not _NUMBER.fullmatch(tok):
            raise TextError(f"expected a number, got {tok or 'end of literal'!r}", pos)
        if _is_integer(dtype):
            try:
                return int(tok)
            except ValueError:
                raise TextError(f"expected an integer for {dtype}, got {tok!r}", pos) from None
        return float(tok.split("(")[0])


def _is_integer(dtype: str) -> bool:
    """Is `dtype` read as int64 or uint64 (see `_kind`)?"""
    return dtype != "pred" and dtype.startswith(("s", "u"))


def _numpy_accepts(shape: Shape, values: list[Any]) -> bool:
    """Would `np.array(values, _kind(dtype)).reshape(dims)` surely succeed? (Integers
    outside int64/uint64, or two unknown dims, make numpy raise.)"""
    if any(d < 0 for d in shape.dims):
        return False
    if _is_integer(shape.dtype):
        low, high = (-(2**63), 2**63) if shape.dtype.startswith("s") else (0, 2**64)
        return all(low <= v < high for v in values)
    return True


def _kind(dtype: str) -> Any:
    import numpy as np

    if dtype == "pred":
        return np.bool_
    if dtype.startswith("s"):
        return np.int64
    if dtype.startswith("u"):
        return np.uint64
    if dtype in ("c64", "c128"):
        return np.complex128
    return np.float64
