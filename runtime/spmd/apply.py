"""Apply a `Plan` to its module: the HLO with the plan's shardings written in."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rhino.hlo.errors import ConfigError, RhinoError
from rhino.hlo.ir import Module
from rhino.hlo.passes import flatten
from rhino.hlo.printer import print_module
from rhino.hlo.sharding import HloSharding, parse_sharding
from rhino.runtime.spmd.annotate import annotate
from rhino.runtime.spmd.constraints import add_constraints
from rhino.search.mesh import DeviceMesh
from rhino.search.spmd.plan import Plan, module_hash

if TYPE_CHECKING:
    from rhino.runtime.xla_bridge import DroppedSharding, ShardyModule


def planned_module(module: Module) -> Module:
    """The module as the planner sees it (calls and fusions inlined); plan names refer to
    this one."""
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
    runtime/spmd/constraints.py)."""
    flat = planned_module(module)
    if check_hash and module_hash(print_module(flat)) != plan.module_hash:
        raise ConfigError(
            f"the plan was made for another module (plan for {plan.module!r}, "
            f"hash {plan.module_hash}; "
            f"this module {flat.name!r} hashes to {module_hash(print_module(flat))})"
        )
    if check_hash:
        check_coverage(plan, flat)
    annotated = annotate(flat, plan_shardings(plan), strip_metadata=strip_metadata)
    if constraints:
        annotated, _ = add_constraints(annotated, plan)
    return annotated


UNPLANNED = frozenset({"tuple", "get-tuple-element", "while"})
"""Entry opcodes a plan has no entry for (they pass their operands' layouts on)."""


def check_coverage(plan: Plan, flat: Module) -> None:
    """A plan must speak of every instruction the planner plans and of nothing else, in
    layouts of its mesh's rank: a hand-edited or truncated plan is refused (ConfigError)."""
    from rhino.search.spmd.spec import parse_spec

    known = {inst.name for comp in flat.computations for inst in comp.instructions}
    planned = {inst.name for inst in plan.instructions}
    unknown = sorted(planned - known)
    if unknown:
        raise ConfigError(
            f"the plan names instructions {flat.name} does not have: "
            f"%{', %'.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}"
        )
    missing = [
        inst.name
        for inst in flat.entry.instructions
        if inst.name not in planned and inst.opcode_text not in UNPLANNED
    ]
    if missing:
        raise ConfigError(
            f"the plan covers {len(planned)} instructions but not {len(missing)} of "
            f"{flat.name}'s (%{', %'.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): "
            "a plan from `rhino plan --out` covers them all"
        )
    for inst in plan.instructions:
        for text in (*inst.outs, *(i for i in inst.ins if i is not None)):
            try:
                parse_spec(text, plan.mesh.ndim)
            except RhinoError as e:
                raise ConfigError(f"the plan's layout of %{inst.name}: {e}") from None


def realized_program(module: Module, plan: Plan) -> tuple[Module, tuple[str, ...]]:
    """The program that realizes `plan`, as `rhino run` compiles it and `rhino plan
    --emit-hlo` writes it: `module` (calls and fusions inlined) with the plan's shardings,
    its conversion paths and loop layouts pinned by constraints; and notes on what it
    cannot say (layouts without an HloSharding, conversion layouts no constraint pins)."""
    annotated, unpinned = add_constraints(apply_plan(module, plan, constraints=False), plan)
    return annotated, (*unrealized_layouts(plan), *unpinned)


def realized_stablehlo(module: Module, plan: Plan) -> tuple[str, tuple[str, ...]]:
    """The program that realizes `plan` for Shardy, as `rhino plan --emit-stablehlo`
    writes it and `rhino run` compiles it by default: `realized_program`'s module as
    StableHLO with the plan's mesh, shardings and constraints in the sdy dialect
    (runtime/spmd/shardy.py); and the notes on what it cannot say (the layouts the
    annotated HLO cannot say, and any sharding with no Shardy form)."""
    annotated, notes = realized_program(module, plan)
    converted = shardy_program(annotated, plan.mesh)
    return converted.text, (*notes, *dropped_notes(converted.dropped))


def shardy_program(annotated: Module, mesh: DeviceMesh) -> ShardyModule:
    """An annotated module (`realized_program`'s) as StableHLO with Shardy shardings on
    `mesh` (`xla_bridge.hlo_to_shardy`; what each sharding becomes: runtime/spmd/shardy.py)."""
    from rhino.runtime import xla_bridge as xb
    from rhino.runtime.spmd.shardy import MESH_NAME, Translator, mesh_axes

    return xb.hlo_to_shardy(
        print_module(annotated), mesh_axes(mesh), Translator(mesh), mesh_name=MESH_NAME
    )


def dropped_notes(dropped: tuple[DroppedSharding, ...]) -> list[str]:
    """A note per sharding the Shardy module leaves out."""
    return [
        f"{d.where}: sharding {d.sharding} is not written into the Shardy module "
        f"({d.reason}); Shardy chooses its own layout there"
        for d in dropped
    ]


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
