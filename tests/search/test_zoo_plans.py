"""What the O3 search finds for zoo models on the paper's 8-GPU platform (issue 3's checks).

Rhino §7.4: "For smaller model like DNABert and UNet, Rhino prefers simple data
parallelism"; and GShard's MoE sharding (the expert dim split, tokens moved by all-to-all)
is one of the strategies Rhino finds. The "small" zoo configs are the paper's shapes scaled
down until they plan in seconds while compute still matters on a V100 (at the "tiny"
configs, collective latencies dominate and little is worth splitting). Each model's HLO is
generated here from scripts/zoo.py (about a second).
"""

from __future__ import annotations

import sys

from rhino.hlo.ir import Module
from rhino.hlo.parser import parse_file, parse_module
from rhino.hlo.passes import inline_calls
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.spmd.plan import Plan
from rhino.search.spmd.planner import PlanRequest, make_plan
from rhino.search.spmd.spec import ShardingSpec, parse_spec
from tests.hlo.corpus import ROOT
from tests.solving import TO_THE_END

sys.path.insert(0, str(ROOT / "scripts"))

import zoo  # noqa: E402

SPLIT_DIM0 = "RS0"  # on the 1x8 mesh: dim 0 split 8 ways
WHOLE = "RR"


def zoo_module(family: str, config: str = "small") -> Module:
    return parse_module(zoo.hlo_text(zoo.model_spec(family, config)), f"{family}_{config}.hlo")


def plan_on_m8(module: Module, pins: tuple[tuple[str, ShardingSpec], ...] = ()) -> Plan:
    request = PlanRequest(parse_mesh("1x8"), load_cluster("m8"), pins=pins, solve=TO_THE_END)
    plan = make_plan(module, request)
    assert plan.solver.status.value == "optimal", plan.solver
    return plan


def data_parallel_violations(module: Module, plan: Plan, batch: int) -> list[str]:
    """Where `plan` is not data-parallel: every compute-heavy dot and convolution (1% of
    the heaviest or more) must read each operand that leads with the batch dim split on
    it, and every other operand (a weight) whole; a result that leads with the batch
    dim must be split on it. Weight gradients (results without a batch dim) may be
    reduce-scattered (ZeRO's sharded optimizer state) or all-reduced."""
    insts = {i.name: i for i in inline_calls(module).instructions()}
    weights = [i for i in insts.values() if i.name.startswith("params_") and i.shape.rank >= 2]
    assert all(w.shape.dims[0] != batch for w in weights), "the batch size must tell"
    dots = [i for i in plan.instructions if i.opcode in ("dot", "convolution")]
    assert dots, "no dot or convolution"
    biggest = max(i.compute_s for i in dots)
    found = []
    for ip in dots:
        if ip.compute_s < 0.01 * biggest:
            continue
        inst = insts[ip.name]
        for op, layout in zip(inst.operands, ip.ins, strict=True):
            want = SPLIT_DIM0 if op.shape.dims[:1] == (batch,) else WHOLE
            if layout != want:
                found.append(f"%{ip.name} ({ip.strategy}) reads %{op.name} {op.shape} as {layout}")
        if inst.shape.dims[:1] == (batch,) and ip.outs[0] != SPLIT_DIM0:
            found.append(f"%{ip.name} ({ip.strategy}) result {inst.shape} is {ip.outs[0]}")
    return found


def test_the_data_parallel_check_rejects_megatron() -> None:
    module = parse_file(ROOT / "tests" / "data" / "mlp_megatron.hlo")  # batch 8, 8192 wide
    found = data_parallel_violations(module, plan_on_m8(module), batch=8)
    assert any("params_0___w__.1 f32[8192,8192]{1,0} as RS1" in v for v in found), found


def test_small_dnabert_comes_out_data_parallel() -> None:
    cfg = zoo.FAMILIES["dnabert"].configs["small"]
    module = zoo_module("dnabert")
    plan = plan_on_m8(module)
    assert data_parallel_violations(module, plan, cfg.batch) == []
    assert plan.compute_s > plan.comm_s  # compute matters at this size


def test_small_unet_comes_out_data_parallel() -> None:
    cfg = zoo.FAMILIES["unet"].configs["small"]
    module = zoo_module("unet")
    plan = plan_on_m8(module)
    assert data_parallel_violations(module, plan, cfg.batch) == []
    assert plan.compute_s > plan.comm_s


def test_small_moe_shards_its_expert_dim() -> None:
    cfg = zoo.FAMILIES["moe"].configs["small"]
    module = zoo_module("moe")
    plan = plan_on_m8(module)
    experts = [i for i in plan.instructions if "___moe____" in i.name and "gate" not in i.name]
    assert {i.name.split("____")[-1] for i in experts} == {"wi__.1", "bi__.1", "wo__.1", "bo__.1"}
    for weight in experts:  # [E, D, F], [E, F], [E, F, D], [E, D]
        if weight.name.endswith("bo__.1") and weight.outs[0] == WHOLE:
            continue  # ZeRO-like (its moments split): the new bias's all-gather is combined
        assert weight.outs[0] == SPLIT_DIM0, (weight.name, weight.outs)
    moments = [w for w in experts if w.name.startswith("adam_")]
    assert len(moments) == 8 and all(w.outs[0] == SPLIT_DIM0 for w in moments)
    split = tuple((w.name, parse_spec(SPLIT_DIM0)) for w in experts)
    assert plan_on_m8(module, split).objective_s >= plan.objective_s
    # the expert FFN (forward, backward, weight gradients) is every dot whose result
    # leads with the expert dim: [E, G, C, F], [E, G, C, D], [E, D, F], [E, F, D]
    # (the gate's gradient [E, D] does not count: it sums over every token)
    insts = {i.name: i for i in inline_calls(module).instructions()}
    expert_dots = [
        i
        for i in plan.instructions
        if i.opcode == "dot"
        and insts[i.name].shape.rank >= 3
        and insts[i.name].shape.dims[0] == cfg.experts
    ]
    assert len(expert_dots) == 6
    for dot in expert_dots:
        assert all(op.shape.dims[0] == cfg.experts for op in insts[dot.name].operands)
        assert dot.outs[0] == SPLIT_DIM0 and set(dot.ins) == {SPLIT_DIM0}, dot.strategy
    assert any(kind.startswith("all-to-all") for kind in plan.comm_by_kind)  # dispatch, combine
    # replicating the experts instead (data parallelism) is predicted slower
    replicated = tuple((w.name, parse_spec(WHOLE)) for w in experts)
    assert plan_on_m8(module, replicated).objective_s > 1.1 * plan.objective_s
