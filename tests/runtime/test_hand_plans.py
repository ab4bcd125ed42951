"""Issue 9's plan-quality suite on its small cases: rhino's plan against hand plans
(data parallel, ZeRO, Megatron) written with jax shardings, all compiled by XLA.

The whole suite, zoo models included, is `scripts/bench_hand_plans.py`; these cases
run in seconds."""

from __future__ import annotations

import sys

import pytest

from tests.hlo.corpus import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import bench_hand_plans  # noqa: E402

KNOWN_GAPS = {
    # XLA partitions the embedding gradient's scatter-add by sending the updates to
    # their table shard (an all-to-all, 32 KiB, and the indices all-gathered); rhino's
    # rule for scatter has no such strategy and predicts a reduce-scatter of the table
    "gpt tiny": "scatter-add: XLA all-to-alls the updates where rhino reduce-scatters the table",
}


@pytest.mark.parametrize("case", ["mlp batch4096 hidden64", "mlp batch16 hidden4096", "gpt tiny"])
def test_rhino_is_at_least_as_good_as_every_hand_plan(case: str) -> None:
    row = bench_hand_plans.run_case(case)
    checks = row["checks"]
    assert set(row["hand"]) >= {"data parallel", "zero", "megatron"}
    assert checks["at_or_below_every_hand_estimate"], row
    assert checks["bytes"] != "more", row
    if case in KNOWN_GAPS and not checks["fidelity_ok"]:
        pytest.xfail(KNOWN_GAPS[case])
    assert checks["fidelity_ok"], row  # the emitted program moves what the plan predicts
