"""Run a stage plan: every stage's programs compiled once on its devices, a static
schedule followed per stage, activations moved between devices, the result verified.

    prepare(module, plan, m, spmd=None) -> Pipeline          cut and compile, once
    run_steps(pipeline, schedule, inputs, steps=...)         run steps of a schedule
    run_pipeline(module, plan, options, spmd=None) -> PipelineReport   all of it

Stage s runs on device s of the job, or, hybrid (Rhino §5: `spmd` is the plan request
for the other mesh axes), on the s-th block of `spmd.mesh.size` devices, each of its
programs sharded by its own SPMD plan. One thread per stage follows the stage's list
of tasks (`tasks.schedule`); a task waits until the values it reads have
arrived, runs its program, and sends each result to the stages that read it
(`jax.device_put` into the reading program's layout: the measured bytes between stages).
The step's parameters are placed on the stages that read them before the step
(resident weights and optimizer state; the data's micro-batches, rows k*B/m ..
(k+1)*B/m of dimension 0); one read off the stage the plan gave it counts as sent from
there, as the plan counts it.

In a job of several processes (`xla_bridge.init_distributed` with a transfer address),
each process runs the stages whose devices it holds; one more thread per process makes
its sends to and receives from the others, in the order `tasks.transfer_order`
gives every process alike.

Verification runs the original step on one device with the same inputs (drawn from the
seed) and compares every output this process's stages make: the loss, the updated
parameters and the optimizer state (`rhino.runtime.verify`'s tolerances). Timing:
`steps` steps after `warmup`; each task's time is measured from its start to its results
being ready; the timeline of the median step is reported next to the simulator's
prediction for the same task times.
"""

from __future__ import annotations

import hashlib
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rhino.hlo.errors import ExecutionError
from rhino.hlo.ir import Module
from rhino.hlo.parser import parse_module
from rhino.hlo.printer import print_module
from rhino.runtime import xla_bridge as xb
from rhino.runtime.inputs import entry_inputs, numpy_dtype
from rhino.runtime.pipeline.programs import (
    Program,
    StagePlan,
    StagePrograms,
    accumulate_program,
    is_update,
    stage_programs,
)
from rhino.runtime.pipeline.report import (
    BubbleReport,
    BytesReport,
    OrderReport,
    PipelineReport,
    ProgramReport,
    StepPrediction,
    StepVerifyReport,
)
from rhino.runtime.pipeline.tasks import (
    STEP,
    Schedule,
    Task,
    TaskGraph,
    schedule,
    stage_times,
    task_graph,
    transfer_order,
)
from rhino.runtime.spmd.apply import planned_module, realized_program
from rhino.runtime.spmd.runner import Timing, compile_realized
from rhino.runtime.verify import compare_output, reduction_lengths, tolerance_for
from rhino.search.pipeline.schedule import Event, Timeline, simulate

if TYPE_CHECKING:
    from rhino.search.spmd.planner import PlanRequest

WAIT_S = 300.0
"""How long a task waits for a value before the run is declared stuck."""


@dataclass(frozen=True)
class PipelineOptions:
    platform: str | None = None
    seed: int = 0
    verify: bool = True
    schedule: str = "1f1b"
    microbatches: int | None = None
    """None: the plan's."""
    steps: int = 3
    warmup: int = 1
    partitioner: str = "shardy"
    """XLA's partitioner for the programs of a hybrid run's stages (`RunOptions.partitioner`)."""


@dataclass(frozen=True)
class StepRecord:
    """What one step did: when each task ran, what was sent."""

    seconds: float
    events: tuple[tuple[Task, float, float], ...]
    """(task, start, end) in seconds from the step's start, in the order they ran."""
    sent: dict[tuple[int, int], int]
    """(from, to) -> bytes sent."""
    send_seconds: dict[tuple[int, int], float]
    """(from, to) -> seconds spent sending (per step)."""
    outputs: tuple[np.ndarray | None, ...] = field(default=(), repr=False)
    """The step's results; None for one made by another process."""


@dataclass(frozen=True)
class Pipeline:
    """A stage plan's programs compiled on their devices, ready to run any schedule."""

    plan: StagePlan
    programs: StagePrograms
    graph: TaskGraph
    groups: tuple[tuple[Any, ...], ...]
    """Stage s runs on the devices groups[s] (one each, or a mesh for SPMD in the stage)."""
    compiled: dict[str, xb.Compiled] = field(repr=False)
    """"F0", "B0", "U0", "AB0" (accumulating B0's sums), ... -> its executable."""
    compile_s: dict[str, float]
    """Per program: planning its shardings (hybrid) and compiling it, seconds."""
    notes: tuple[str, ...] = ()
    local: frozenset[int] = frozenset()
    """The stages this process runs (all of them, unless the job has several processes)."""

    @property
    def devices(self) -> tuple[Any, ...]:
        return tuple(d for group in self.groups for d in group)


def prepare(
    module: Module,
    plan: StagePlan,
    microbatches: int | None = None,
    platform: str | None = None,
    *,
    optimize: bool = True,
    spmd: PlanRequest | None = None,
    partitioner: str = "shardy",
) -> Pipeline:
    """Cut `module` into `plan`'s programs for `microbatches` (None: the plan's) and
    compile each once on its stage's devices (`optimize`: see `xla_bridge.compile_spmd`).

    Hybrid (Rhino §5): with `spmd`, every stage runs on a mesh of `spmd.mesh` devices
    (stage s on the s-th block of them) and each of its programs is sharded by its own
    plan (`make_plan(program, spmd)`), its accumulation in the layout of the sums it adds,
    compiled through `partitioner` (`runner.compile_realized`).
    """
    programs = stage_programs(module, plan, microbatches or plan.microbatches)
    graph = task_graph(programs)
    size = spmd.mesh.size if spmd else 1
    groups, local = _stage_devices(programs.stages, size, platform)
    compiled: dict[str, xb.Compiled] = {}
    seconds: dict[str, float] = {}
    notes: list[str] = []
    for (s, kind), program in programs.programs.items():
        if s not in local:
            continue
        start = time.perf_counter()
        if spmd is not None and size > 1:
            annotated, realized = _sharded(program.text, spmd)
            notes += [f"{kind}{s}: {n}" for n in realized]
            compiled[f"{kind}{s}"], _, more = compile_realized(
                annotated, spmd.mesh, groups[s], partitioner=partitioner, optimize=optimize
            )
            notes += [f"{kind}{s}: {n}" for n in more]
        else:
            compiled[f"{kind}{s}"] = xb.compile_spmd(
                program.text, groups[s], num_partitions=size, optimize=optimize
            )
        seconds[f"{kind}{s}"] = time.perf_counter() - start
    for key in programs.accumulate_text:
        s, kind = key
        if s not in local:
            continue
        start = time.perf_counter()
        producer = compiled[f"{kind}{s}"]
        layouts = [
            producer.outputs[programs.programs[key].outputs.index(v)].sharding
            for v in programs.accumulated(key)
        ]
        text = accumulate_program(programs, key, layouts if size > 1 else None)
        if spmd is not None and size > 1:
            accumulate = parse_module(text, "<accumulation program>")
            compiled[f"A{kind}{s}"], _, more = compile_realized(
                accumulate, spmd.mesh, groups[s], partitioner=partitioner, optimize=optimize
            )
            notes += [f"A{kind}{s}: {n}" for n in more]
        else:
            compiled[f"A{kind}{s}"] = xb.compile_spmd(
                text, groups[s], num_partitions=size, optimize=optimize
            )
        seconds[f"A{kind}{s}"] = time.perf_counter() - start
    return Pipeline(plan, programs, graph, groups, compiled, seconds, tuple(notes), local)


def _stage_devices(
    stages: int, size: int, platform: str | None
) -> tuple[tuple[tuple[Any, ...], ...], frozenset[int]]:
    """Stage s's devices (the s-th block of `size`), and the stages of this process. In a
    job of several processes the stages span all of the job's devices, a stage within
    one process."""
    process = xb.process_info()
    need = stages * size
    if process.count == 1:
        devices = xb.local_devices(platform, need)
    else:
        have = xb.device_count(platform)
        if have != need:
            raise ExecutionError(
                f"{stages} stages of {size} device(s) need {need} devices, "
                f"but the {process.count} processes of this job have {have}"
            )
        devices = xb.global_devices(platform, need)
    groups = tuple(tuple(devices[s * size : (s + 1) * size]) for s in range(stages))
    local = set()
    for s, group in enumerate(groups):
        owners = {xb.process_of(d) for d in group}
        if len(owners) > 1:
            raise ExecutionError(f"stage {s} would span processes {sorted(owners)}")
        if owners == {process.index}:
            local.add(s)
    return groups, frozenset(local)


def _sharded(text: str, spmd: PlanRequest) -> tuple[Module, tuple[str, ...]]:
    """A program with the shardings of its best plan on `spmd.mesh` written in."""
    from rhino.search.spmd.planner import make_plan  # the solvers: only for a hybrid run

    program = parse_module(text, "<stage program>")
    return realized_program(program, make_plan(program, spmd))


def run_steps(
    pipeline: Pipeline, name: str, inputs: Sequence[np.ndarray], *, steps: int, warmup: int = 0
) -> tuple[Schedule, list[StepRecord]]:
    """Run `steps` steps (after `warmup` untimed ones) under schedule `name` on the
    step's parameters `inputs` (global arrays, in parameter order)."""
    if warmup < 0 or steps < 1:
        raise ExecutionError(f"need warmup >= 0 and steps >= 1, got {warmup} and {steps}")
    table = schedule(pipeline.programs, name)
    runner = _StepRunner(pipeline, table, list(inputs))
    records = [runner.step() for _ in range(warmup + steps)]
    return table, records[warmup:]


def run_pipeline(
    module: Module, plan: StagePlan, options: PipelineOptions, spmd: PlanRequest | None = None
) -> PipelineReport:
    """Compile, run, verify and time `plan` (see the module docstring; `spmd`: a hybrid
    run, see `prepare`)."""
    pipeline = prepare(
        module,
        plan,
        options.microbatches,
        options.platform,
        spmd=spmd,
        partitioner=options.partitioner,
    )
    digest = hashlib.sha256(
        "\n".join([*(p.text for p in pipeline.programs.programs.values()), repr(options)]).encode()
    ).hexdigest()[:16]
    xb.check_agreement("stage programs and run options (digest)", digest)
    inputs = [maker.whole() for maker in entry_inputs(module, options.seed)]
    table, records = run_steps(
        pipeline, options.schedule, inputs, steps=options.steps, warmup=options.warmup
    )
    verify = None
    single = None
    if options.verify:
        device = xb.local_devices(options.platform, 1)
        # calls and fusions inlined: XLA's CPU backend cannot compile an optimized dump's
        # fusions (they lack backend configs)
        original = print_module(planned_module(module))
        reference = xb.compile_reference(original, device[0])
        want = xb.execute(reference, inputs)
        got = records[-1].outputs
        terms = reduction_lengths(module)
        checks = [
            compare_output(i, want[i], g, tolerance_for(want[i].dtype, reduction=terms[i]))
            for i, g in enumerate(got)
            if g is not None
        ]
        verify = StepVerifyReport(tuple(checks), options.seed)
        times = xb.time_execution(reference, inputs, warmup=0, steps=options.steps)
        single = statistics.median(times)
    return _report(pipeline, table, records, verify, single)


class _Mailbox:
    """Values ready on a stage: (value, micro-batch, stage) -> device array."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._items: dict[tuple[str, int, int], Any] = {}
        self.failure: BaseException | None = None

    def put(self, key: tuple[str, int, int], array: Any) -> None:
        with self._ready:
            self._items[key] = array
            self._ready.notify_all()

    def get(self, key: tuple[str, int, int]) -> Any:
        with self._ready:
            ok = self._ready.wait_for(
                lambda: key in self._items or self.failure is not None, timeout=WAIT_S
            )
            if self.failure is not None:
                raise ExecutionError("another stage failed") from None
            if not ok:
                value, k, stage = key
                raise ExecutionError(
                    f"stage {stage} waited {WAIT_S:.0f} s for %{value} of "
                    f"micro-batch {k}: the schedule is stuck"
                )
            return self._items[key]

    def fail(self, exc: BaseException) -> None:
        with self._ready:
            self.failure = exc
            self._ready.notify_all()


class _StepRunner:
    """Runs steps of one schedule on compiled programs (module docstring): a thread per
    stage of this process, and, in a job of several, one that makes this process's
    sends and receives to and from the others in `transfer_order`."""

    def __init__(self, pipeline: Pipeline, table: Schedule, inputs: list[np.ndarray]) -> None:
        self.programs = pipeline.programs
        self.compiled = pipeline.compiled
        self.groups = pipeline.groups
        self.local = pipeline.local
        self.table = table
        given = dict(zip(pipeline.programs.parameters, inputs, strict=False))
        inputs = [*inputs, *pipeline.programs.extra_inputs(given)]
        self.inputs = dict(zip(pipeline.programs.parameters, inputs, strict=True))
        self.placed: dict[tuple[str, int, int], Any] = {}
        self.host_sent: dict[tuple[int, int], int] = {}
        self.targets = _targets(pipeline.programs, pipeline.compiled)
        self.remote = tuple(
            t
            for t in transfer_order(pipeline.programs, pipeline.graph, table)
            if (t.source in self.local) != (t.target in self.local)
        )
        self.place()

    def place(self) -> None:
        """The step's parameters on every stage of this process that reads them, in the
        layout of the first program there that does. One read off the stage the plan
        gave it counts as sent from that stage (as the plan counts it)."""
        p = self.programs
        b = p.batch // p.microbatches
        for name, whole in self.inputs.items():
            value = p.values.get(name)
            if value is None:
                continue  # read by no program
            parts = (
                [(k, whole[k * b : (k + 1) * b]) for k in range(p.microbatches)]
                if value.per_microbatch
                else [(STEP, whole)]
            )
            for k, data in parts:
                for stage in sorted({s for s, _ in value.readers}):
                    if stage in self.local:
                        exe, index = self.targets[(name, stage)]
                        self.placed[(name, k, stage)] = xb.move_input(exe, index, data)
                    if stage != value.stage and value.stage in self.local and name not in p.extra:
                        pair = (value.stage, stage)
                        self.host_sent[pair] = self.host_sent.get(pair, 0) + data.nbytes

    def step(self) -> StepRecord:
        mail = _Mailbox()
        for key, array in self.placed.items():
            mail.put(key, array)
        log: list[tuple[Task, float, float]] = []
        sent: dict[tuple[int, int], int] = dict(self.host_sent)
        send_s: dict[tuple[int, int], float] = {}
        lock = threading.Lock()
        start = time.perf_counter()
        worker = _Stage(self, mail, log, sent, send_s, lock, start)
        threads = [
            threading.Thread(target=worker.run, args=(s,), name=f"rhino-stage-{s}")
            for s in sorted(self.local)
        ]
        if self.remote:
            threads.append(threading.Thread(target=worker.exchange, name="rhino-transfers"))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if mail.failure is not None:
            raise mail.failure
        seconds = time.perf_counter() - start
        outputs = tuple(self._output(mail, v) for v in self.programs.outputs)
        return StepRecord(seconds, tuple(sorted(log, key=lambda e: e[1])), sent, send_s, outputs)

    def _output(self, mail: _Mailbox, v: str) -> np.ndarray | None:
        """A result of the step, when this process has it (its stage runs here)."""
        value = self.programs.values[v]
        if value.producer is None:
            return self.inputs[v]
        if value.stage not in self.local:
            return None
        return xb.to_host(mail.get((v, STEP, -1)))


def _targets(
    programs: StagePrograms, compiled: dict[str, xb.Compiled]
) -> dict[tuple[str, int], tuple[xb.Compiled, int]]:
    """(value, stage) -> the first program on that stage that reads it, and which of its
    parameters the value is: a value sent to a stage arrives in that program's layout."""
    out: dict[tuple[str, int], tuple[xb.Compiled, int]] = {}
    for (s, kind), program in sorted(programs.programs.items()):
        exe = compiled.get(f"{kind}{s}")
        if exe is None:  # another process's stage
            continue
        for index, v in enumerate(program.inputs):
            out.setdefault((v, s), (exe, index))
    return out


class _Stage:
    """One stage's thread body: its tasks in schedule order."""

    def __init__(
        self,
        runner: _StepRunner,
        mail: _Mailbox,
        log: list[tuple[Task, float, float]],
        sent: dict[tuple[int, int], int],
        send_s: dict[tuple[int, int], float],
        lock: threading.Lock,
        start: float,
    ) -> None:
        self.r = runner
        self.mail = mail
        self.log = log
        self.sent = sent
        self.send_s = send_s
        self.lock = lock
        self.start = start

    def run(self, stage: int) -> None:
        sums: dict[str, Any] = {}
        partial: dict[str, Any] = {}
        try:
            for task in self.r.table.actions[stage]:
                began = time.perf_counter() - self.start
                if task.kind.startswith("A"):
                    self._accumulate(task, sums, partial)
                else:
                    self._compute(task, partial)
                with self.lock:
                    self.log.append((task, began, time.perf_counter() - self.start))
        except BaseException as exc:  # every stage must stop, not wait for this one
            self.mail.fail(exc)

    def exchange(self) -> None:
        """This process's sends and receives with the others, in the shared order."""
        p = self.r.programs
        try:
            for t in self.r.remote:
                source, target = self.r.groups[t.source], self.r.groups[t.target]
                key = (t.value, t.microbatch, t.target)
                if t.source in self.r.local:
                    began = time.perf_counter()
                    array = self.mail.get(key)
                    xb.send_to_devices(array, source, target)
                    with self.lock:
                        pair = (t.source, t.target)
                        self.sent[pair] = self.sent.get(pair, 0) + int(array.nbytes)
                        self.send_s[pair] = self.send_s.get(pair, 0.0) + time.perf_counter() - began
                else:
                    shape = p.values[t.value].shape
                    dtype = numpy_dtype(shape.dtype)
                    self.mail.put(key, xb.receive_from_devices(shape.dims, dtype, source, target))
        except BaseException as exc:  # every stage must stop, not wait for this one
            self.mail.fail(exc)

    def _compute(self, task: Task, partial: dict[str, Any]) -> None:
        p = self.r.programs
        program = p.programs[task.program]
        exe = self.r.compiled[f"{task.kind}{task.stage}"]
        k = task.microbatch
        args = []
        for i, v in enumerate(program.inputs):
            instance = k if not is_update(task.kind) and p.values[v].per_microbatch else STEP
            args.append(xb.move_input(exe, i, self.mail.get((v, instance, task.stage))))
        results = xb.execute_arrays(exe, args)
        xb.wait_ready(results)
        for v, array in zip(program.outputs, results, strict=True):
            if p.values[v].accumulate:
                partial[v] = array
            self._publish(task, v, array)

    def _accumulate(self, task: Task, sums: dict[str, Any], partial: dict[str, Any]) -> None:
        names = self.r.programs.accumulated(task.program)
        if task.microbatch == 0:
            sums.update({v: partial[v] for v in names})
        else:
            exe = self.r.compiled[f"{task.kind}{task.stage}"]
            args = [sums[v] for v in names] + [partial[v] for v in names]
            args = [xb.move_input(exe, i, a) for i, a in enumerate(args)]
            results = xb.execute_arrays(exe, args)
            xb.wait_ready(results)
            sums.update(zip(names, results, strict=True))
        if task.microbatch == self.r.programs.microbatches - 1:
            for v in names:
                self._send(v, STEP, sums[v], self._step_readers(v))

    def _publish(self, task: Task, v: str, array: Any) -> None:
        """Send a result to the readers of this copy of it."""
        p = self.r.programs
        value = p.values[v]
        k, last = task.microbatch, p.microbatches - 1
        if is_update(task.kind):
            self._send(v, STEP, array, self._step_readers(v))
            return
        per_mb = sorted({s for s, kind in value.readers if not is_update(kind)})
        if value.per_microbatch:
            self._send(v, k, array, per_mb)
        elif k == 0:
            self._send(v, STEP, array, per_mb)
        if k == last and not value.accumulate:
            self._send(v, STEP, array, self._step_readers(v))

    def _step_readers(self, v: str) -> list[int]:
        """Stages whose update reads `v`, and -1 for the step's outputs."""
        value = self.r.programs.values[v]
        stages = sorted({s for s, kind in value.readers if is_update(kind)})
        return stages + ([-1] if v in self.r.programs.outputs else [])

    def _send(self, v: str, k: int, array: Any, stages: list[int]) -> None:
        source = self.r.programs.values[v].stage
        for t in stages:
            if t in (-1, source) or t not in self.r.local:  # remote: `exchange` sends it
                self.mail.put((v, k, t), array)
                continue
            began = time.perf_counter()
            exe, index = self.r.targets[(v, t)]
            moved = xb.move_input(exe, index, array)
            xb.wait_ready([moved])
            with self.lock:
                pair = (source, t)
                self.sent[pair] = self.sent.get(pair, 0) + int(moved.nbytes)
                self.send_s[pair] = self.send_s.get(pair, 0.0) + time.perf_counter() - began
            self.mail.put((v, k, t), moved)


def _report(
    pipeline: Pipeline,
    table: Schedule,
    records: list[StepRecord],
    verify: StepVerifyReport | None,
    single: float | None,
) -> PipelineReport:
    programs, graph, plan = pipeline.programs, pipeline.graph, pipeline.plan
    steps = [r.seconds for r in records]
    median = sorted(records, key=lambda r: r.seconds)[len(records) // 2]
    per_task: dict[Task, float] = {}
    for task in graph.tasks:
        times = [e - s for r in records for t, s, e in r.events if t == task]
        per_task[task] = statistics.median(times) if times else 0.0
    m = programs.microbatches
    sends = {pair: t / len(records) / m for pair, t in _mean_send(records).items()}
    simulated = simulate(table.name, stage_times(graph, per_task, sends), m)
    measured = _timeline(table.name, median, programs.stages)
    p = programs.stages
    return PipelineReport(
        module=programs.module,
        stages=p,
        microbatches=m,
        schedule=table.name,
        devices=tuple(str(d) for d in pipeline.devices),
        notes=pipeline.notes,
        process_index=xb.process_info().index,
        process_count=xb.process_info().count,
        local_stages=tuple(sorted(pipeline.local)),
        programs=tuple(
            _program_report(prog, pipeline.compile_s)
            for prog in programs.programs.values()
            if prog.stage in pipeline.local
        ),
        verify=verify,
        step=Timing.of(tuple(steps)),
        single_device_step_s=single,
        task_seconds=_task_seconds(per_task, p),
        bytes=_bytes_report(plan, graph, median, pipeline.local),
        order=_order_report(table, median, pipeline.local),
        bubble=BubbleReport(
            simulated=1 - simulated.busy_fraction,
            measured=1 - measured.busy_fraction,
            formula=(p - 1) / (m + p - 1),
        ),
        predicted_step_s=StepPrediction(
            plan=plan.schedules[table.name].step_s if table.name in plan.schedules else 0.0,
            simulated=simulated.step_s,
            measured=median.seconds,
        ),
        peak_activation_bytes=tuple(simulated.peak_activation_bytes),
        measured=measured,
        simulated=simulated,
    )


def _mean_send(records: list[StepRecord]) -> dict[tuple[int, int], float]:
    out: dict[tuple[int, int], float] = {}
    for r in records:
        for pair, t in r.send_seconds.items():
            out[pair] = out.get(pair, 0.0) + t
    return out


def _timeline(name: str, record: StepRecord, stages: int) -> Timeline:
    """The measured step in the simulator's terms (accumulations count as their task's)."""
    events = []
    for task, s, e in record.events:
        kind = "U" if is_update(task.kind) else task.kind[-1]
        events.append(Event(task.stage, kind, task.microbatch, s, e))
    step = max((e.end_s for e in events), default=0.0)
    peaks = tuple(0 for _ in range(stages))
    return Timeline(name, step, tuple(events), peaks, tuple(0.0 for _ in range(stages)))


def _task_seconds(per_task: dict[Task, float], stages: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {str(s): {} for s in range(stages)}
    for kind in ("F", "B", "AF", "AB", "U"):
        for s in range(stages):
            if kind == "U":  # every update level, once per step: their sum
                updates = [
                    t for task, t in per_task.items() if task.stage == s and is_update(task.kind)
                ]
                times = [sum(updates)] if updates else []
            else:
                times = [t for task, t in per_task.items() if task.stage == s and task.kind == kind]
            if times:
                out[str(s)][kind] = statistics.median(times)
    return out


def _pairs(sent: dict[tuple[int, int], int]) -> dict[str, int]:
    return {f"{a}->{b}": n for (a, b), n in sorted(sent.items())}


def _bytes_report(
    plan: StagePlan, graph: TaskGraph, record: StepRecord, local: frozenset[int]
) -> BytesReport:
    """Bytes per (from, to) pair; in a job of several processes, those this process
    sends (from its stages)."""
    predicted = {k: v for k, v in plan.sent_bytes.items() if k[0] in local}
    planned = {k: v for k, v in graph.sent_bytes().items() if k[0] in local}
    measured = record.sent
    return BytesReport(
        predicted=_pairs(predicted),
        planned=_pairs(planned),
        measured=_pairs(measured),
        predicted_total=sum(predicted.values()),
        planned_total=sum(planned.values()),
        measured_total=sum(measured.values()),
    )


def _order_report(table: Schedule, record: StepRecord, local: frozenset[int]) -> OrderReport:
    """Per stage of this process, its tasks in the planned and in the measured order."""
    planned = {
        str(s): tuple(str(t) for t in tasks) for s, tasks in enumerate(table.actions) if s in local
    }
    measured: dict[str, list[str]] = {str(s): [] for s in sorted(local)}
    for task, _, _ in record.events:
        measured[str(task.stage)].append(str(task))
    ran = {s: tuple(tasks) for s, tasks in measured.items()}
    return OrderReport(planned=planned, measured=ran, same=planned == ran)


def _program_report(program: Program, compile_s: dict[str, float]) -> ProgramReport:
    return ProgramReport(
        stage=program.stage,
        kind=program.kind,
        instructions=program.instructions,
        inputs=len(program.inputs),
        outputs=len(program.outputs),
        compile_s=compile_s[f"{program.kind}{program.stage}"],
    )
