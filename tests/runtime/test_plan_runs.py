"""Plans the search makes compile with XLA's SPMD partitioner and compute what the
single-device program computes (simulated CPU devices)."""

from __future__ import annotations

import pytest

from rhino.hlo.parser import parse_file
from rhino.hlo.printer import print_module
from rhino.runtime.apply import apply_plan, planned_module
from rhino.runtime.verify import run_and_compare
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.planner import PlanRequest, make_plan
from tests.hlo.corpus import ROOT


@pytest.mark.parametrize(
    ("path", "mesh"), [("tests/data/mlp_step.hlo", "1x4"), ("examples/mlp.hlo", "2x4")]
)
def test_plan_compiles_runs_and_matches(path: str, mesh: str) -> None:
    module = parse_file(ROOT / path)
    plan = make_plan(module, PlanRequest(parse_mesh(mesh), load_cluster("m8")))
    report = run_and_compare(print_module(planned_module(module)), print_module(apply_plan(module, plan)),
                             parse_mesh(mesh).size, seed=0)  # fmt: skip
    assert report.ok, report.summary()
