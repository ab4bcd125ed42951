"""Plans the search makes compile with XLA's SPMD partitioner and compute what the
single-device program computes (simulated CPU devices)."""

from __future__ import annotations

import pytest

from rhino.hlo.parser import parse_file
from rhino.hlo.printer import print_module
from rhino.runtime.spmd.apply import apply_plan, planned_module
from rhino.runtime.verify import run_and_compare
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.problem import SolveOptions, Tuning
from rhino.search.spmd.planner import PlanRequest, make_plan
from tests.hlo.corpus import ROOT


@pytest.mark.parametrize(
    ("path", "mesh"), [("tests/data/mlp_step.hlo", "1x4"), ("examples/mlp.hlo", "2x4")]
)
def test_plan_compiles_runs_and_matches(path: str, mesh: str) -> None:
    module = parse_file(ROOT / path)
    plan = make_plan(module, PlanRequest(parse_mesh(mesh), load_cluster("m8")))
    report = run_and_compare(
        print_module(planned_module(module)),
        print_module(apply_plan(module, plan)),
        parse_mesh(mesh).size,
        seed=0,
    )
    assert report.ok, report.summary()


def test_a_strided_plan_runs_and_the_report_says_where_xla_chose_its_own_layout() -> None:
    from rhino.runtime.spmd.runner import RunOptions, run_plan
    from rhino.search.spmd.spec import parse_spec

    module = parse_file(ROOT / "tests/data/strided_reshape.hlo")
    pins = (("p", parse_spec("RS1")), ("out", parse_spec("RS1")))
    plan = make_plan(module, PlanRequest(parse_mesh("1x4"), load_cluster("m8"), pins=pins))
    assert plan.instruction("r").outs == ("RS0[s=1]",)
    report = run_plan(module, plan, RunOptions(steps=1, warmup=0, baseline=False))
    assert report.ok
    notes = [n for n in report.notes if n.startswith("%r:")]
    assert notes and "non-maximal stride" in notes[0], report.notes


def test_an_o2_plan_from_segments_compiles_runs_and_matches() -> None:
    """O2's level 3 (segments solved apart, then refined) still yields a plan XLA runs
    and that computes what the single-device program computes."""
    module = parse_file(ROOT / "examples/gpt_tiny.hlo")
    segments = SolveOptions(tuning=Tuning(whole_core_pairs=0))  # even on a small model
    request = PlanRequest(parse_mesh("2x4"), load_cluster("m8"), "O2", solve=segments)
    plan = make_plan(module, request)
    sizes = plan.solver.sizes
    assert plan.solver.merge_level == 3 and sizes is not None and (sizes.segments or 0) > 1
    report = run_and_compare(
        print_module(planned_module(module)), print_module(apply_plan(module, plan)), 8, seed=0
    )
    assert report.ok, report.summary()
