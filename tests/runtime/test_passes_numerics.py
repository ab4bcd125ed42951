"""Passes keep the numbers: the module before and after computes the same outputs."""

from __future__ import annotations

import numpy as np
import pytest

from rhino.hlo.parser import parse_file
from rhino.hlo.passes import inline_calls
from rhino.hlo.printer import print_module
from rhino.runtime import xla_bridge as xb
from tests.hlo.corpus import ROOT


def random_inputs(module, seed: int = 0) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    out = []
    for p in module.entry.parameters:
        dims = p.shape.dims
        if p.shape.dtype.startswith(("s", "u")):
            out.append(
                rng.integers(0, 4, size=dims).astype(
                    np.int32 if p.shape.dtype == "s32" else np.int64
                )
            )
        else:
            out.append(rng.standard_normal(dims).astype(np.float32))
    return out


@pytest.mark.parametrize("name", ["mlp.hlo", "gpt_tiny.hlo", "gpt_scan_tiny.hlo"])
def test_inline_calls_keeps_the_outputs(name: str) -> None:
    before = parse_file(ROOT / "examples" / name)
    after = inline_calls(before)
    devices = xb.local_devices("cpu", 1)
    inputs = random_inputs(before)
    want = xb.execute(xb.compile_spmd(print_module(before), devices, num_partitions=1), inputs)
    got = xb.execute(xb.compile_spmd(print_module(after), devices, num_partitions=1), inputs)
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
