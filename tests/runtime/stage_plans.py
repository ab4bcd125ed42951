"""Stage plans of the committed zoo examples, made once per test session."""

from __future__ import annotations

import functools

from rhino.hlo.ir import Module
from rhino.hlo.parser import parse_file
from rhino.runtime.pipeline.programs import StagePlan
from rhino.search.cluster import load_cluster
from rhino.search.pipeline import PipelineRequest, plan_pipeline
from rhino.search.problem import SolveOptions
from tests.hlo.corpus import ROOT

EPSILON = {("moe_tiny", 4): 0.5, ("unet_tiny", 4): 0.5, ("mlp", 2): 0.6}
"""Balance tolerances that admit a plan (the default 0.1 has none for these)."""


@functools.cache
def example(name: str) -> Module:
    return parse_file(ROOT / "examples" / f"{name}.hlo")


@functools.cache
def stage_plan(name: str, stages: int) -> StagePlan:
    """`rhino pipeline examples/NAME.hlo --stages STAGES`, as the runtime reads it."""
    request = PipelineRequest(
        stages,
        EPSILON.get((name, stages), 0.1),
        8,
        load_cluster("m8"),
        SolveOptions(time_limit_s=20, threads=1, work_limit=2.0),
    )
    return StagePlan.from_json(plan_pipeline(example(name), request).to_json())
