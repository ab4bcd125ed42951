"""Library words -> CLI words: the one place that knows which flag sets which parameter.

The library names a request's parameters, never a flag (it is also called from Python):
an error about one starts with the parameter (`ConfigError(..., option="stages")`:
"stages 0: need at least 1 stage"), and a hint names one in backquotes ("raise
`epsilon`"). The CLI shows both as the flag that sets them: "--stages 0: ...", "raise
--epsilon".
"""

from __future__ import annotations

from rhino.hlo.errors import ConfigError, RhinoError

RENAMED = {"budget_bytes": "memory", "time_limit_s": "time-limit"}
"""Parameters whose flag is not their name with dashes."""

HINTED = ("epsilon", "time_limit_s", "loss", "budget_bytes", "devices", "module", "pin")
"""Parameters the library's hints name in backquotes."""


def flag(parameter: str) -> str:
    """The flag that sets `parameter`: `time_limit` -> `--time-limit`."""
    return "--" + RENAMED.get(parameter, parameter.replace("_", "-"))


def shown(error: RhinoError) -> str:
    """`error`'s message as the CLI shows it: parameters as their flags."""
    text = str(error)
    option = error.option if isinstance(error, ConfigError) else None
    if option is not None and text.startswith(option):
        text = flag(option) + text[len(option) :]
    return in_flags(text)


def in_flags(text: str) -> str:
    """A library text (an error, a warning) with each parameter it names in backquotes
    as its flag."""
    for parameter in HINTED:
        text = text.replace(f"`{parameter}`", flag(parameter))
    return text
