"""Every zoo model in its small configuration (and the post-optimization MLP dump), on
meshes 1x8, 2x4 and 8x1 of simulated CPU devices: the O3 plan compiles, runs, computes
what the single-device program computes, and XLA moves the bytes the plan predicted
(within 10%).

Plans are made for the `cpu` cluster (the devices these tests run on), whose cheap
links make the tiny models shard; on M8 most of them come out replicated.
"""

from __future__ import annotations

import pytest

from rhino.hlo.parser import parse_file
from rhino.runtime.spmd.runner import RunOptions, run_plan
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.problem import SolveOptions
from rhino.search.spmd.planner import PlanRequest, make_plan
from tests.hlo.corpus import ROOT

MODELS = (
    "mlp",
    "mlp_optimized",
    "gpt_tiny",
    "gpt_scan_tiny",
    "moe_tiny",
    "wresnet_tiny",
    "unet_tiny",
    "dnabert_tiny",
    "vgg19_tiny",
)
MESHES = ("1x8", "2x4", "8x1")


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("model", MODELS)
def test_zoo_plan_runs_matches_and_moves_the_predicted_bytes(model: str, mesh: str) -> None:
    module = parse_file(ROOT / "examples" / f"{model}.hlo")
    request = PlanRequest(
        parse_mesh(mesh), load_cluster("cpu"), solve=SolveOptions(time_limit_s=20)
    )
    plan = make_plan(module, request)
    report = run_plan(module, plan, RunOptions(steps=1, warmup=0, baseline=False))
    assert report.ok, report.verify
    fidelity = report.fidelity
    assert fidelity.ratio is not None and abs(fidelity.ratio - 1) <= 0.10, fidelity.messages()
