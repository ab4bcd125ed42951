"""XLA's own parser accepts everything rhino prints and counts the same instructions."""

from __future__ import annotations

from pathlib import Path

import pytest

from rhino.hlo.parser import parse_file
from rhino.hlo.printer import print_module
from rhino.runtime.xla_bridge import xla_parse
from tests.hlo.corpus import corpus_files, corpus_ids


@pytest.mark.parametrize("path", corpus_files(), ids=corpus_ids())
def test_xla_accepts_rhino_output_with_the_same_instruction_count(path: Path) -> None:
    module = parse_file(path, lazy=False)
    info = xla_parse(print_module(module))
    assert info.instruction_count == module.instruction_count
    assert dict(info.computation_sizes) == {c.name: len(c.instructions) for c in module.computations}
