"""Regular expressions for the pieces of HLO text, shared by the parser and the IR.

The attribute-value pattern covers what XLA prints on one line: braces nested two deep
with strings inside, strings, and atoms with bracketed parts (`[2,2]<=[4]T(1,0)`,
`b01f_01io->b01f`). Anything else goes to the parser's exact (slower) scanner.
"""

from __future__ import annotations

import re

STRING = r'"(?:[^"\\\n]|\\.)*"'
_BRACED1 = r'\{(?:[^{}"\n]|' + STRING + r")*\}"
_BRACED2 = r'\{(?:[^{}"\n]|' + STRING + r"|" + _BRACED1 + r")*\}"
_ATOM = r"(?:[^\s,{}()\"\[\]]|\[[^\[\]\n]*\]|\([^()\n]*\))+"
VALUE = r"(?:" + _BRACED2 + r"|" + STRING + r"|" + _ATOM + r")"
ATTR_KEY = r"[A-Za-z_][\w\-]*"

# one `, key=value` of an attribute tail
ATTR_ITEM = re.compile(r",[ \t]*(" + ATTR_KEY + r")=(" + VALUE + r")")

# a whole ordinary instruction line: name = array-shape opcode(simple args), attributes
FAST_LINE = re.compile(
    r"\s*(ROOT[ \t]+)?%?([A-Za-z_][\w.\-]*)[ \t]*=[ \t]*"
    r"([a-z][a-z0-9]*\[[\d,]*\](?:\{[^{}\n]*\})?)[ \t]+([a-z][a-z0-9\-]*)\("
    r"([^()\n\"/]*)\)"
    r"((?:,[ \t]*" + ATTR_KEY + r"=" + VALUE + r")*)[ \t]*(?=\n|$)"
)
