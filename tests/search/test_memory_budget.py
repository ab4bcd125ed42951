"""Rhino §4.4 on a model with one big weight: a memory budget below the replicated
footprint gets only the largest parameters sharded, and the plan's peak fits it."""

from __future__ import annotations

import pytest

from rhino.hlo.parser import parse_file
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.spmd.plan import Plan
from rhino.search.spmd.planner import PlanRequest, make_plan
from tests.hlo.corpus import ROOT

# a 2-layer MLP (w0 [64, 64], w1 [64, 1024]) at batch 8: on 8 V100s every collective costs
# more than the compute it would save, so the unconstrained plan replicates everything
WIDE = ROOT / "tests" / "data" / "mlp_wide_out.hlo"
BUDGET = 1.5e6  # bytes: below the replicated peak (2.8 MB), above the smallest (0.33 MiB)
MODES = ("exact", "largest")


def entry_parameters() -> dict[str, int]:
    """Name -> bytes of every parameter of the step (weights, Adam state, batch)."""
    entry = parse_file(WIDE).entry
    return {i.name: i.shape.byte_size for i in entry if i.opcode_text == "parameter"}


def plan_with(budget: float | None, mode: str = "exact") -> Plan:
    request = PlanRequest(
        parse_mesh("1x8"), load_cluster("m8"), budget_bytes=budget, memory_mode=mode
    )
    return make_plan(parse_file(WIDE), request)


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    return {"free": plan_with(None)} | {mode: plan_with(BUDGET, mode) for mode in MODES}


def sharded(plan: Plan) -> set[str]:
    """The step's parameters that the plan does not replicate."""
    layouts = {i.name: i.outs[0] for i in plan.instructions}
    return {name for name in entry_parameters() if layouts[name] != "RR"}


def test_without_a_budget_everything_is_replicated(plans: dict[str, Plan]) -> None:
    free = plans["free"]
    assert sharded(free) == set() and free.comm_s == 0
    assert free.peak_memory_bytes > BUDGET  # so the budget binds


@pytest.mark.parametrize("mode", MODES)
def test_a_binding_budget_shards_only_the_largest_parameters(
    plans: dict[str, Plan], mode: str
) -> None:
    plan = plans[mode]
    assert plan.peak_memory_bytes <= BUDGET
    sizes = entry_parameters()
    by_size = sorted(sizes, key=lambda name: (-sizes[name], name))  # §4.4's order
    split = sharded(plan)
    # ZeRO-like: the weights stay whole for the forward and backward; the largest Adam
    # moments, w1's, are split (the update runs on slices, the new w1 is all-gathered)
    assert set(by_size[:2]) == {"adam_m_1___w__.1", "adam_v_1___w__.1"} <= split
    # ... and the other moments may follow at no latency: XLA combines their updates'
    # all-gathers with w1's into one op
    assert all(name.startswith("adam_") for name in split), sorted(split)
    assert {c.kind for c in plan.collectives} == {"all-gather"}
    assert {c.group for c in plan.collectives} == {0}
    assert plan.objective_s >= plans["free"].objective_s


def test_the_exact_mode_is_no_slower_than_the_heuristic(plans: dict[str, Plan]) -> None:
    assert plans["exact"].objective_s <= plans["largest"].objective_s * (1 + 1e-9)
