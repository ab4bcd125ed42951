"""Apply a `Plan` to its module: the HLO with the plan's shardings written in."""

from __future__ import annotations

from rhino.hlo.errors import ConfigError
from rhino.hlo.ir import Module
from rhino.hlo.passes import flatten
from rhino.hlo.printer import print_module
from rhino.hlo.sharding import HloSharding, parse_sharding
from rhino.runtime.annotate import annotate
from rhino.runtime.constraints import add_constraints
from rhino.search.plan import Plan, module_hash


def planned_module(module: Module) -> Module:
    """The module as the planner sees it (calls and fusions inlined); plan names refer to this one."""
    return flatten(module)


def plan_shardings(plan: Plan) -> dict[str, HloSharding]:
    """Instruction name -> XLA sharding of its result, for every instruction XLA can take
    one on (not tuple, get-tuple-element or while: XLA drops or rejects those)."""
    out = {}
    for inst in plan.instructions:
        if inst.sharding is None or inst.opcode in ("tuple", "get-tuple-element", "while"):
            continue
        out[inst.name] = parse_sharding(inst.sharding)
    return out


def apply_plan(
    module: Module,
    plan: Plan,
    *,
    check_hash: bool = True,
    strip_metadata: bool = True,
    constraints: bool = True,
) -> Module:
    """`module` (calls and fusions inlined) with every planned sharding set, and, with
    `constraints`, the plan's conversion paths and loop layouts pinned (see
    runtime/constraints.py)."""
    flat = planned_module(module)
    if check_hash and module_hash(print_module(flat)) != plan.module_hash:
        raise ConfigError(
            f"the plan was made for another module (plan for {plan.module!r}, hash {plan.module_hash}; "
            f"this module {flat.name!r} hashes to {module_hash(print_module(flat))})"
        )
    annotated = annotate(flat, plan_shardings(plan), strip_metadata=strip_metadata)
    if constraints:
        annotated, _ = add_constraints(annotated, plan)
    return annotated


def realized_program(module: Module, plan: Plan) -> tuple[Module, tuple[str, ...]]:
    """The program that realizes `plan`, as `rhino run` compiles it and `rhino plan
    --emit-hlo` writes it: `module` (calls and fusions inlined) with the plan's shardings,
    its conversion paths and loop layouts pinned by constraints; and notes on what it
    cannot say (layouts without an HloSharding, conversion layouts no constraint pins)."""
    annotated, unpinned = add_constraints(apply_plan(module, plan, constraints=False), plan)
    return annotated, (*unrealized_layouts(plan), *unpinned)


def unrealized_layouts(plan: Plan) -> list[str]:
    """Where the annotated HLO cannot say what the plan says: result layouts with a
    non-maximal stride (Rhino §4.1) or partial sums have no HloSharding, so XLA picks
    its own layout there (the fidelity report then shows what it did instead)."""
    notes = []
    for inst in plan.instructions:
        if inst.sharding is not None or inst.opcode in ("tuple", "get-tuple-element", "while"):
            continue
        layouts = " ".join(inst.outs)
        reason = (
            "a non-maximal stride"
            if "[s=" in layouts
            else "partial sums"
            if "P" in layouts
            else "no XLA sharding"
        )
        notes.append(
            f"%{inst.name}: layout {layouts} ({reason}) is not written into the HLO; "
            f"XLA chose its own layout there"
        )
    return notes
