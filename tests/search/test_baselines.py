"""The plain data-parallel baseline: replicated state, batch-split data, gradient all-reduce."""

from __future__ import annotations

from pathlib import Path

import pytest

from rhino.hlo.errors import ConfigError
from rhino.hlo.parser import parse_file, parse_module
from rhino.runtime.spmd.runner import RunOptions, run_plan
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.spmd.baselines import LEVEL, batch_split, data_parallel_inputs, data_parallel_plan
from rhino.search.spmd.plan import Plan
from rhino.search.spmd.planner import PlanRequest, make_plan
from rhino.search.spmd.spec import parse_spec
from tests.hlo.corpus import ROOT
from tests.solving import TO_THE_END

MLP_STEP = ROOT / "tests" / "data" / "mlp_step.hlo"  # batch 4: x f32[4,16], y f32[4,8]
WEIGHTS = {"params_0_.1": (16, 32), "params_1_.1": (32, 8)}
GRADIENT_DOTS = {"dot_general.9": 16 * 32 * 4, "dot_general.7": 32 * 8 * 4}  # bytes


def dp_plan(path: Path, mesh: str) -> Plan:
    return data_parallel_plan(parse_file(path), parse_mesh(mesh), load_cluster("m8"))


def layout(plan: Plan, name: str) -> str:
    inst = plan.instruction(name)
    assert inst is not None, name
    return inst.outs[0]


@pytest.mark.parametrize(
    ("mesh", "spec"), [("1x8", "RS0"), ("8x1", "S0R"), ("2x4", "S0S0"), ("8", "S0")]
)
def test_batch_split_uses_every_axis(mesh: str, spec: str) -> None:
    assert batch_split(parse_mesh(mesh)) == parse_spec(spec)


@pytest.mark.parametrize(("mesh", "split"), [("1x4", "RS0"), ("2x2", "S0S0")])
def test_weights_replicated_data_split_on_the_batch(mesh: str, split: str) -> None:
    plan = dp_plan(MLP_STEP, mesh)
    assert plan.level == LEVEL
    for weight in WEIGHTS:
        assert layout(plan, weight) == "RR"
    for data in ("x.1", "y.1"):
        assert layout(plan, data) == split
    for forward in ("dot_general.5", "dot_general.6", "sub.3"):  # the batch stays split
        assert layout(plan, forward) == split


@pytest.mark.parametrize("mesh", ["1x4", "2x2"])
def test_gradients_are_all_reduced_over_all_devices(mesh: str) -> None:
    plan = dp_plan(MLP_STEP, mesh)
    axes = tuple(a for a, n in enumerate(parse_mesh(mesh).shape) if n > 1)
    grads = {c.instruction: c for c in plan.collectives if c.instruction in GRADIENT_DOTS}
    assert set(grads) == set(GRADIENT_DOTS)
    for name, c in grads.items():
        assert (c.kind, c.axes, c.nbytes) == ("all-reduce", axes, GRADIENT_DOTS[name])
    # nothing gathers the batch: every collective reduces (gradients and the loss)
    assert {c.kind for c in plan.collectives} == {"all-reduce"}


@pytest.mark.parametrize(
    ("path", "mesh"), [(MLP_STEP, "1x4"), (MLP_STEP, "2x2"), (ROOT / "examples" / "mlp.hlo", "1x8")]
)
def test_o3_is_never_worse_than_data_parallel(path: Path, mesh: str) -> None:
    module = parse_file(path)
    dp = data_parallel_plan(module, parse_mesh(mesh), load_cluster("m8"), solve=TO_THE_END)
    o3 = make_plan(module, PlanRequest(parse_mesh(mesh), load_cluster("m8"), solve=TO_THE_END))
    assert (dp.solver.status.value, o3.solver.status.value) == ("optimal", "optimal")
    assert o3.objective_s <= dp.objective_s * (1 + 1e-9)


def test_a_batch_that_does_not_divide_stays_replicated_with_a_note() -> None:
    plan = dp_plan(MLP_STEP, "1x8")  # batch 4 over 8 devices
    assert layout(plan, "x.1") == layout(plan, "y.1") == "RR"
    notes = [w for w in plan.warnings if "does not divide" in w]
    assert len(notes) == 2 and "%x.1: batch dim 4" in notes[0]


def test_loop_carried_activations_stay_split() -> None:
    plan = dp_plan(ROOT / "examples" / "gpt_scan_tiny.hlo", "1x8")
    assert {c.kind for c in plan.collectives} == {"all-reduce"}
    # the scan's carries: the hidden state f32[8,64,64] split on the batch, the stacked
    # residuals f32[2,8,...] on their batch dim 1, the rest (weights, counters) replicated
    assert plan.carried["while.53#1"] == "RS0"
    assert plan.carried["while.53#2"] == "RS1"
    assert set(plan.carried.values()) == {"RR", "RS0", "RS1"}


FORWARD_ONLY = """HloModule forward, entry_computation_layout={(f32[8,4]{1,0}, f32[4,2]{1,0})->f32[8,2]{1,0}}

ENTRY main {
  x = f32[8,4]{1,0} parameter(0)
  w = f32[4,2]{1,0} parameter(1)
  ROOT y = f32[8,2]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def test_without_state_the_data_inputs_must_be_named() -> None:
    module = parse_module(FORWARD_ONLY)
    mesh = parse_mesh("1x4")
    with pytest.raises(ConfigError, match="no updated state"):
        data_parallel_inputs(module, mesh)
    with pytest.raises(ConfigError, match="are not entry parameters"):
        data_parallel_inputs(module, mesh, ["z"])
    inputs = data_parallel_inputs(module, mesh, ["x"])
    assert inputs.pins == (("x", parse_spec("RS0")), ("w", parse_spec("RR")))
    assert (inputs.data, inputs.state, inputs.split) == (("x",), ("w",), ("x",))


def test_the_plan_runs_and_xla_inserts_the_gradient_all_reduces() -> None:
    module = parse_file(MLP_STEP)
    plan = data_parallel_plan(module, parse_mesh("1x4"), load_cluster("m8"))
    plan = Plan.from_dict(plan.to_dict())  # what `rhino run --plan` reads
    report = run_plan(module, plan, RunOptions(platform="cpu", steps=1, warmup=0, baseline=False))
    assert report.ok, report.verify
    measured = {row.kind: row.measured_bytes for row in report.fidelity.by_kind_axes}
    assert measured.get("all-reduce", 0) >= sum(GRADIENT_DOTS.values())
    assert set(measured) == {"all-reduce"}
