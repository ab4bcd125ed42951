"""The tokens of HLO text as regular expressions, shared by the parser and the IR.

The instruction grammar is written here once, as token patterns that every instruction
pattern is composed of:

    instruction := ['ROOT'] ['%'] NAME '=' shape OPCODE '(' operands ')' (',' KEY '=' VALUE)*

The parser reads an instruction on one of two paths made of the same pieces:
- fast: `INSTRUCTION_LINE` matches a whole ordinary line (an array shape, simple operands,
  attribute values of the usual forms) in one go;
- exact: `INSTRUCTION_HEAD` (or `INSTRUCTION_LHS`, the shape parser of `rhino.hlo.shape`
  and `OPCODE_CALL` for other shapes), then operands and attributes scanned token by
  token, which reports any error with its position.

The attribute-value pattern covers what XLA prints on one line: braces nested two deep
with strings inside, strings, and atoms with bracketed parts (`[2,2]<=[4]T(1,0)`,
`b01f_01io->b01f`). Anything else goes to the parser's exact (slower) scanner.
"""

from __future__ import annotations

import re

NAME = r"[A-Za-z_][\w.\-]*"
"""An instruction or computation name (without the `%` sigil)."""
OPCODE = r"[a-z][a-z0-9\-]*"
"""An opcode as written (`add`, `all-reduce`, ...)."""
DTYPE = r"[a-z][a-z0-9]*"
"""An element type as written (`f32`, `bf16`, `pred`, ...); `rhino.hlo.shape` checks it."""
ARRAY_SHAPE = DTYPE + r"\[[\d,]*\](?:\{[^{}\n]*\})?"
"""A static array shape with an optional layout; other shapes go to `rhino.hlo.shape`."""
STRING = r'"(?:[^"\\\n]|\\.)*"'
"""A double-quoted string with backslash escapes, on one line."""
ATTR_KEY = r"[A-Za-z_][\w\-]*"
"""An attribute key (`dimensions`, `control-predecessors`, ...)."""
BRACED1 = r'\{(?:[^{}"\n]|' + STRING + r")*\}"
"""A brace group on one line, with strings but no nested braces."""
_BRACED2 = r'\{(?:[^{}"\n]|' + STRING + r"|" + BRACED1 + r")*\}"
_ATOM = r"(?:[^\s,{}()\"\[\]]|\[[^\[\]\n]*\]|\([^()\n]*\))+"
VALUE = r"(?:" + _BRACED2 + r"|" + STRING + r"|" + _ATOM + r")"
"""An attribute value of the usual forms, on one line."""

_LHS = r"(ROOT[ \t]+)?%?(" + NAME + r")[ \t]*=[ \t]*"
_HEAD = _LHS + r"(" + ARRAY_SHAPE + r")[ \t]+(" + OPCODE + r")\("
_SIMPLE_ARGS = r"([^()\n\"/]*)\)"
_ATTR_TAIL = r"((?:,[ \t]*" + ATTR_KEY + r"=" + VALUE + r")*)"

# `[ROOT] [%]name = `: groups root, name
INSTRUCTION_LHS = re.compile(_LHS)

# `[ROOT] [%]name = array-shape opcode(`: groups root, name, shape, opcode
INSTRUCTION_HEAD = re.compile(_HEAD)

# `opcode(` after the shape (exact path)
OPCODE_CALL = re.compile(r"(" + OPCODE + r")[ \t]*\(")

# a whole ordinary instruction line, from the end of the previous one: the groups of
# INSTRUCTION_HEAD, then the text between the parentheses and the attribute tail
INSTRUCTION_LINE = re.compile(r"\s*" + _HEAD + _SIMPLE_ARGS + _ATTR_TAIL + r"[ \t]*(?=\n|$)")

# one `, key=value` of an attribute tail
ATTR_ITEM = re.compile(r",[ \t]*(" + ATTR_KEY + r")=(" + VALUE + r")")
