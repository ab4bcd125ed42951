"""Passes keep the numbers: the module before and after computes the same outputs."""

from __future__ import annotations

import numpy as np
import pytest

from rhino.hlo.parser import parse_file
from rhino.hlo.passes import inline_calls
from rhino.hlo.printer import print_module
from rhino.runtime import xla_bridge as xb
from rhino.runtime.inputs import entry_inputs
from tests.hlo.corpus import ROOT


@pytest.mark.parametrize("name", ["mlp.hlo", "gpt_tiny.hlo", "gpt_scan_tiny.hlo"])
def test_inline_calls_keeps_the_outputs(name: str) -> None:
    before = parse_file(ROOT / "examples" / name)
    after = inline_calls(before)
    devices = xb.local_devices("cpu", 1)
    inputs = [maker.whole() for maker in entry_inputs(before, seed=0)]
    want = xb.execute(xb.compile_spmd(print_module(before), devices, num_partitions=1), inputs)
    got = xb.execute(xb.compile_spmd(print_module(after), devices, num_partitions=1), inputs)
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        assert np.isfinite(w).all()
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_flattened_optimized_dump_computes_what_its_source_computes() -> None:
    """XLA's CPU backend will not compile the fusions of a post-optimization dump; the
    flattened module compiles and gives the unoptimized program's outputs."""
    from rhino.hlo.passes import flatten

    source = parse_file(ROOT / "examples" / "mlp.hlo")
    optimized = flatten(parse_file(ROOT / "examples" / "mlp_optimized.hlo"))
    assert [p.shape.dims for p in optimized.entry.parameters] == [
        p.shape.dims for p in source.entry.parameters
    ]
    devices = xb.local_devices("cpu", 1)
    inputs = [maker.whole() for maker in entry_inputs(source, seed=0)]
    want = xb.execute(xb.compile_spmd(print_module(source), devices, num_partitions=1), inputs)
    got = xb.execute(xb.compile_spmd(print_module(optimized), devices, num_partitions=1), inputs)
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
