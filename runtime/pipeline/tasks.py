"""The task graph of a pipelined step and its static schedule, as plain data (Rhino §6).

    task_graph(programs) -> TaskGraph
    schedule(programs, name) -> Schedule          name: "1f1b" (default) or "gpipe"
    run_order(programs, graph, schedule) -> tasks, in one order the step can run in
    transfer_order(programs, graph, schedule) -> the sends between stages in that order
    stage_times(graph, seconds, send_seconds) -> StageTimes   (for the simulator)

Tasks, per stage s and micro-batch k:
    F(s, k), B(s, k)   the stage's forward and backward programs on micro-batch k
    AF(s, k), AB(s, k) local accumulation (LA): add the partial sums F(s, k) or B(s, k)
                       made into the stage's running sums (k = 0 starts them)
    U(s)               the stage's update program, once per step (k = -1)
Edges are the values a task reads (`Transfer`s when the reader is on another stage): a
per-micro-batch value goes from the task of micro-batch k to the reader of micro-batch k;
a value that is the same in every micro-batch (computed from weights alone) is sent once,
after micro-batch 0; the sums reach the update after the last micro-batch's
accumulation. The step's parameters come from the host, on the stage the plan gave them.

A schedule is, per stage (device group), the ordered list of its tasks: the F/B order
of `rhino.search.pipeline.schedule` (1F1B or GPipe, the orders its simulator times),
each accumulation right after the task whose sums it adds, and the update last. Every
process of a job follows the same table.
"""

from __future__ import annotations

from dataclasses import dataclass

from rhino.hlo.errors import ConfigError
from rhino.runtime.pipeline.programs import ProgramKey, StagePrograms, is_update
from rhino.search.pipeline.schedule import SCHEDULES, StageTimes

STEP = -1
"""The micro-batch index of once-per-step tasks and values."""


@dataclass(frozen=True, order=True)
class Task:
    stage: int
    kind: str
    """"F", "B", "AF", "AB" (accumulate the sums of F or B), or "U" (an update; "UU", ...
    for later levels, `stage_programs.KINDS`)."""
    microbatch: int
    """0..m-1, or STEP for the update."""

    @property
    def program(self) -> ProgramKey:
        """The program it runs (for an accumulation: the one whose sums it adds)."""
        return (self.stage, self.kind[1:] if self.kind.startswith("A") else self.kind)

    def __str__(self) -> str:
        return f"{self.kind}{self.stage}" + (
            "" if self.microbatch == STEP else f".{self.microbatch}"
        )


@dataclass(frozen=True)
class Transfer:
    """A value sent from one stage to another (or placed by the host)."""

    value: str
    microbatch: int
    """The micro-batch it belongs to; STEP when sent once per step."""
    source: int
    """Stage that holds it."""
    target: int
    """Stage that reads it."""
    after: Task | None
    """The task it waits for; None for a parameter of the step (the host has it)."""
    nbytes: int


@dataclass(frozen=True)
class TaskGraph:
    tasks: tuple[Task, ...]
    reads: dict[Task, tuple[tuple[str, int], ...]]
    """Task -> the (value, micro-batch) pairs it reads, micro-batch STEP when once per step."""
    transfers: tuple[Transfer, ...]
    """Every send between stages in one step."""
    activation_bytes: tuple[int, ...]
    """Per stage: bytes one micro-batch's forward leaves for its backward on the stage."""

    def transfers_between_stages(self) -> tuple[Transfer, ...]:
        """The sends a running step makes (parameters are placed by the host)."""
        return tuple(t for t in self.transfers if t.after is not None)

    def sent_bytes(self) -> dict[tuple[int, int], int]:
        """(from, to) -> bytes per step."""
        out: dict[tuple[int, int], int] = {}
        for t in self.transfers:
            out[(t.source, t.target)] = out.get((t.source, t.target), 0) + t.nbytes
        return out


@dataclass(frozen=True)
class Schedule:
    name: str
    actions: tuple[tuple[Task, ...], ...]
    """Per stage, its tasks in the order it runs them."""


def task_graph(programs: StagePrograms) -> TaskGraph:
    """Tasks, what each reads, and the transfers of one step (module docstring)."""
    m = programs.microbatches
    tasks: list[Task] = []
    reads: dict[Task, tuple[tuple[str, int], ...]] = {}
    for (s, kind), program in sorted(programs.programs.items()):
        for k in range(m) if not is_update(kind) else (STEP,):
            task = Task(s, kind, k)
            tasks.append(task)
            reads[task] = tuple((v, _instance(programs, v, kind, k)) for v in program.inputs)
            if not is_update(kind) and programs.accumulated((s, kind)):
                tasks.append(Task(s, "A" + kind, k))
    _check_update_order(programs)
    return TaskGraph(tuple(sorted(tasks)), reads, _transfers(programs), _activations(programs))


def _instance(programs: StagePrograms, value: str, reader: str, k: int) -> int:
    """Which micro-batch's copy of `value` a reader of kind `reader` at k reads."""
    return k if not is_update(reader) and programs.values[value].per_microbatch else STEP


def producer_task(programs: StagePrograms, value: str, microbatch: int) -> Task | None:
    """The task after which `value`'s copy for `microbatch` (STEP: the per-step copy) is
    ready; None for a parameter of the step."""
    v = programs.values[value]
    if v.producer is None:
        return None
    stage, kind = v.producer
    if is_update(kind):
        return Task(stage, kind, STEP)
    last = programs.microbatches - 1
    if microbatch != STEP:
        return Task(stage, kind, microbatch)
    if v.accumulate:
        return Task(stage, "A" + kind, last)
    if v.per_microbatch:  # the per-step copy of a per-micro-batch value: the last one
        return Task(stage, kind, last)
    return Task(stage, kind, 0)


def _transfers(programs: StagePrograms) -> tuple[Transfer, ...]:
    out = []
    m = programs.microbatches
    for v in programs.values.values():
        if v.name in programs.extra:  # the host gives it to every stage that reads it
            continue
        targets = sorted({s for s, _ in v.readers if s != v.stage})
        for t in targets:
            kinds = {kind for s, kind in v.readers if s == t}
            instances = set()
            updates = any(is_update(kind) for kind in kinds)
            if not all(is_update(kind) for kind in kinds):
                instances |= set(range(m)) if v.per_microbatch else {STEP}
            if updates and (v.accumulate or not v.per_microbatch):
                instances.add(STEP)
            elif updates:
                instances.add(m - 1)
            for k in sorted(instances):
                nbytes = v.nbytes
                out.append(
                    Transfer(v.name, k, v.stage, t, producer_task(programs, v.name, k), nbytes)
                )
    return tuple(out)


def _activations(programs: StagePrograms) -> tuple[int, ...]:
    held = [0] * programs.stages
    for v in programs.values.values():
        if v.producer and v.producer[1] == "F" and v.per_microbatch and (v.stage, "B") in v.readers:
            held[v.stage] += v.nbytes
    return tuple(held)


def _check_update_order(programs: StagePrograms) -> None:
    """Update programs may read each other's results (the step count, a shared scale);
    they must not do so in a cycle."""
    needs: dict[ProgramKey, set[ProgramKey]] = {}
    for v in programs.values.values():
        if v.producer and is_update(v.producer[1]):
            for reader in v.readers:
                if is_update(reader[1]) and reader != v.producer:
                    needs.setdefault(reader, set()).add(v.producer)
    state: dict[ProgramKey, int] = {}

    def visit(s: ProgramKey, path: list[ProgramKey]) -> None:
        if state.get(s) == 2:
            return
        if state.get(s) == 1:
            cycle = " -> ".join(f"{kind}{stage}" for stage, kind in [*path, s])
            raise ConfigError(
                f"the update programs {cycle} read each other's results "
                "in a cycle; the plan cannot be run stage by stage"
            )
        state[s] = 1
        for t in sorted(needs.get(s, ())):
            visit(t, [*path, s])
        state[s] = 2

    for s in sorted(needs):
        visit(s, [])


def schedule(programs: StagePrograms, name: str = "1f1b") -> Schedule:
    """The static schedule `name` of `programs` (module docstring)."""
    if name not in SCHEDULES:
        raise ConfigError(f"unknown schedule {name!r}; expected one of {', '.join(SCHEDULES)}")
    orders = SCHEDULES[name](programs.stages, programs.microbatches)
    actions = []
    for s, order in enumerate(orders):
        tasks = []
        for kind, k in order:
            if (s, kind) not in programs.programs:
                continue
            tasks.append(Task(s, kind, k))
            if programs.accumulated((s, kind)):
                tasks.append(Task(s, "A" + kind, k))
        updates = sorted(
            (kind for stage, kind in programs.programs if stage == s and is_update(kind)), key=len
        )
        tasks += [Task(s, kind, STEP) for kind in updates]
        actions.append(tuple(tasks))
    return Schedule(name, tuple(actions))


def stage_times(
    graph: TaskGraph, seconds: dict[Task, float], send_seconds: dict[tuple[int, int], float]
) -> StageTimes:
    """The simulator's view of a step from the time of every task (an accumulation counts
    with the task whose sums it adds) and the time to send one micro-batch's values from
    stage to stage."""
    stages = len(graph.activation_bytes)
    per: dict[tuple[int, str], list[float]] = {}
    for task, t in seconds.items():
        kind = "U" if is_update(task.kind) else task.kind[-1]
        per.setdefault((task.stage, kind), []).append(t)

    def mean(s: int, kind: str) -> float:
        times = per.get((s, kind), [])
        count = (
            len({task.microbatch for task in seconds if task.stage == s and task.kind[-1] == kind})
            if kind != "U"
            else 1
        )
        return sum(times) / count if times and count else 0.0

    return StageTimes(
        forward_s=tuple(mean(s, "F") for s in range(stages)),
        backward_s=tuple(mean(s, "B") for s in range(stages)),
        update_s=tuple(mean(s, "U") for s in range(stages)),
        send_s=dict(send_seconds),
        activation_bytes=tuple(float(b) for b in graph.activation_bytes),
    )


def run_order(programs: StagePrograms, graph: TaskGraph, table: Schedule) -> tuple[Task, ...]:
    """One order in which the whole step can run: every stage takes its next task as
    soon as the tasks that make its inputs have run (stages visited in turn). Raises
    ConfigError when the schedule cannot finish (a stage would wait for a task that
    waits for it)."""
    done: set[Task] = set()
    order: list[Task] = []
    position = [0] * len(table.actions)
    progressed = True
    while progressed:
        progressed = False
        for s, tasks in enumerate(table.actions):
            while position[s] < len(tasks):
                task = tasks[position[s]]
                needs = _needs(programs, graph, task)
                if any(n is not None and n not in done for n in needs):
                    break
                done.add(task)
                order.append(task)
                position[s] += 1
                progressed = True
    stuck = [tasks[p] for p, tasks in zip(position, table.actions, strict=True) if p < len(tasks)]
    if stuck:
        raise ConfigError(
            f"schedule {table.name} cannot finish: stage(s) wait at {', '.join(map(str, stuck))}"
        )
    return tuple(order)


def _needs(programs: StagePrograms, graph: TaskGraph, task: Task) -> list[Task | None]:
    if task.kind.startswith("A"):
        return [Task(task.stage, task.kind[-1], task.microbatch)]
    return [producer_task(programs, v, k) for v, k in graph.reads.get(task, ())]


def transfer_order(
    programs: StagePrograms, graph: TaskGraph, table: Schedule
) -> tuple[Transfer, ...]:
    """The transfers between stages, each after the task that makes it in `run_order`:
    an order two processes can both follow for the sends between them without either
    waiting on the other forever."""
    after: dict[Task, list[Transfer]] = {}
    for t in graph.transfers:
        if t.after is not None:
            after.setdefault(t.after, []).append(t)
    return tuple(t for task in run_order(programs, graph, table) for t in after.get(task, ()))
