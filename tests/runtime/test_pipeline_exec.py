"""Stage plans of the zoo's GPT, MoE and UNet run on simulated CPU devices, stage s on
device s, and compute the single-device step: the loss, every updated parameter and the
optimizer state (113 to 116 outputs), for 2 and 4 stages, 1, 4 and 8 micro-batches, under
1F1B and GPipe. The programs of a (model, stages, micro-batches) are compiled once and
run under both schedules; each schedule's measured task order and bytes between stages
are the planned ones. A hybrid plan (2 stages of 4 devices, each stage's programs
sharded by their own SPMD plans) computes the same step.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from rhino.hlo.printer import print_module
from rhino.runtime import xla_bridge as xb
from rhino.runtime.inputs import entry_inputs
from rhino.runtime.pipeline.run import prepare, run_steps
from rhino.runtime.verify import compare_outputs
from rhino.search.cluster import load_cluster
from rhino.search.mesh import DeviceMesh
from rhino.search.problem import SolveOptions
from rhino.search.spmd.planner import PlanRequest
from tests.runtime.stage_plans import example, stage_plan

CASES = [  # every model at 2 and 4 stages; every micro-batch count at two of them
    ("gpt_tiny", 2, 1),
    ("gpt_tiny", 4, 8),
    ("moe_tiny", 2, 8),
    ("moe_tiny", 4, 4),
    ("unet_tiny", 2, 4),
    ("unet_tiny", 4, 1),
]


@functools.cache
def reference(name: str) -> tuple[list[np.ndarray], tuple[np.ndarray, ...]]:
    """The step's inputs (seed 0) and its single-device outputs."""
    module = example(name)
    inputs = [m.whole() for m in entry_inputs(module, 0)]
    devices = xb.local_devices(None, 1)
    compiled = xb.compile_spmd(print_module(module), devices, num_partitions=1, optimize=False)
    return inputs, xb.execute(compiled, inputs)


@pytest.mark.parametrize(("name", "stages", "microbatches"), CASES)
def test_stage_plan_computes_the_single_device_step(
    name: str, stages: int, microbatches: int
) -> None:
    pipeline = prepare(example(name), stage_plan(name, stages), microbatches, optimize=False)
    assert {k[0] for k in pipeline.programs.programs} == set(range(stages))
    inputs, want = reference(name)
    for schedule in ("1f1b", "gpipe"):
        table, (record,) = run_steps(pipeline, schedule, inputs, steps=1)
        checks = compare_outputs(want, list(record.outputs))
        assert all(c.ok for c in checks), [c.describe() for c in checks if not c.ok]
        ran = [[t for t, _, _ in record.events if t.stage == s] for s in range(stages)]
        assert ran == [list(tasks) for tasks in table.actions]
        assert record.sent == pipeline.graph.sent_bytes()


def test_hybrid_2x4_shards_every_stage_and_computes_the_single_device_step() -> None:
    """Rhino §5: pipeline on mesh axis 0, SPMD on the other (4 devices a stage)."""
    spmd = PlanRequest(DeviceMesh((4,)), load_cluster("cpu"), solve=SolveOptions(time_limit_s=20))
    pipeline = prepare(example("gpt_tiny"), stage_plan("gpt_tiny", 2), 2, optimize=False, spmd=spmd)
    assert [len(g) for g in pipeline.groups] == [4, 4]
    assert not set(pipeline.groups[0]) & set(pipeline.groups[1])
    for s in range(2):  # the backward of each stage is split over its 4 devices
        layouts = {p.sharding for p in pipeline.compiled[f"B{s}"].parameters}
        assert layouts - {"{replicated}"}, layouts
    # every program of the stages (accumulations too) partitioned by Shardy, as jax does
    assert {c.partitioner for c in pipeline.compiled.values()} == {"shardy"}
    assert not [n for n in pipeline.notes if "GSPMD" in n], pipeline.notes
    inputs, want = reference("gpt_tiny")
    _, (record,) = run_steps(pipeline, "1f1b", inputs, steps=1)
    checks = compare_outputs(want, list(record.outputs))
    assert all(c.ok for c in checks), [c.describe() for c in checks if not c.ok]
    assert record.sent == pipeline.graph.sent_bytes()
