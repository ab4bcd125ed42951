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
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

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
    if text.strip() == "{...}":
        return None
    tokens = [
        (m.group(0), m.start()) for m in _TOKEN.finditer(text) if not m.group(0).startswith("/*")
    ]
    reader = _Reader(tokens, text)
    value = reader.literal(shape)
    if reader.i != len(tokens):
        tok, pos = tokens[reader.i]
        raise TextError(f"unexpected {tok!r} after the end of the literal", pos)
    return value


class _Reader:
    def __init__(self, tokens: list[tuple[str, int]], text: str) -> None:
        self.tokens = tokens
        self.text = text
        self.i = 0

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
        kind = _kind(dtype)
        if kind is np.int64 or kind is np.uint64:
            try:
                return int(tok)
            except ValueError:
                raise TextError(f"expected an integer for {dtype}, got {tok!r}", pos) from None
        return float(tok.split("(")[0])


def _kind(dtype: str) -> Any:
    if dtype == "pred":
        return np.bool_
    if dtype.startswith("s"):
        return np.int64
    if dtype.startswith("u"):
        return np.uint64
    if dtype in ("c64", "c128"):
        return np.complex128
    return np.float64
