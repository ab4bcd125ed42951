"""The training step split into roles, and the backward and update mirrored onto stages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rhino.hlo.errors import ConfigError, RhinoError
from rhino.hlo.ir import Module
from rhino.hlo.opcode import Opcode
from rhino.hlo.parser import parse_file
from rhino.search.cluster import load_cluster
from rhino.search.pipeline import (
    PLAN_FORMAT,
    PLAN_VERSION,
    PipelinePlan,
    PipelineRequest,
    plan_pipeline,
)
from rhino.search.pipeline.problem import StageProblem
from rhino.search.pipeline.report import ADDED_IN_VERSION_1
from rhino.search.pipeline.split import Role, forward_graph, split_step
from rhino.search.problem import SolveOptions
from tests.hlo.corpus import ROOT

EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def gpt() -> Module:
    return parse_file(EXAMPLES / "gpt_tiny.hlo")


def test_roles_of_a_training_step(gpt: Module) -> None:
    split = split_step(gpt)
    root = gpt.entry.root
    assert root is not None and root.operands[0].name == split.loss
    assert split.role(root.name) is Role.OUTPUT
    # the README's layout: 37 weights, their two Adam moments, the step count, 2 batch inputs
    assert len(split.weights) == 37
    assert split.count(Role.STATE) == 2 * 37 + 1
    # every new weight and moment is computed by the update
    for out in root.operands[1:]:
        assert split.role(out.name) is Role.UPDATE, out.name
    # forward is closed under operands; nothing forward reads a backward or update result
    for k, inst in enumerate(split.order):
        if split.roles[k] is Role.FORWARD:
            assert all(split.role(op.name) is Role.FORWARD for op in inst.operands)


def test_roles_agree_with_the_jvp_names(gpt: Module) -> None:
    # the names are only a hint rhino does not read; JAX names transposed (backward) ops so
    transposed = [i.name for i in split_step(gpt).order if i.name.startswith("transpose_jvp")]
    assert transposed
    split = split_step(gpt)
    assert all(split.role(name) is Role.BACKWARD for name in transposed)


def test_free_instructions_are_computed_from_constants_alone(gpt: Module) -> None:
    split = split_step(gpt)
    for inst in split.order:
        if inst.name in split.free:
            assert inst.opcode is not Opcode.PARAMETER
            assert all(op.name in split.free for op in inst.operands)


def test_a_named_loss_that_does_not_exist_is_refused(gpt: Module) -> None:
    with pytest.raises(Exception, match="no instruction %nope"):
        split_step(gpt, "nope")


def test_forward_graph_lists_consumers_later_in_the_order(gpt: Module) -> None:
    graph = forward_graph(split_step(gpt), {"f32": 1e12})
    assert len(graph.names) > 300
    for i, cs in enumerate(graph.consumers):
        assert all(j > i for j in cs)
    assert sum(graph.compute) > 0


@pytest.fixture(scope="module")
def plan(gpt: Module):
    request = PipelineRequest(4, 0.1, 8, load_cluster("m8"), SolveOptions(time_limit_s=60))
    return plan_pipeline(gpt, request)


def test_every_entry_instruction_has_a_stage_and_role(gpt: Module, plan) -> None:
    names = [i.name for i in plan.instructions]
    assert sorted(names) == sorted(i.name for i in gpt.entry.instructions)
    assert all(0 <= i.stage < 4 for i in plan.instructions)
    assert {i.role for i in plan.instructions} == set(Role)


def test_mirrored_plan_sends_forward_up_and_gradients_down(gpt: Module, plan) -> None:
    info = {i.name: i for i in plan.instructions}
    split = split_step(gpt)
    for inst in gpt.entry.instructions:
        me = info[inst.name]
        for op in inst.operands:
            src = info[op.name]
            if src.free:
                continue
            if me.role is src.role is Role.FORWARD:
                assert me.stage >= src.stage
            if me.role is src.role is Role.BACKWARD:
                assert me.stage <= src.stage, (op.name, inst.name)
            if me.role is Role.UPDATE and op.name in split.weights:
                assert me.stage == src.stage  # the update runs where the weight lives


def test_reported_cut_is_the_forward_stages_evaluated_again(gpt: Module, plan) -> None:
    graph = forward_graph(split_step(gpt), dict(load_cluster("m8").flops))
    problem = StageProblem(graph.names, graph.compute, graph.bytes, graph.consumers, 4, 0.1)
    stage = {i.name: i.stage for i in plan.instructions}
    found = problem.evaluate(tuple(stage[n] for n in graph.names))
    assert found.cut_bytes == plan.cut_bytes
    assert found.imbalance == pytest.approx(plan.imbalance)
    assert plan.imbalance <= 0.1 + 1e-9
    for b in plan.baselines:
        if b.within_balance:
            assert b.cut_bytes is not None and plan.cut_bytes <= b.cut_bytes


def test_stage_reports_add_up(gpt: Module, plan) -> None:
    split = split_step(gpt)
    params = sum(gpt.entry.get(w).shape.byte_size for w in split.weights)
    assert sum(r.parameter_bytes for r in plan.stage_reports) == params
    assert sum(r.optimizer_bytes for r in plan.stage_reports) == 2 * params + 4
    assert sum(r.sent_forward_bytes for r in plan.stage_reports) >= plan.cut_bytes
    first = plan.stage_reports[0].peak_activation_bytes
    assert first["gpipe"] == pytest.approx(2 * first["1f1b"])  # 8 micro-batches held, not 4


def test_plan_json_is_versioned(plan, tmp_path: Path) -> None:
    path = tmp_path / "stages.json"
    plan.write(path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == f"{PLAN_FORMAT}/{PLAN_VERSION}"
    assert len(doc["instructions"]) == len(plan.instructions)
    assert set(doc["schedules"]) == {"1f1b", "gpipe"}


def test_a_stage_plan_file_reads_back_as_the_plan(plan, tmp_path: Path) -> None:
    path = tmp_path / "stages.json"
    plan.write(path)
    read = PipelinePlan.read(path)
    assert read == plan and read.timelines == {}  # the timelines are not in the file
    assert read.text() == plan.text()  # the same keys, values and order
    assert isinstance(read.instructions[0].role, Role) and read.solver == plan.solver


def test_a_stage_plan_of_version_1_from_before_its_later_keys_still_reads(plan) -> None:
    doc = plan.to_json()
    old = {"format": PLAN_FORMAT, "version": 1}
    old |= {k: v for k, v in doc.items() if k not in ("schema", *ADDED_IN_VERSION_1)}
    old["schedules"] = {
        name: {k: v for k, v in s.items() if k not in ADDED_IN_VERSION_1}
        for name, s in doc["schedules"].items()
    }
    read = PipelinePlan.from_json(old)
    assert read.mesh is None and read.loss == "" and math.isnan(read.forward_share)
    for name, schedule in read.schedules.items():
        assert schedule == plan.schedules[name]  # its simulated bubble is 1 - busy
    assert read.instructions == plan.instructions and read.stage_reports == plan.stage_reports


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda doc: {"schema": "rhino.plan/1"}, "is not a stage plan"),
        (
            lambda doc: {**doc, "schema": "rhino.pipeline/2"},
            "has version 2; this rhino reads version 1",
        ),
        (lambda doc: {**doc, "stage_reports": [{}]}, "is malformed: KeyError 'stage'"),
        (lambda doc: {**doc, "instructions": [{**doc["instructions"][0], "role": "x"}]}, "'x'"),
    ],
)
def test_what_is_not_a_stage_plan_of_this_version_is_refused(plan, change, message) -> None:
    with pytest.raises(ConfigError, match="stages.json") as caught:
        PipelinePlan.from_json(change(plan.to_json()), "stages.json")
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("file", "stages", "epsilon"),
    [("unet_tiny.hlo", 4, 0.2), ("moe_tiny.hlo", 2, 0.1), ("dnabert_tiny.hlo", 2, 0.1)],
)
def test_zoo_plans_keep_the_flow_and_beat_every_balanced_baseline(
    file: str, stages: int, epsilon: float
) -> None:
    module = parse_file(EXAMPLES / file)
    request = PipelineRequest(stages, epsilon, 4, load_cluster("m8"), SolveOptions(time_limit_s=60))
    plan = plan_pipeline(module, request)
    info = {i.name: i for i in plan.instructions}
    for inst in module.entry.instructions:
        for op in inst.operands:
            src, me = info[op.name], info[inst.name]
            if not src.free and src.role is me.role is Role.FORWARD:
                assert me.stage >= src.stage
            if not src.free and src.role is me.role is Role.BACKWARD:
                assert me.stage <= src.stage
    assert plan.imbalance <= epsilon + 1e-9
    for b in plan.baselines:
        if b.within_balance:
            assert b.cut_bytes is not None and plan.cut_bytes <= b.cut_bytes


def test_residual_unet_plan_cuts_less_than_either_topological_split() -> None:
    """DDPM's UNet (residual blocks with 1x1 shortcuts beside them, a time embedding beside
    the image path) is not a line: a stage may hold a shortcut conv before the block it
    sits beside. Neither DP over one order (program, as late as possible) can; the ILP
    does, and proves its plan optimal."""
    from tests.search.test_zoo_plans import zoo_module

    module = zoo_module("unet", "ddpm")
    request = PipelineRequest(4, 0.1, 4, load_cluster("m8"), SolveOptions(time_limit_s=60))
    plan = plan_pipeline(module, request)
    assert plan.status == "optimal"
    splits = {b.name: b for b in plan.baselines}
    for name in ("best_split", "best_split_late"):
        cut = splits[name].cut_bytes
        assert splits[name].within_balance and cut is not None
        assert plan.cut_bytes < 0.8 * cut, (name, splits[name])


# -- the loss of real training steps --------------------------------------------------------

CORPUS = ROOT / "tests" / "data" / "corpus"


def test_the_loss_is_what_the_gradients_differentiate_not_the_learning_rate() -> None:
    # HF's step returns {"loss", "learning_rate"}; the schedule is a select in a call
    module = parse_file(CORPUS / "hf_gpt2.hlo.gz")
    split = split_step(module)
    root = module.entry.root
    assert root is not None
    scalars = [op.name for op in root.operands if op.shape.rank == 0 and op.shape.dtype == "f32"]
    assert split.loss in scalars and len(scalars) == 2
    assert 0.3 <= split.forward_share <= 0.4
    rate = next(name for name in scalars if name != split.loss)
    with pytest.raises(RhinoError, match="cannot be the loss: its forward holds 0.0%"):
        split_step(module, rate)


def test_a_metric_accumulator_or_a_gradient_norm_is_not_the_loss() -> None:
    # Keras returns its loss tracker's total / count; Equinox's step the gradient norm too
    for name in ("keras_gpt2", "eqx_transformer"):
        module = parse_file(CORPUS / f"{name}.hlo.gz")
        split = split_step(module)
        assert 0.3 <= split.forward_share <= 0.4, name
        forward = {
            i.name for i, r in zip(split.order, split.roles, strict=True) if r is Role.FORWARD
        }
        params = [p for p in module.entry.parameters if p.name in forward]
        assert all(p.shape.rank > 0 for p in params), name  # no metric total, no step count


TWO_OBJECTIVES = """HloModule two

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  x = f32[8,4]{1,0} parameter(0)
  w1 = f32[4,4]{1,0} parameter(1)
  w2 = f32[4,4]{1,0} parameter(2)
  y1 = f32[8,4]{1,0} dot(x, w1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  y2 = f32[8,4]{1,0} dot(x, w2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  zero = f32[] constant(0)
  l1 = f32[] reduce(y1, zero), dimensions={0,1}, to_apply=add
  l2 = f32[] reduce(y2, zero), dimensions={0,1}, to_apply=add
  one = f32[] constant(1)
  ones = f32[8,4]{1,0} broadcast(one), dimensions={}
  g1 = f32[4,4]{1,0} dot(x, ones), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  g2 = f32[4,4]{1,0} dot(x, ones), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  n1 = f32[4,4]{1,0} subtract(w1, g1)
  n2 = f32[4,4]{1,0} subtract(w2, g2)
  ROOT t = (f32[], f32[], f32[4,4]{1,0}, f32[4,4]{1,0}) tuple(l1, l2, n1, n2)
}
"""


def test_two_objectives_are_refused_with_the_candidates() -> None:
    from rhino.hlo.parser import parse_module

    module = parse_module(TWO_OBJECTIVES, "<two>")
    with pytest.raises(
        RhinoError,
        match=r"2 scalars are equally likely \(%l[12], %l[12]\); "
        "name it with `loss`",
    ):
        split_step(module)
    assert split_step(module, "l2").loss == "l2"
