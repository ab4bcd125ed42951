"""`rhino pipeline`: a training step split into pipeline stages, as a versioned plan.

    split_step        forward / backward / update / state / output roles (stages.py)
    forward_graph     the forward instructions, compute in seconds, result bytes
    StageProblem      the stage problem with its balance rows (problem.py)
    baselines         consecutive ranges of the order: equal counts, and the DP's best
    solve_stages      the ILP (ilp.py) over the exact reduction (reduce.py),
                      started from the best balanced baseline, the better one kept
    mirror            every other instruction gets a stage from the forward plan
    report            per stage compute, memory, sends; 1F1B and GPipe simulated

Mirroring (stage of a non-forward instruction, in topological order):
    backward  the latest stage holding one of its forward operands (the operand's own
              stage or a stage that received it), but no later than any backward operand's
              stage: gradients only flow to earlier stages
    update    one that reads a weight: the weight's stage (the new weight is made where
              the weight lives); then, latest first, the earliest stage of its update
              readers (the moments follow their weight); else the stage of its largest
              placed operand (ties: the earliest stage)
    free      wherever its earliest reader is (every reader recomputes it); so do state
              parameters and anything still unplaced
    output    the loss's stage
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rhino.hlo.errors import ConfigError, InfeasibleError
from rhino.hlo.ir import Module
from rhino.search.cluster import Cluster, Link
from rhino.search.mesh import DeviceMesh
from rhino.search.pipeline.baselines import Baseline, best_split, best_split_late, equal_count
from rhino.search.pipeline.problem import StageProblem
from rhino.search.pipeline.report import (
    BaselineReport,
    InstructionStage,
    ScheduleReport,
    StageReport,
)
from rhino.search.pipeline.schedule import StageTimes, Timeline, simulate
from rhino.search.pipeline.split import (
    Role,
    StepSplit,
    forward_graph,
    mirror,
    split_step,
    state_scalars,
)
from rhino.search.pipeline.stats import StageAssignment, StageSolveStats
from rhino.search.problem import SolveOptions

PLAN_FORMAT = "rhino.pipeline"
PLAN_VERSION = 1

EPSILON = 0.1
"""The balance a plan is asked for unless the request names one."""
EPSILON_STEP = 0.1
"""How far an unnamed balance widens after a try without a plan."""


@dataclass(frozen=True)
class PipelineRequest:
    stages: int
    epsilon: float | None = EPSILON
    """The balance: every stage within (1 +- epsilon) of the average forward compute.
    None: `EPSILON`, or where no plan meets it the least wider one that has a plan
    (`epsilons`)."""
    microbatches: int = 8
    cluster: Cluster | None = None
    """Device rates and links; required."""
    options: SolveOptions = field(default_factory=SolveOptions)
    tightening: bool = True
    loss: str | None = None
    """Name of the loss instruction (found from the graph when None)."""
    mesh: DeviceMesh | None = None
    """Hybrid (Rhino §5): the job's mesh, the pipeline on axis 0 (its size is `stages`),
    each stage's programs sharded over the other axes when the plan runs."""


@dataclass(frozen=True)
class PipelinePlan:
    """The stage plan: what `rhino pipeline --out` writes and the runtime executes."""

    format: str
    version: int
    module: str
    stages: int
    epsilon: float
    microbatches: int
    cluster: str
    loss: str
    """The loss instruction (the scalar the gradients differentiate)."""
    forward_share: float
    """The forward's (the loss's ancestors') share of the step's dot and convolution FLOPs."""
    cut_bytes: int
    """Forward bytes sent between stages per step (the ILP's objective)."""
    bound_bytes: float
    gap: float
    status: str
    method: str
    """"ilp", or "hint" when the best baseline was not beaten (then it is the plan)."""
    imbalance: float
    """Forward compute of the stage farthest from the average, relative to the average."""
    tightening: bool
    search_time_s: float
    solver: StageSolveStats
    stage_reports: tuple[StageReport, ...]
    schedules: dict[str, ScheduleReport]
    """"1f1b" and "gpipe", simulated."""
    baselines: tuple[BaselineReport, ...]
    instructions: tuple[InstructionStage, ...]
    """Every ENTRY instruction, in program order."""
    timelines: dict[str, Timeline] = field(default_factory=dict, compare=False)
    mesh: DeviceMesh | None = None
    """Hybrid: the mesh whose axis 0 the stages are (see `PipelineRequest.mesh`); on disk
    its axis sizes."""

    def to_json(self) -> dict[str, object]:
        """The stage plan file: `{"schema": "rhino.pipeline/1", ...}`, the convention of
        every rhino JSON document."""
        return {
            "schema": f"{self.format}/{self.version}",
            "module": self.module,
            "stages": self.stages,
            "epsilon": self.epsilon,
            "microbatches": self.microbatches,
            "cluster": self.cluster,
            "loss": self.loss,
            "forward_share": self.forward_share,
            "cut_bytes": self.cut_bytes,
            "bound_bytes": self.bound_bytes,
            "gap": self.gap,
            "status": self.status,
            "method": self.method,
            "imbalance": self.imbalance,
            "tightening": self.tightening,
            "search_time_s": self.search_time_s,
            "solver": self.solver.to_json(),
            "stage_reports": [r.to_json() for r in self.stage_reports],
            "schedules": {name: s.to_json() for name, s in self.schedules.items()},
            "baselines": [b.to_json() for b in self.baselines],
            "instructions": [i.to_json() for i in self.instructions],
            "mesh": None if self.mesh is None else self.mesh.to_json(),
        }

    @staticmethod
    def from_json(doc: Any, where: str = "the stage plan") -> PipelinePlan:
        """The plan `to_json` wrote (or one with the older `"format": "rhino.pipeline",
        "version": 1` keys, or without keys version 1 gained later: `report.ADDED_IN_VERSION_1`).
        The plan's timelines are not in the file: they read empty."""
        if not is_stage_plan_doc(doc):
            raise ConfigError(
                f"{where} is not a stage plan (schema {PLAN_FORMAT}/..., from "
                "`rhino pipeline --out`)"
            )
        version = _plan_version(doc)
        if version != PLAN_VERSION:
            raise ConfigError(
                f"{where} has version {version!r}; this rhino reads version {PLAN_VERSION}"
            )
        try:
            return PipelinePlan(
                format=PLAN_FORMAT,
                version=PLAN_VERSION,
                module=str(doc["module"]),
                stages=int(doc["stages"]),
                epsilon=float(doc["epsilon"]),
                microbatches=int(doc["microbatches"]),
                cluster=str(doc["cluster"]),
                loss=str(doc.get("loss") or ""),
                forward_share=float(doc.get("forward_share", math.nan)),
                cut_bytes=int(doc["cut_bytes"]),
                bound_bytes=float(doc["bound_bytes"]),
                gap=float(doc["gap"]),
                status=str(doc["status"]),
                method=str(doc["method"]),
                imbalance=float(doc["imbalance"]),
                tightening=bool(doc["tightening"]),
                search_time_s=float(doc["search_time_s"]),
                solver=StageSolveStats.from_json(doc["solver"]),
                stage_reports=tuple(StageReport.from_json(r) for r in doc["stage_reports"]),
                schedules={
                    str(name): ScheduleReport.from_json(s) for name, s in doc["schedules"].items()
                },
                baselines=tuple(BaselineReport.from_json(b) for b in doc["baselines"]),
                instructions=tuple(InstructionStage.from_json(i) for i in doc["instructions"]),
                mesh=DeviceMesh.from_json([int(n) for n in doc["mesh"]])
                if doc.get("mesh")
                else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"{where} is malformed: {type(exc).__name__} {exc}") from None

    @staticmethod
    def read(path: str | Path) -> PipelinePlan:
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read the stage plan {path}: {exc}") from None
        return PipelinePlan.from_json(doc, str(path))

    def text(self) -> str:
        """The stage plan file's text (what `write` writes)."""
        return json.dumps(self.to_json(), indent=1) + "\n"

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.text(), encoding="utf-8")


def is_stage_plan_doc(doc: object) -> bool:
    """`{"schema": "rhino.pipeline/<version>", ...}`, or the older `{"format":
    "rhino.pipeline", "version": <version>, ...}` of stage plans written before."""
    if not isinstance(doc, dict):
        return False
    schema = doc.get("schema")
    return (isinstance(schema, str) and schema.startswith(f"{PLAN_FORMAT}/")) or doc.get(
        "format"
    ) == PLAN_FORMAT


def _plan_version(doc: dict[str, Any]) -> object:
    schema = doc.get("schema")
    if isinstance(schema, str):
        number = schema.partition("/")[2]
        return int(number) if number.isdigit() else number
    return doc.get("version")


def check_request(request: PipelineRequest, forward_instructions: int) -> None:
    if request.stages < 1:
        raise ConfigError(f"stages {request.stages}: need at least 1 stage", "stages")
    if request.stages > forward_instructions:
        raise ConfigError(
            f"stages {request.stages}: more stages than the {forward_instructions} "
            "forward instructions to place",
            "stages",
        )
    if request.epsilon is not None and not 0 <= request.epsilon <= 100:
        raise ConfigError(
            f"epsilon {request.epsilon:g}: expected a tolerance between 0 and 100 "
            "(0.1: a stage computes at most 10% more than the average)",
            "epsilon",
        )
    if request.microbatches < 1:
        raise ConfigError(f"microbatches {request.microbatches}: need at least 1", "microbatches")
    if request.cluster is None:
        raise ConfigError("a pipeline plan needs a cluster (device rates and links)")
    if request.mesh is not None:
        check_pipeline_mesh(request.mesh, request.stages)


def check_pipeline_mesh(mesh: DeviceMesh, stages: int) -> None:
    """The pipeline is mesh axis 0: it must have one device (block) per stage."""
    if mesh.shape[0] != stages:
        raise ConfigError(
            f"mesh {mesh}: the pipeline is mesh axis 0, "
            f"which has {mesh.shape[0]} devices, not {stages} stages",
            "mesh",
        )


def plan_pipeline(
    module: Module, request: PipelineRequest, progress: Callable[[str], None] | None = None
) -> PipelinePlan:
    """The stage plan of `module` for `request` (see the module docstring)."""
    say = progress or (lambda _text: None)
    started = time.perf_counter()
    say("splitting forward, backward and update")
    split = split_step(module, request.loss)
    rates = dict(request.cluster.flops) if request.cluster else {"f32": 1.0}
    graph = forward_graph(split, rates)
    check_request(request, len(graph.names))
    tries = (
        [request.epsilon]
        if request.epsilon is not None
        else epsilons(graph.compute, request.stages)
    )
    for k, epsilon in enumerate(tries):
        problem = StageProblem(
            graph.names, graph.compute, graph.bytes, graph.consumers, request.stages, epsilon
        )
        try:
            found, baselines = _search(problem, request, say)
            break
        except InfeasibleError:
            if k == len(tries) - 1:
                raise
            say(f"no plan within epsilon {epsilon:g}: widening")
    forward_stage = dict(zip(graph.names, found.stage, strict=True))
    stage = mirror(split, forward_stage, request.stages)
    say("simulating 1F1B and GPipe")
    return _report(
        module, request, split, problem, found, baselines, stage, time.perf_counter() - started
    )


def epsilons(compute: tuple[float, ...] | list[float], stages: int) -> list[float]:
    """The balances an unnamed epsilon tries, in order: `EPSILON`, or from the least one
    the largest instruction allows (its stage holds at least it: (1 + epsilon) / d >= its
    share), widening by `EPSILON_STEP` up to d - 1 (a stage may hold everything)."""
    total = sum(compute)
    share = max(compute, default=0.0) / total if total > 0 else 0.0
    start = max(EPSILON, math.ceil((stages * share - 1) * 100 - 1e-9) / 100)
    top = max(stages - 1, start)
    out = [start]
    while out[-1] < top:
        out.append(round(min(out[-1] + EPSILON_STEP, top), 2))
    return out


def _search(
    problem: StageProblem, request: PipelineRequest, say: Callable[[str], None]
) -> tuple[StageAssignment, list[Baseline]]:
    say("baselines: equal counts, best splits of the program order and the late order")
    baselines = all_baselines(problem)
    hint = best_balanced(baselines)
    say(f"stage ILP: {len(problem.names)} instructions, {problem.edges} edges")
    from rhino.search.pipeline.ilp import solve_stages  # CP-SAT: only where a search runs

    found = solve_stages(
        problem, request.options, tightening=request.tightening, hint=hint.stage if hint else None
    )
    return found, baselines


def all_baselines(problem: StageProblem) -> list[Baseline]:
    """Equal counts, and the DP's best split of the program order and of the late order."""
    return [equal_count(problem), best_split(problem), best_split_late(problem)]


def best_balanced(baselines: list[Baseline]) -> Baseline | None:
    """The baseline with the least cut bytes among those that meet the balance."""
    balanced = [b for b in baselines if b.within and b.evaluation is not None]
    return min(balanced, key=lambda b: b.evaluation.cut_bytes if b.evaluation else 0, default=None)


def _report(
    module: Module,
    request: PipelineRequest,
    split: StepSplit,
    problem: StageProblem,
    found: StageAssignment,
    baselines: list[Baseline],
    stage: tuple[int, ...],
    search_s: float,
) -> PipelinePlan:
    assert request.cluster is not None
    d, m = request.stages, request.microbatches
    traffic = _traffic(split, stage, d)
    times = _stage_times(split, stage, request.cluster, traffic, d, m)
    timelines = {name: simulate(name, times, m) for name in ("1f1b", "gpipe")}
    reports = _stage_reports(split, stage, request.cluster, traffic, times, timelines, d)
    evaluation = problem.evaluate(found.stage)
    schedules = {
        name: ScheduleReport(
            step_s=t.step_s,
            bubble_fraction=(d - 1) / (m + d - 1),
            simulated_bubble_fraction=1.0 - t.busy_fraction,
            busy_fraction=t.busy_fraction,
            peak_microbatches=t.peak_microbatches,
            peak_activation_bytes=t.peak_activation_bytes,
        )
        for name, t in timelines.items()
    }
    return PipelinePlan(
        format=PLAN_FORMAT,
        version=PLAN_VERSION,
        module=module.name,
        stages=d,
        epsilon=problem.epsilon,
        microbatches=m,
        cluster=request.cluster.name,
        loss=split.loss,
        forward_share=split.forward_share,
        cut_bytes=found.cut_bytes,
        bound_bytes=found.bound,
        gap=found.gap,
        status=found.status.value,
        method=found.method,
        imbalance=evaluation.imbalance,
        tightening=request.tightening,
        search_time_s=search_s,
        solver=found.stats,
        stage_reports=tuple(reports),
        schedules=schedules,
        baselines=tuple(_baseline_report(b) for b in baselines),
        instructions=tuple(
            InstructionStage(
                name=inst.name,
                opcode=inst.opcode_text,
                role=split.roles[k],
                stage=stage[k],
                free=inst.name in split.free,
            )
            for k, inst in enumerate(split.order)
        ),
        timelines=timelines,
        mesh=request.mesh,
    )


def _baseline_report(b: Baseline) -> BaselineReport:
    e = b.evaluation
    return BaselineReport(
        name=b.name,
        cut_bytes=e.cut_bytes if e else None,
        imbalance=e.imbalance if e else None,
        within_balance=b.within,
    )


@dataclass
class _Traffic:
    """Bytes received per (producer, receiving stage), split by what they are."""

    sent: dict[tuple[int, int], int] = field(default_factory=dict)
    """(from, to) -> bytes per step."""
    per_microbatch: dict[tuple[int, int], int] = field(default_factory=dict)
    """(from, to) -> bytes per step of tensors that depend on the batch."""
    forward: list[int] = field(default_factory=list)
    """Per stage: forward tensors sent to later stages, bytes per step."""
    stored: list[int] = field(default_factory=list)
    """Per stage: forward activations its backward reads, bytes per step."""


def _traffic(split: StepSplit, stage: tuple[int, ...], d: int) -> _Traffic:
    """Bytes between the `d` stages of `stage` (some may hold no instruction)."""
    out = _Traffic(forward=[0] * d, stored=[0] * d)
    roles, index = split.roles, split.index
    stored: set[tuple[int, int]] = set()
    recomputed = state_scalars(split)
    readers = _recomputing_stages(split, stage, recomputed)
    for k, inst in enumerate(split.order):
        if inst.name in split.free or roles[k] is Role.OUTPUT or inst.name in recomputed:
            continue
        size = inst.shape.byte_size
        targets = set()
        for user in inst.users:
            u = index[user.name]
            if roles[u] is Role.OUTPUT:
                continue
            if user.name in recomputed:  # read where the scalar is recomputed
                targets |= readers[user.name] - {stage[k]}
            elif stage[u] != stage[k]:
                targets.add(stage[u])
            batch = inst.name in split.per_microbatch
            if roles[k] is Role.FORWARD and roles[u] is Role.BACKWARD and batch:
                stored.add((k, stage[u]))
        for t in sorted(targets):
            pair = (stage[k], t)
            out.sent[pair] = out.sent.get(pair, 0) + size
            if inst.name in split.per_microbatch:
                out.per_microbatch[pair] = out.per_microbatch.get(pair, 0) + size
            if roles[k] is Role.FORWARD and t > stage[k]:
                out.forward[stage[k]] += size
    for k, t in stored:
        out.stored[t] += split.order[k].shape.byte_size
    return out


def _recomputing_stages(
    split: StepSplit, stage: tuple[int, ...], recomputed: frozenset[str]
) -> dict[str, set[int]]:
    """For each recomputed update scalar (`state_scalars`), the stages that compute it:
    those of its readers, through the recomputed scalars among them, and its own when the
    step returns it."""
    found: dict[str, set[int]] = {}
    for k in range(len(split.order) - 1, -1, -1):
        inst = split.order[k]
        if inst.name not in recomputed:
            continue
        stages: set[int] = set()
        for user in inst.users:
            if user.name in recomputed:
                stages |= found[user.name]
            elif split.role(user.name) is Role.OUTPUT:  # a result: made on its own stage
                stages.add(stage[k])
            else:
                stages.add(stage[split.index[user.name]])
        found[inst.name] = stages
    return found


def _link(cluster: Cluster, a: int, b: int) -> Link:
    """Stage s runs on device s: one node holds devices_per_node consecutive stages."""
    same = a // cluster.devices_per_node == b // cluster.devices_per_node
    return cluster.intra_node if same else cluster.inter_node


def _role_seconds(
    split: StepSplit, stage: tuple[int, ...], cluster: Cluster, d: int
) -> dict[Role, list[float]]:
    seconds = {role: [0.0] * d for role in Role}
    for k, inst in enumerate(split.order):
        leaves = inst.shape.leaves()
        rate = cluster.flops_for(leaves[0].dtype if leaves else "f32")
        seconds[split.roles[k]][stage[k]] += split.flops[k] / rate
    return seconds


def _stage_times(
    split: StepSplit, stage: tuple[int, ...], cluster: Cluster, traffic: _Traffic, d: int, m: int
) -> StageTimes:
    """Per micro-batch: compute is the batch's over m; tensors that do not depend on the
    batch are sent once per step, their time spread over the m micro-batches."""
    seconds = _role_seconds(split, stage, cluster, d)
    send = {}
    for (a, b), size in traffic.sent.items():
        link = _link(cluster, a, b)
        send[(a, b)] = size / m / link.bandwidth + link.latency
    return StageTimes(
        forward_s=tuple(s / m for s in seconds[Role.FORWARD]),
        backward_s=tuple(s / m for s in seconds[Role.BACKWARD]),
        update_s=tuple(seconds[Role.UPDATE]),
        send_s=send,
        activation_bytes=tuple(b / m for b in traffic.stored),
    )


def _stage_reports(
    split: StepSplit,
    stage: tuple[int, ...],
    cluster: Cluster,
    traffic: _Traffic,
    times: StageTimes,
    timelines: dict[str, Timeline],
    d: int,
) -> list[StageReport]:
    seconds = _role_seconds(split, stage, cluster, d)
    counts = [{role.value: 0 for role in Role} for _ in range(d)]
    weights, state = [0] * d, [0] * d
    for k, inst in enumerate(split.order):
        counts[stage[k]][split.roles[k].value] += 1
        if inst.name in split.weights:
            weights[stage[k]] += inst.shape.byte_size
        elif split.roles[k] is Role.STATE:
            state[stage[k]] += inst.shape.byte_size
    reports = []
    for s in range(d):
        sent = {str(b): size for (a, b), size in sorted(traffic.sent.items()) if a == s}
        backward = sum(size for (a, b), size in traffic.sent.items() if a == s and b < s)
        reports.append(
            StageReport(
                stage=s,
                forward_s=seconds[Role.FORWARD][s],
                backward_s=seconds[Role.BACKWARD][s],
                update_s=seconds[Role.UPDATE][s],
                instructions=counts[s],
                parameter_bytes=weights[s],
                optimizer_bytes=state[s],
                activation_bytes=times.activation_bytes[s],
                peak_activation_bytes={n: t.peak_activation_bytes[s] for n, t in timelines.items()},
                sent_bytes=sent,
                sent_forward_bytes=traffic.forward[s],
                sent_backward_bytes=backward,
            )
        )
    return reports
