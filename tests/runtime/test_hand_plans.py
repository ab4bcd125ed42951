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


@pytest.mark.parametrize("case", ["mlp batch4096 hidden64", "mlp batch16 hidden4096", "gpt tiny"])
def test_rhino_is_at_least_as_good_as_every_hand_plan(case: str) -> None:
    row = bench_hand_plans.run_case(case)
    checks = row["checks"]
    assert set(row["hand"]) >= {"data parallel", "zero", "megatron"}
    assert checks["at_or_below_every_hand_estimate"], row
    assert checks["bytes"] != "more", row
    assert checks["fidelity_ok"], row  # the emitted program moves what the plan predicts
