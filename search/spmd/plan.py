"""A plan: how every instruction is sharded, and what rhino predicts it costs.

Plain data, versioned JSON on disk (`rhino plan --out`), consumed by `rhino run`. The
`module_hash` ties a plan to the HLO it was made for; `mesh` to the mesh.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rhino.hlo.errors import ConfigError
from rhino.hlo.jsonable import jsonable
from rhino.search.mesh import DeviceMesh
from rhino.search.problem import BudgetStats, Sizes, SolveStatus

LEVELS = ("O2", "O3")
"""The search levels (`--opt`): O2 subgraph merging, O3 the whole-graph ILP."""

_DIMS = re.compile(r"\[([\d,]*)\]")
"""The dimension lists in a shape's text (`f32[8,64]{1,0}` -> "8,64")."""

PLAN_VERSION = 1


@dataclass(frozen=True)
class PlannedCollective:
    """A collective the plan predicts XLA will run."""

    kind: str
    axes: tuple[int, ...]
    nbytes: float
    """Per device per execution (full-side convention of rhino.search.spmd.comm)."""
    seconds: float
    instruction: str
    """The instruction it belongs to (the consumer, for a reshard on an edge)."""
    count: float = 1.0
    """Executions per step (trip count inside loops)."""
    note: str = ""
    group: int = -1
    """Collectives with the same group (>= 0) are combined by XLA into one op (or a few,
    `rhino.search.spmd.comm.combined_ops`): the group's first member carries their latency,
    the others only their bandwidth time."""


@dataclass(frozen=True)
class InstructionPlan:
    name: str
    opcode: str
    shape: str
    strategy: str
    """The strategy's notation, `S0R = S0R x RR`."""
    outs: tuple[str, ...]
    """Result layout per leaf, in rhino's notation."""
    ins: tuple[str | None, ...]
    """Layout each operand is read in."""
    sharding: str | None
    """XLA HloSharding text of the result; None where XLA cannot express it (strides)."""
    compute_s: float
    weight: float = 1.0


@dataclass(frozen=True)
class PlannedReshard:
    """A layout conversion on an edge of the plan, and the layouts it passes through.

    `rhino run` writes each layout of `path` into the HLO as a sharding constraint, so
    that XLA converts the tensor the way the plan priced it (see runtime/spmd/apply.py).
    """

    consumer: str
    """Instruction reading the tensor, or `<while>#<leaf>` for a loop-carried value, or
    the parameter an updated piece of state returns into."""
    where: str
    """"operand" (operand `operand` of `consumer`), "init" (the loop's initial value),
    "loop" (the body's result), or "state" (entry output leaf `operand`)."""
    operand: int
    producer: str
    leaf: int
    """Result leaf of `producer`."""
    path: tuple[str, ...]
    """Layout after each step that communicates, ending with the one `consumer` wants."""


@dataclass(frozen=True)
class CombinedSearch:
    """The search over the collectives XLA combines (`rhino.search.spmd.combine`)."""

    plans: int
    """Plans made, the first included."""
    closed: tuple[str, ...]
    """The keys (`<kind> axis <a,b>`) whose collectives the plan's problem charged whole."""
    bound_s: float
    """A lower bound on every plan's `objective_s`."""


@dataclass(frozen=True)
class SolverReport:
    """What the search reports of the plan it found (`Plan.solver`)."""

    status: SolveStatus
    objective_s: float
    """The solver's objective: the plan's cost as the problem charges it."""
    bound_s: float
    gap: float
    time_s: float
    variables: int
    constraints: int
    budget_search: BudgetStats | None = None
    """How O2 met the memory budget; None where it did not search for it."""
    merge_level: int | None = None
    """O2: 1 cones only, 2 one ILP over the merged graph, 3 segments; O3: 0."""
    sizes: Sizes | None = None
    """The sizes of the coarsened graphs."""
    phases_s: dict[str, float] | None = None
    """Seconds per phase, in the order they ran."""
    combined: CombinedSearch | None = None

    def to_json(self) -> dict[str, Any]:
        """The plan file's "solver" object: the fields set (counts of the budget search
        as numbers like the others)."""
        out: dict[str, Any] = {
            "status": self.status.value,
            "objective_s": self.objective_s,
            "bound_s": self.bound_s,
            "gap": self.gap,
            "time_s": self.time_s,
            "variables": self.variables,
            "constraints": self.constraints,
        }
        found = self.budget_search
        if found is not None:
            out["budget_search"] = {
                "free_peak": found.free_peak,
                "solves": float(found.solves),
                **({"lambda": found.lam} if found.lam is not None else {}),
                **({"fallback": float(found.fallback)} if found.fallback is not None else {}),
            }
        if self.merge_level is not None:
            out["merge_level"] = self.merge_level
        if self.sizes is not None:
            out["sizes"] = self.sizes.measured()
        if self.phases_s is not None:
            out["phases_s"] = self.phases_s
        if self.combined is not None:
            out["combined"] = self.combined
        return dict(jsonable(out))

    @staticmethod
    def from_json(doc: dict[str, Any]) -> SolverReport:
        """The inverse of `to_json`."""
        found = doc.get("budget_search")
        combined = doc.get("combined")
        return SolverReport(
            status=SolveStatus(doc["status"]),
            objective_s=doc["objective_s"],
            bound_s=doc["bound_s"],
            gap=doc["gap"],
            time_s=doc["time_s"],
            variables=doc["variables"],
            constraints=doc["constraints"],
            budget_search=None
            if found is None
            else BudgetStats(
                free_peak=found["free_peak"],
                solves=int(found["solves"]),
                lam=found.get("lambda"),
                fallback=None if found.get("fallback") is None else bool(found["fallback"]),
            ),
            merge_level=doc.get("merge_level"),
            sizes=None if doc.get("sizes") is None else Sizes(**doc["sizes"]),
            phases_s=doc.get("phases_s"),
            combined=None
            if combined is None
            else CombinedSearch(combined["plans"], tuple(combined["closed"]), combined["bound_s"]),
        )


@dataclass(frozen=True)
class Plan:
    module: str
    module_hash: str
    mesh: DeviceMesh
    """On disk: its axis sizes, `[2, 4]`."""
    cluster: str
    level: str
    objective_s: float
    """Predicted step time: compute plus communication (no overlap assumed). Readers
    that want the same conversion of one value share it here, as in XLA; the solver's
    objective (`solver.objective_s`) charges each reader, so it can be higher."""
    compute_s: float
    comm_s: float
    comm_by_kind: dict[str, float]
    """Seconds per `<kind> axis <a,b>`."""
    peak_memory_bytes: float
    budget_bytes: float | None
    solver: SolverReport
    search_time_s: float
    instructions: tuple[InstructionPlan, ...]
    collectives: tuple[PlannedCollective, ...]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    """What is worth knowing but is no problem (e.g. how updated state was paired)."""
    state: int = 0
    """How many parameters are state the step returns updated (kept in one layout)."""
    version: int = PLAN_VERSION
    problem: dict[str, int] = field(default_factory=dict)
    """Problem size: nodes, edges, strategy pairs."""
    carried: dict[str, str] = field(default_factory=dict)
    """`<while>#<leaf>` -> layout of that loop-carried value."""
    reshards: tuple[PlannedReshard, ...] = ()
    combined_latency_s: float = 0.0
    """Latency of the combined collectives' ops (see `PlannedCollective.group`), in
    `comm_s` and `objective_s` but not in the solver's objective, which leaves the
    latency of collectives XLA combines out."""

    def instruction(self, name: str) -> InstructionPlan | None:
        return next((i for i in self.instructions if i.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": f"rhino.plan/{self.version}", **jsonable(self)}

    def text(self) -> str:
        """The plan file's text (what `write` writes)."""
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.text(), encoding="utf-8")

    @staticmethod
    def from_dict(doc: dict[str, Any], source: str = "<plan>") -> Plan:
        if doc.get("schema") != f"rhino.plan/{PLAN_VERSION}":
            raise ConfigError(
                f"{source}: not a rhino plan of version {PLAN_VERSION} "
                f"(schema {doc.get('schema')!r})"
            )
        if doc.get("version", PLAN_VERSION) != PLAN_VERSION:
            raise ConfigError(
                f"{source}: plan version {doc.get('version')!r}; this rhino reads "
                f"version {PLAN_VERSION}"
            )
        try:
            fields = {k: v for k, v in doc.items() if k != "schema"}
            fields["mesh"] = DeviceMesh.from_json(fields["mesh"])
            fields["solver"] = SolverReport.from_json(fields["solver"])
            fields["instructions"] = tuple(
                InstructionPlan(**{**i, "outs": tuple(i["outs"]), "ins": tuple(i["ins"])})
                for i in fields["instructions"]
            )
            fields["collectives"] = tuple(
                PlannedCollective(**{**c, "axes": tuple(c["axes"])}) for c in fields["collectives"]
            )
            fields["warnings"] = tuple(fields.get("warnings", ()))
            fields["notes"] = tuple(fields.get("notes", ()))
            fields["reshards"] = tuple(
                PlannedReshard(**{**r, "path": tuple(r["path"])})
                for r in fields.get("reshards", ())
            )
            return Plan(**fields)
        except (KeyError, TypeError, ValueError, ConfigError) as e:
            raise ConfigError(f"{source}: malformed plan: {e}") from None

    @staticmethod
    def read(path: str | Path) -> Plan:
        try:
            doc = json.loads(Path(path).read_text())
        except OSError as e:
            raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
        return Plan.from_dict(doc, str(path))


def module_hash(text: str) -> str:
    """Fingerprint of a module's printed text (what a plan is valid for)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class MeshUse:
    """How much of the mesh a plan puts to work."""

    share: float
    """Useful share of the devices' compute: the compute of the single-device program
    spread evenly over every device, over the plan's per-device compute (1.0: every
    instruction split over the whole mesh; 1/n: everything replicated on n devices)."""
    idle_axes: tuple[int, ...]
    """Mesh axes of more than one device along which no instruction is split: the
    devices along them repeat each other's work."""
    undividable_axes: tuple[int, ...]
    """Those of `idle_axes` whose size divides no dimension of any tensor."""


def mesh_use(plan: Plan) -> MeshUse:
    """Which mesh axes the plan splits work along, and the useful share of the compute.

    Instructions repeat a few layouts and shapes: each distinct layout text is parsed
    once, each distinct combination of an instruction's layouts weighed once, and each
    distinct shape read once."""
    from rhino.search.spmd.spec import parse_spec
    from rhino.search.spmd.strategy import dividing_axes, work_fraction

    mesh = plan.mesh
    parse = functools.cache(functools.partial(parse_spec, mesh_ndim=mesh.ndim))
    fraction: dict[tuple[tuple[str, ...], tuple[str | None, ...]], float] = {}
    shapes: set[str] = set()
    used: set[int] = set()
    ideal = actual = 0.0
    for inst in plan.instructions:
        share = fraction.get((inst.outs, inst.ins))
        if share is None:
            specs = [parse(text) for text in (*inst.outs, *inst.ins) if text is not None]
            used |= dividing_axes(specs)
            share = fraction[(inst.outs, inst.ins)] = work_fraction(specs, mesh)
        cost = inst.compute_s * inst.weight
        ideal += cost / (share * mesh.size)
        actual += cost
        shapes.add(inst.shape)
    sizes = {int(d) for s in shapes for dims in _DIMS.findall(s) for d in dims.split(",") if d}
    idle = tuple(a for a, size in enumerate(mesh.shape) if size > 1 and a not in used)
    undividable = tuple(a for a in idle if not any(d % mesh.shape[a] == 0 for d in sizes if d > 1))
    return MeshUse(ideal / actual if actual > 0 else 1.0, idle, undividable)


def mesh_use_warnings(plan: Plan) -> tuple[str, ...]:
    """What to tell the user when part of the mesh does no useful work."""
    use = mesh_use(plan)
    if not use.idle_axes:
        return ()
    shape = str(plan.mesh)

    def named(axes: tuple[int, ...]) -> str:
        return " and ".join(f"axis {a} ({plan.mesh.shape[a]} devices)" for a in axes)

    them = "them" if len(use.idle_axes) > 1 else "it"
    if use.undividable_axes == use.idle_axes:
        sizes = sorted({plan.mesh.shape[a] for a in use.idle_axes})
        why = (
            f": no dimension of any tensor divides by {' or '.join(map(str, sizes))} "
            "(choose mesh sizes that divide the batch or model dimensions)"
        )
    else:
        why = (
            ": splitting does not pay on this cluster (the communication would cost more "
            "than the compute it saves)"
        )
    return (
        f"mesh {shape}: nothing is split along {named(use.idle_axes)}{why}; the devices "
        f"along {them} repeat each other's work: {use.share:.0%} of the devices' compute is "
        "useful work",
    )
