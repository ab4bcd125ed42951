"""The fast path (one regex per ordinary line) and the exact parser build the same IR;
every modelled attribute decodes, prints in XLA's form, and decodes to the same value."""

from __future__ import annotations

from pathlib import Path

import pytest

from rhino.hlo.attrs import DECODERS, decode_attr, format_attr
from rhino.hlo.ir import Module
from rhino.hlo.parser import parse_file
from rhino.hlo.printer import print_module
from tests.hlo.corpus import corpus_files, corpus_ids


def fingerprint(m: Module) -> list[tuple[object, ...]]:
    out = []
    for comp in m.computations:
        out.append(
            (comp.name, comp.is_entry, comp.signature, comp.root.name if comp.root else None)
        )
        for i in comp.instructions:
            out.append(
                (
                    i.name,
                    i.opcode,
                    i.opcode_text,
                    i.shape,
                    tuple(o.name for o in i.operands),
                    dict(i.attrs),
                    i.parameter_number,
                    i.literal,
                    tuple(c.name for c in i.called),
                    tuple(p.name for p in i.control_predecessors),
                    i.span(),
                    i.literal_pos,
                    dict(i.attr_offsets),
                )
            )
    return out


@pytest.mark.parametrize("path", corpus_files(), ids=corpus_ids())
def test_fast_and_exact_paths_agree(path: Path) -> None:
    fast = parse_file(path)
    from rhino.hlo.parser import parse_module

    exact = parse_module(path.read_text(), str(path), fast=False)
    assert fingerprint(fast) == fingerprint(exact)
    assert print_module(fast) == print_module(exact)


@pytest.mark.parametrize("path", corpus_files(), ids=corpus_ids())
def test_modelled_attributes_round_trip(path: Path) -> None:
    module = parse_file(path)
    for inst in module.instructions():
        for key, text in inst.attrs.items():
            if key not in DECODERS:
                continue
            value = inst.attr(key)
            again = decode_attr(key, format_attr(value))
            assert again == value, f"%{inst.name} {key}={text} -> {value} -> {again}"
