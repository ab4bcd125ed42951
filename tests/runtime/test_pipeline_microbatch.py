"""Where the batch is, instruction by instruction, on hand-written steps: a mean loss's
sum and its weight gradient are partial sums over the batch (the micro-batches' values
add up to the full batch's), the update runs once per step, a batch-independent
broadcast read with per-example values is resized, and batch statistics are refused."""

from __future__ import annotations

import pytest

from rhino.hlo.errors import ConfigError
from rhino.hlo.parser import parse_file, parse_module
from rhino.hlo.verify import verify
from rhino.runtime.pipeline.microbatch import (
    PARTIAL,
    STEP,
    batch_facts,
    flat_step,
)
from rhino.runtime.pipeline.rewrite import microbatch_module
from rhino.search.pipeline.split import split_step
from tests.hlo.corpus import ROOT

STEP_TEXT = """HloModule step

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[8,4] parameter(0)
  w = f32[4,4] parameter(1)
  v = f32[4,4] parameter(2)
  h = f32[8,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  sq = f32[8,4] multiply(h, h)
  zero = f32[] constant(0)
  total = f32[] reduce(sq, zero), dimensions={0,1}, to_apply=add
  n = f32[] constant(32)
  nb = f32[] broadcast(n), dimensions={}
  loss = f32[] divide(total, nb)
  c = f32[] constant(0.0625)
  scale = f32[8,4] broadcast(c), dimensions={}
  dh = f32[8,4] multiply(scale, h)
  gw = f32[4,4] dot(x, dh), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  nv = f32[4,4] add(v, gw)
  nw = f32[4,4] subtract(w, nv)
  ROOT out = (f32[], f32[4,4], f32[4,4]) tuple(loss, nw, nv)
}
"""


def facts_of(text: str, m: int):
    flat, _ = flat_step(parse_module(text, "<test>"))
    return flat, batch_facts(flat, split_step(flat), m)


def test_a_mean_loss_and_its_gradient_are_partial_sums() -> None:
    flat, facts = facts_of(STEP_TEXT, 4)
    s = facts.state
    assert facts.batch == 8 and facts.data == ("x",)
    assert (s["x"], s["h"], s["sq"], s["dh"]) == (0, 0, 0, 0)
    assert (s["total"], s["loss"], s["gw"]) == (PARTIAL, PARTIAL, PARTIAL)
    assert (s["nv"], s["nw"]) == (STEP, STEP)
    assert s["w"] is None and s["scale"] is None
    assert facts.resize == {("dh", 0): 0}  # the full-batch broadcast is cut where h meets it


def test_the_rewrite_cuts_every_per_example_shape_and_keeps_constants() -> None:
    flat, facts = facts_of(STEP_TEXT, 4)
    cut = microbatch_module(flat, facts)
    verify(cut)
    entry = cut.entry
    assert entry["x"].shape.dims == (2, 4) and entry["h"].shape.dims == (2, 4)
    assert entry["w"].shape.dims == (4, 4) and entry["gw"].shape.dims == (4, 4)
    assert entry["scale"].shape.dims == (8, 4)  # kept for any full-batch reader...
    assert entry["dh"].operands[0].shape.dims == (2, 4)  # ...and a copy cut for dh
    assert entry["n"].literal == "32"  # the mean still divides by the full batch


def test_batch_statistics_are_refused() -> None:
    text = (
        STEP_TEXT.replace(
            "  sq = f32[8,4] multiply(h, h)\n",
            "  mean = f32[4] reduce(h, zero), dimensions={0}, to_apply=add\n"
            "  mb = f32[8,4] broadcast(mean), dimensions={1}\n"
            "  sq = f32[8,4] subtract(h, mb)\n",
        )
        .replace("  zero = f32[] constant(0)\n", "")
        .replace("  h = f32[8,4] dot", "  zero = f32[] constant(0)\n  h = f32[8,4] dot")
    )
    with pytest.raises(ConfigError, match="batch statistics"):
        facts_of(text, 2)


def test_a_maximum_over_the_batch_is_refused() -> None:
    text = STEP_TEXT.replace("ROOT s = f32[] add(a, b)", "ROOT s = f32[] maximum(a, b)")
    with pytest.raises(ConfigError, match="something other than a sum"):
        facts_of(text, 2)


def test_micro_batches_must_divide_the_batch() -> None:
    with pytest.raises(ConfigError, match="3 micro-batches do not divide the batch of 8"):
        facts_of(STEP_TEXT, 3)


@pytest.mark.parametrize(
    ("name", "refusal"),
    [
        ("mlp_optimized", None),  # XLA's fusions, inlined
        ("vgg19_tiny", None),  # max-pool gradients (select-and-scatter) per example
        ("wresnet_tiny", "batch statistics"),  # batch normalization
        # a mean over the masked tokens: the mask's count is read whole, its rows sliced
        ("dnabert_tiny", None),
        ("gpt_scan_tiny", "no micro-batch rule for this opcode"),  # layers in a while loop
    ],
)
def test_zoo_steps_are_cut_or_refused_with_the_reason(name: str, refusal: str | None) -> None:
    flat, _ = flat_step(parse_file(ROOT / "examples" / f"{name}.hlo"))
    if refusal is None:
        facts = batch_facts(flat, split_step(flat), 2)
        verify(microbatch_module(flat, facts))
        assert any(s == PARTIAL for s in facts.state.values())
    else:
        with pytest.raises(ConfigError, match=refusal):
            batch_facts(flat, split_step(flat), 2)
