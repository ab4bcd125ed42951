"""Which way to run a step on N devices (Rhino §3): pure SPMD, a pure pipeline, or a
hybrid (stages on one mesh axis, SPMD in each), by estimated step time.

    compare_layouts(module, devices, request) -> Comparison

Every estimate comes from the same cost model (the SPMD planner's, on the request's
cluster), so they compare:
    SPMD d1 x d2   the planner's predicted step time of its best plan on that mesh
                   (every 1-D and 2-D mesh of N devices)
    p stages of k  (p * k = N, p >= 2; k = 1 is a pure pipeline) the stage plan for p
                   stages (`rhino pipeline`; the balance tolerance raised by 0.1 until
                   a plan exists), cut into its programs for m micro-batches; each
                   program planned on k devices, its predicted time the task time; the
                   sends between stages at the cluster's links (stage s on the s-th
                   block of k devices); the 1F1B step simulated
                   (`rhino.search.pipeline.schedule`) on those task times.
The comparison keeps the lowest estimate. A candidate that cannot be planned (a
balance no plan meets, a step that cannot be cut into m micro-batches) is listed with
the reason and left out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rhino.hlo.errors import InfeasibleError, RhinoError
from rhino.hlo.ir import Module
from rhino.hlo.parser import parse_module
from rhino.runtime.pipeline.programs import StagePlan, StagePrograms, is_update, stage_programs
from rhino.runtime.pipeline.tasks import task_graph
from rhino.search.cluster import Cluster
from rhino.search.mesh import DeviceMesh, mesh_factorizations
from rhino.search.pipeline import PipelineRequest, plan_pipeline
from rhino.search.pipeline.schedule import StageTimes, simulate
from rhino.search.spmd.planner import PlanRequest, make_plan

MAX_EPSILON = 2.0
"""The loosest balance tried for a stage plan."""


@dataclass(frozen=True)
class Candidate:
    kind: str
    """"spmd", "pipeline" (one device a stage) or "hybrid"."""
    mesh: DeviceMesh
    """SPMD: the mesh; pipeline and hybrid: stages x devices a stage."""
    step_s: float | None
    """Estimated step time; None when it could not be planned."""
    note: str
    """How it was estimated, or why it could not be."""
    stage_plan: StagePlan | None = field(default=None, repr=False, compare=False)
    """The stage plan a pipeline or hybrid estimate is for."""

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "mesh": self.mesh.to_json(),
            "step_s": self.step_s,
            "note": self.note,
        }


@dataclass(frozen=True)
class Comparison:
    devices: int
    microbatches: int
    candidates: tuple[Candidate, ...]

    @property
    def best(self) -> Candidate | None:
        planned = [c for c in self.candidates if c.step_s is not None]
        return min(planned, key=lambda c: c.step_s or 0.0, default=None)


def compare_layouts(
    module: Module,
    devices: int,
    request: PlanRequest,
    *,
    microbatches: int = 8,
    epsilon: float | None = None,
) -> Comparison:
    """Estimate every layout of `devices` devices (module docstring); `request` gives the
    cluster, level and solver options (its mesh is replaced)."""
    out = [
        _spmd(module, dataclasses.replace(request, mesh=m)) for m in mesh_factorizations(devices)
    ]
    for stages in range(2, devices + 1):
        if devices % stages == 0:
            out.append(_staged(module, stages, devices // stages, request, microbatches, epsilon))
    return Comparison(devices, microbatches, tuple(out))


def _spmd(module: Module, request: PlanRequest) -> Candidate:
    mesh = request.mesh
    try:
        plan = make_plan(module, request)
    except RhinoError as exc:
        return Candidate("spmd", mesh, None, str(exc))
    return Candidate("spmd", mesh, plan.objective_s, f"{request.level} plan on {mesh}")


def _staged(
    module: Module, stages: int, size: int, request: PlanRequest, m: int, epsilon: float | None
) -> Candidate:
    kind = "pipeline" if size == 1 else "hybrid"
    layout = DeviceMesh((stages, size))
    try:
        plan, eps = _stage_plan(module, stages, m, request, epsilon)
        programs = stage_programs(module, plan, m)
        times = _program_times(programs, dataclasses.replace(request, mesh=DeviceMesh((size,))))
        step = simulate("1f1b", _stage_times(programs, times, request.cluster, size), m).step_s
    except RhinoError as exc:
        return Candidate(kind, layout, None, str(exc))
    note = (
        f"{stages} stages (epsilon {eps:g}), each program planned on {size} device(s), "
        f"1F1B over {m} micro-batches simulated"
    )
    return Candidate(kind, layout, step, note, plan)


def _stage_plan(
    module: Module, stages: int, m: int, request: PlanRequest, epsilon: float | None
) -> tuple[StagePlan, float]:
    """The stage plan at the tightest balance from `epsilon` up (steps of 0.1) with one
    (None: the pipeline search's own default and widening)."""
    if epsilon is None:
        plan = plan_pipeline(
            module, PipelineRequest(stages, None, m, request.cluster, request.solve)
        )
        return StagePlan.of(plan), plan.epsilon
    while True:
        wanted = PipelineRequest(stages, epsilon, m, request.cluster, request.solve)
        try:
            return StagePlan.of(plan_pipeline(module, wanted)), epsilon
        except InfeasibleError:
            if epsilon >= MAX_EPSILON:
                raise
            epsilon = round(epsilon + 0.1, 2)


def _program_times(programs: StagePrograms, request: PlanRequest) -> dict[tuple[int, str], float]:
    """(stage, kind) -> the predicted time of one run of that program."""
    return {
        key: make_plan(parse_module(p.text, f"<stage {key[0]} {key[1]}>"), request).objective_s
        for key, p in programs.programs.items()
    }


def _stage_times(
    programs: StagePrograms, times: dict[tuple[int, str], float], cluster: Cluster, size: int
) -> StageTimes:
    """The simulator's view: task times, and one micro-batch's sends between stages at the
    link between their devices (stage s on devices s*size .. (s+1)*size - 1)."""
    graph = task_graph(programs)
    m, p = programs.microbatches, programs.stages
    sent: dict[tuple[int, int], float] = {}
    for t in graph.transfers_between_stages():
        sent[(t.source, t.target)] = sent.get((t.source, t.target), 0.0) + t.nbytes
    send_s = {}
    for (a, b), nbytes in sent.items():
        same_node = a * size // cluster.devices_per_node == b * size // cluster.devices_per_node
        link = cluster.intra_node if same_node else cluster.inter_node
        send_s[(a, b)] = nbytes / m / link.bandwidth + link.latency
    return StageTimes(
        forward_s=tuple(times.get((s, "F"), 0.0) for s in range(p)),
        backward_s=tuple(times.get((s, "B"), 0.0) for s in range(p)),
        update_s=tuple(
            sum(t for (stage, kind), t in times.items() if stage == s and is_update(kind))
            for s in range(p)
        ),
        send_s=send_s,
        activation_bytes=tuple(float(b) for b in graph.activation_bytes),
    )
