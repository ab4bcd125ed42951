"""XLA's own parser accepts everything rhino prints and counts the same instructions.

XLA turns async sugar (`reduce-scatter-start`, `custom-call-start`, ...) into hidden
`async_wrapped` computations that are not in the text; those are the only difference
allowed, computation by computation.
"""

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
    ours = {c.name: len(c.instructions) for c in module.computations}
    assert {name: info.computation_sizes.get(name) for name in ours} == ours
    extra = {name: n for name, n in info.computation_sizes.items() if name not in ours}
    assert all(name.startswith("async_wrapped") for name in extra), extra
    assert info.instruction_count - sum(extra.values()) == module.instruction_count
