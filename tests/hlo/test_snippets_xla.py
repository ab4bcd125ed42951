"""The snippet corpus is valid HLO: XLA's own parser accepts every file, and each is documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from jax._src.lib import xla_client

SNIPPETS = Path(__file__).resolve().parents[1] / "data" / "snippets"
FILES = sorted(SNIPPETS.glob("*.hlo"))


def test_corpus_is_there() -> None:
    assert len(FILES) >= 25


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_xla_parses_snippet(path: Path) -> None:
    module = xla_client.hlo.hlo_module_from_text(path.read_text())
    assert module.computations()


# XLA prints tuple constants elided as `constant({...})` and then cannot parse that back.
NOT_A_FIXPOINT_IN_XLA = {"06_constants_arrays.hlo"}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="XLA elides tuple constants"))
        if p.name in NOT_A_FIXPOINT_IN_XLA
        else p
        for p in FILES
    ],
    ids=[p.name for p in FILES],
)
def test_xla_printing_of_snippet_is_a_fixpoint(path: Path) -> None:
    """XLA's printing, reparsed and printed again, is unchanged: a reference for ours."""
    printed = xla_client.hlo.hlo_module_from_text(path.read_text()).to_string()
    assert xla_client.hlo.hlo_module_from_text(printed).to_string() == printed


def test_readme_lists_exactly_the_snippets() -> None:
    readme = (SNIPPETS / "README.md").read_text()
    listed = set(re.findall(r"^- `([\w.-]+\.hlo)`", readme, re.MULTILINE))
    assert listed == {p.name for p in FILES}
