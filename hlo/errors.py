"""The one error hierarchy of rhino.

Every error that bad input can cause is a `RhinoError`; the CLI turns it into a message
and exit code 2 (1 for a failed verification). Anything else escaping is a bug in rhino.
It lives in the bottom layer (hlo) so that every layer can raise it.
"""

from __future__ import annotations

from dataclasses import dataclass


class RhinoError(Exception):
    """Base class: bad input, bad usage, or a request that cannot be met."""

    exit_code: int = 2


@dataclass(frozen=True)
class SourceSpan:
    """Where a piece of HLO text came from."""

    file: str
    """File name as given by the user ("<stdin>", "<string>" when there is none)."""
    line: int
    """1-based line number."""
    col: int
    """1-based column number."""
    source_line: str
    """The whole text of that line, without its newline."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class HloParseError(RhinoError):
    """Malformed HLO text, located at file:line:col."""

    def __init__(self, message: str, span: SourceSpan) -> None:
        self.message = message
        self.span = span
        caret = " " * (span.col - 1) + "^"
        super().__init__(f"{span}: error: {message}\n  {span.source_line}\n  {caret}")

    @property
    def line(self) -> int:
        return self.span.line

    @property
    def col(self) -> int:
        return self.span.col


class HloVerifyError(RhinoError):
    """A well-formed module that breaks an IR invariant (use before def, bad shapes...)."""


class ConfigError(RhinoError):
    """A bad configuration file, option value or YAML document.

    `option`: the request's parameter at fault (e.g. "stages"); the message then starts
    with it ("stages 0: need at least 1 stage"). The library never names a flag: a hint
    names a parameter in backquotes ("raise `epsilon`"), and the CLI shows both as their
    flags (`rhino.cli.flags`)."""

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class InfeasibleError(RhinoError):
    """No plan satisfies the constraints (memory budget, mesh divisibility, pins)."""


class ExecutionError(RhinoError):
    """XLA failed to compile or run a plan, or the devices asked for are not there."""


class JobLost(ExecutionError):
    """A process of a job of several stopped answering (it died, or its host or the
    coordinator became unreachable) while this one ran."""

    exit_code = 4


class VerificationFailed(RhinoError):
    """A plan ran but its outputs differ from the single-device outputs."""

    exit_code = 1


EXIT_CODES = {
    0: "ok",
    1: "the work finished, but a result failed its check: a run's outputs differ from the "
    "single-device run's, or an entry of a sweep failed",
    2: "bad input or usage (the message says what and where), nothing was done",
    3: "an internal error: a bug in rhino (--debug shows the traceback)",
    4: "a job of several processes lost one (it died, or its host or the coordinator "
    "became unreachable): the message names it",
    130: "interrupted (Ctrl-C); a sweep keeps the rows it finished",
    141: "the reader of the output went away (`rhino ... | head`)",
}
"""Every rhino command's exit codes (`rhino --help`, README)."""


class TextError(Exception):
    """Internal: a syntax error inside a fragment of text (an attribute value, a sharding).

    Sub-parsers that see only a fragment raise this with the offset into the fragment;
    the module parser, which knows where the fragment sits in the file, turns it into an
    `HloParseError` with the right line and column. It never escapes rhino.
    """

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset
