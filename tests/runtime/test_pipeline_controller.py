"""Rhino §3's controller on the MLP and 4 devices: every layout (SPMD meshes, stages of
one and of two devices) estimated with the planner's cost model, the lowest kept, and a
pipeline's estimate no lower than its busiest stage working through every micro-batch.
Through the CLI: `rhino pipeline --compare`."""

from __future__ import annotations

import dataclasses
import json

from click.testing import CliRunner

from rhino.cli.main import cli
from rhino.hlo.parser import parse_module
from rhino.runtime.pipeline.controller import compare_layouts
from rhino.runtime.pipeline.programs import stage_programs
from rhino.search.cluster import load_cluster
from rhino.search.mesh import DeviceMesh, mesh_factorizations
from rhino.search.problem import SolveOptions
from rhino.search.spmd.planner import PlanRequest, make_plan
from tests.hlo.corpus import ROOT
from tests.runtime.stage_plans import example

REQUEST = PlanRequest(
    DeviceMesh((4,)), load_cluster("m8"), solve=SolveOptions(time_limit_s=20, threads=1)
)


def test_every_layout_is_estimated_and_the_lowest_kept() -> None:
    found = compare_layouts(example("mlp"), 4, REQUEST, microbatches=4, epsilon=0.6)
    layouts = [(c.kind, c.mesh.shape) for c in found.candidates]
    spmd = [("spmd", m.shape) for m in mesh_factorizations(4)]
    assert layouts == [*spmd, ("hybrid", (2, 2)), ("pipeline", (4, 1))]
    planned = [c for c in found.candidates if c.step_s is not None]
    assert found.best is not None and found.best.step_s == min(c.step_s or 0 for c in planned)
    unplanned = [c for c in found.candidates if c.step_s is None]
    assert all(c.note for c in unplanned)  # each says why (here: no balanced 4-stage plan)

    (hybrid,) = [c for c in found.candidates if c.kind == "hybrid"]
    assert hybrid.stage_plan is not None and hybrid.stage_plan.stages == 2
    programs = stage_programs(example("mlp"), hybrid.stage_plan, 4)
    two = dataclasses.replace(REQUEST, mesh=DeviceMesh((2,)))
    per_microbatch = [
        sum(
            make_plan(parse_module(p.text, "<p>"), two).objective_s
            for (s, kind), p in programs.programs.items()
            if s == stage and kind != "U"
        )
        for stage in range(2)
    ]
    assert hybrid.step_s is not None and hybrid.step_s >= 4 * max(per_microbatch) * (1 - 1e-9)


def test_cli_compare_reports_the_best_layout() -> None:
    mlp = str(ROOT / "examples" / "mlp.hlo")
    r = CliRunner().invoke(
        cli,
        ["pipeline", mlp, "--compare", "4", "--microbatches", "4", "--epsilon", "0.6", "--json"],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["schema"] == "rhino.pipeline.compare/1" and len(doc["candidates"]) == 4
    steps = [c["step_s"] for c in doc["candidates"] if c["step_s"] is not None]
    assert doc["best"]["step_s"] == min(steps)
    r = CliRunner().invoke(cli, ["pipeline", mlp, "--compare", "4", "--stages", "2"])
    assert r.exit_code == 2 and "takes no --stages" in r.output
