"""Malformed input only ever raises HloParseError, at a real line and column.

Real files are mutated at random (characters deleted, inserted, replaced; lines cut or
repeated). Whatever rhino accepts must print back to a fixpoint and survive `verify`
and `summarize` raising nothing but RhinoError: `rhino parse` never shows a traceback.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rhino.hlo.analysis import summarize
from rhino.hlo.errors import HloParseError, RhinoError
from rhino.hlo.parser import parse_module
from rhino.hlo.printer import print_module
from rhino.hlo.verify import verify
from tests.hlo.corpus import corpus_files

SMALL = [p for p in corpus_files() if p.stat().st_size < 60_000]
TEXTS = {p: p.read_text() for p in SMALL}
ALPHABET = list('{}[](),=%"/*:<>-_.x \n0123456789abfsT') + ["ROOT ", "ENTRY ", "f32[", "/*", "*/"]


def mutate(text: str, kind: str, pos: int, piece: str, length: int) -> str:
    if kind == "delete":
        return text[:pos] + text[pos + length :]
    if kind == "insert":
        return text[:pos] + piece + text[pos:]
    if kind == "replace":
        return text[:pos] + piece + text[pos + len(piece) :]
    if kind == "truncate":
        return text[:pos]
    lines = text.split("\n")
    k = pos % len(lines)
    if kind == "duplicate_line":
        return "\n".join(lines[: k + 1] + [lines[k]] + lines[k + 1 :])
    return "\n".join(lines[:k] + lines[k + 1 :])  # drop_line


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(data=st.data())
def test_mutated_files_only_raise_parse_errors(data: st.DataObject) -> None:
    path: Path = data.draw(st.sampled_from(SMALL), label="file")
    text = TEXTS[path]
    kind = data.draw(
        st.sampled_from(["delete", "insert", "replace", "truncate", "duplicate_line", "drop_line"])
    )
    pos = data.draw(st.integers(0, len(text) - 1), label="pos")
    piece = data.draw(st.sampled_from(ALPHABET), label="piece")
    length = data.draw(st.integers(1, 8), label="length")
    mutated = mutate(text, kind, pos, piece, length)
    try:
        module = parse_module(mutated, "fuzz.hlo", lazy=False)
    except HloParseError as e:
        assert 1 <= e.line <= mutated.count("\n") + 1
        assert 1 <= e.col <= len(e.span.source_line) + 1
        assert str(e).startswith(f"fuzz.hlo:{e.line}:{e.col}: error: ")
        return
    printed = print_module(module)
    assert print_module(parse_module(printed, lazy=False)) == printed
    try:
        verify(module)
        summarize(module)
    except RhinoError:
        pass


def test_every_prefix_of_a_file_parses_or_fails_cleanly() -> None:
    text = TEXTS[next(p for p in SMALL if p.name == "mlp_step.hlo")]
    for end in range(0, len(text), 7):
        try:
            parse_module(text[:end], lazy=False)
        except HloParseError:
            pass
