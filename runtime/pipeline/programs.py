"""A stage plan cut into programs: per stage a forward, a backward and an update program
(Rhino §6.1), each an HLO module of its own, compiled once and run for every micro-batch.

    stage_programs(module, stage_plan, m) -> StagePrograms

From the module (calls inlined, `flat_step`) rewritten for one micro-batch
(`microbatch`), every ENTRY instruction goes to one program:

    (s, "F")  role forward on stage s      run per micro-batch
    (s, "B")  role backward on stage s     run per micro-batch
    (s, "U")  computed once per step (the optimizer update, and anything that uses a sum
              over the batch non-linearly), on stage s; reads the sums accumulated over
              the micro-batches
The stage of an inlined instruction is the stage the plan gave its call. Free
instructions (from constants alone) and the batch-independent copies the micro-batch
rewrite makes are recomputed in every program that reads them; so are the update's
scalars computed from optimizer state alone (the step count, Adam's bias correction),
which every stage's update reads: sent, they would make the stages' updates wait on
each other, in a cycle when two stages each compute one the other reads. A program's parameters
are the values it reads from other programs or from the step's parameters; its results
(a tuple) are the values other programs or the step's ROOT read.

A value is one result of one program (or a step parameter), known by its instruction
name. `per_microbatch` values differ between micro-batches and are sent for each; the
others are sent once per step. `accumulate` values are partial sums over the batch that
a once-per-step reader (an update program, the step's outputs) reads summed over all
micro-batches: the local accumulation (LA) tasks of Rhino §6.1 add them up on the stage
that makes them, with the `accumulate_text` program of that stage.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rhino.hlo.errors import ConfigError
from rhino.hlo.ir import Computation, Instruction, Module
from rhino.hlo.opcode import Opcode
from rhino.hlo.printer import print_computation, print_instruction
from rhino.hlo.shape import Shape
from rhino.runtime.pipeline.microbatch import (
    PARTIAL,
    STEP,
    BatchFacts,
    batch_facts,
    flat_step,
    input_groups,
)
from rhino.runtime.pipeline.rewrite import microbatch_module, slice_rows
from rhino.search.mesh import DeviceMesh
from rhino.search.pipeline import PipelinePlan, ScheduleReport, is_stage_plan_doc
from rhino.search.pipeline.split import Role, StepSplit, split_step, state_scalars

KINDS = ("F", "B", "U")
"""Forward, backward, update: the programs of a stage, in the order a step runs them. An
update that reads another stage's update result runs as a later update program, "UU"
(then "UUU", ...): the levels keep the updates' reads of each other free of cycles (a
global gradient norm: every stage's squares, summed on one, read by all)."""


def is_update(kind: str) -> bool:
    """Is `kind` an update program's ("U", "UU", ...)?"""
    return kind.startswith("U")


ProgramKey = tuple[int, str]
"""(stage, kind)."""


@dataclass(frozen=True)
class StagePlan:
    """What the runtime reads of a `rhino pipeline --out` plan."""

    module: str
    """Name of the module it was made for."""
    stages: int
    microbatches: int
    """The micro-batches it was planned for (a run may choose another count)."""
    stage: dict[str, int]
    """ENTRY instruction name -> stage."""
    sent_bytes: dict[tuple[int, int], int]
    """(from, to) -> bytes per step the plan predicts."""
    schedules: dict[str, ScheduleReport]
    """Schedule name -> the plan's predicted step, bubble and peak activations."""
    mesh: DeviceMesh | None = None
    """Hybrid: the mesh the plan was made for (stages on axis 0), or None."""
    loss: str | None = None
    """The loss the plan found or was given (`rhino pipeline --loss`)."""

    @staticmethod
    def of(plan: PipelinePlan) -> StagePlan:
        """What the runtime reads of `plan`."""
        return StagePlan(
            module=plan.module,
            stages=plan.stages,
            microbatches=plan.microbatches,
            stage={i.name: i.stage for i in plan.instructions},
            sent_bytes={
                (r.stage, int(t)): b for r in plan.stage_reports for t, b in r.sent_bytes.items()
            },
            schedules=dict(plan.schedules),
            mesh=plan.mesh,
            loss=plan.loss or None,
        )

    @staticmethod
    def from_json(doc: Any, where: str = "the stage plan") -> StagePlan:
        return StagePlan.of(PipelinePlan.from_json(doc, where))

    @staticmethod
    def read(path: str | Path) -> StagePlan:
        return StagePlan.of(PipelinePlan.read(path))


def is_stage_plan(path: str | Path) -> bool:
    """Is the JSON file at `path` a stage plan (rather than a sharding plan)? False when
    it cannot be read as JSON (the sharding plan's reader then says why)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return is_stage_plan_doc(doc)


@dataclass(frozen=True)
class Program:
    """One stage's forward, backward or update: an HLO module of its own."""

    stage: int
    kind: str
    """"F", "B", "U" (or a later update level, "UU", ...)."""
    text: str
    """HLO text, shapes of one micro-batch; its ROOT is the tuple of `outputs`."""
    inputs: tuple[str, ...]
    """The values it reads, in parameter order."""
    outputs: tuple[str, ...]
    """The values it makes for other programs or the step's outputs, in result order."""
    instructions: int
    """ENTRY instructions it computes (parameters and the result tuple not counted)."""

    @property
    def key(self) -> ProgramKey:
        return (self.stage, self.kind)


@dataclass(frozen=True)
class Value:
    """A tensor that crosses from one program to another (or from the step's inputs)."""

    name: str
    """The instruction that makes it."""
    producer: ProgramKey | None
    """The program that makes it; None for a parameter of the step."""
    stage: int
    """Where it is made (a parameter: where the plan put it)."""
    shape: Shape
    """One micro-batch's shape."""
    per_microbatch: bool
    accumulate: bool
    readers: tuple[ProgramKey, ...]

    @property
    def nbytes(self) -> int:
        return self.shape.byte_size


@dataclass(frozen=True)
class StagePrograms:
    """The programs of a stage plan, and the values that flow between them."""

    module: str
    stages: int
    microbatches: int
    batch: int
    """Examples per step (dimension 0 of the data parameters); B / m per micro-batch."""
    programs: dict[ProgramKey, Program]
    """Only the programs that compute something."""
    values: dict[str, Value]
    parameters: tuple[str, ...]
    """The step's parameters in parameter order (value names)."""
    data: frozenset[str]
    """Parameters split into micro-batches along dimension 0."""
    outputs: tuple[str, ...]
    """The step's results (its ROOT tuple) as value names."""
    accumulate_text: dict[ProgramKey, str]
    """Per program making accumulated values: an HLO module adding two sets of them."""
    extra: dict[str, str | None] = dataclasses.field(default_factory=dict)
    """Parameters of the programs after the step's own (`BatchFacts.inputs`): name -> the
    step parameter whose whole value it is, or None for the rows of the batch a
    micro-batch holds (s32[B/m], split like the data). The host gives them to every
    stage that reads them; they are never sent between stages."""

    def extra_inputs(self, inputs: dict[str, Any]) -> list[Any]:
        """The values of `extra`, from the step's parameters `inputs` (name -> array)."""
        rows = np.arange(self.batch, dtype=np.int32)
        return [rows if source is None else inputs[source] for source in self.extra.values()]

    def accumulated(self, key: ProgramKey) -> tuple[str, ...]:
        """The accumulated outputs of program `key`, in its result order."""
        program = self.programs[key]
        return tuple(v for v in program.outputs if self.values[v].accumulate)


def stage_programs(module: Module, plan: StagePlan, microbatches: int) -> StagePrograms:
    """Cut `module` (as parsed; the plan was made on it) into the programs of `plan` for
    `microbatches` micro-batches (see the module docstring). Raises ConfigError when the
    plan is for another module, or the step cannot be cut into that many micro-batches."""
    if plan.module != module.name:
        raise ConfigError(
            f"the stage plan was made for module {plan.module}, not {module.name}: "
            "a stage plan for another module"
        )
    flat, origin = flat_step(module)
    named = plan.loss if plan.loss and flat.entry.get(plan.loss) is not None else None
    split = split_step(flat, named)
    stage_of = _stages(flat, origin, plan)
    facts = batch_facts(flat, split, microbatches) if microbatches > 1 else _whole_batch(split)
    copies: dict[str, str] = {}
    cut = microbatch_module(flat, facts, copies)
    for copy, original in copies.items():
        stage_of[copy] = stage_of[original]
    for name, source in facts.inputs.items():  # given to every stage that reads them
        stage_of[name] = 0
        if source is None:  # the micro-batch's rows
            facts = dataclasses.replace(facts, data=(*facts.data, name))
    home = _homes(cut, split, facts, stage_of, copies)
    shared = state_scalars(split)
    _update_levels(cut, home, shared)
    programs = _assemble(module.name, cut, split, facts, stage_of, home, shared, plan.stages)
    return dataclasses.replace(programs, extra=dict(facts.inputs))


def _stages(flat: Module, origin: dict[str, str], plan: StagePlan) -> dict[str, int]:
    stage = {}
    missing = []
    for inst in flat.entry.instructions:
        name = origin.get(inst.name, inst.name)
        if name in plan.stage:
            stage[inst.name] = plan.stage[name]
        else:
            missing.append(name)
    if missing:
        raise ConfigError(
            f"the stage plan has no stage for {len(missing)} instruction(s) of "
            f"{flat.name} (%{missing[0]}, ...): a stage plan for another module"
        )
    bad = sorted({s for s in stage.values() if not 0 <= s < plan.stages})
    if bad:
        raise ConfigError(
            f"the stage plan places instructions on stage(s) {bad}, outside 0..{plan.stages - 1}"
        )
    return stage


def _whole_batch(split: StepSplit) -> BatchFacts:
    """One micro-batch: nothing to cut; the update (and what it alone reads) once per step."""
    state = {
        inst.name: STEP if split.roles[k] is Role.UPDATE else None
        for k, inst in enumerate(split.order)
    }
    groups = input_groups(split)
    data = groups[0] if groups else []
    batch = data[0].shape.dims[0] if data else 1
    return BatchFacts(batch, 1, tuple(p.name for p in data), dict(state))


def _homes(
    cut: Module,
    split: StepSplit,
    facts: BatchFacts,
    stage_of: dict[str, int],
    copies: dict[str, str],
) -> dict[str, ProgramKey]:
    """The program of every instruction that has one (not parameters, the ROOT tuple and
    free instructions: those are recomputed). A micro-batch copy of a batch-independent
    value is made where the value is (and sent for each micro-batch, as the value's rows
    would be); copies of what has no program are recomputed too."""
    home: dict[str, ProgramKey] = {}
    late = _late_sums(cut, split, facts, stage_of) if facts.microbatches > 1 else set()
    for inst in cut.entry.instructions:
        original = copies.get(inst.name)
        if original is not None:
            if home.get(original, (0, ""))[1] == "F":  # read by later forwards, or backwards
                home[inst.name] = home[original]
            continue
        if inst.name not in split.index or inst.name in split.free:
            continue
        role = split.role(inst.name)
        if inst.opcode is Opcode.PARAMETER or role is Role.OUTPUT:
            continue
        if facts.state[inst.name] == STEP or inst.name in late:
            kind = "U"
        else:
            kind = "F" if role is Role.FORWARD else "B"
        home[inst.name] = (stage_of[inst.name], kind)
    _slice_where_whole(cut, facts, copies, home, stage_of)
    return home


def _slice_where_whole(
    cut: Module,
    facts: BatchFacts,
    copies: dict[str, str],
    home: dict[str, ProgramKey],
    stage_of: dict[str, int],
) -> None:
    """A stage that reads a batch-independent value whole makes its micro-batch copy
    itself, sliced from the value (the copy loses its home), rather than receive the
    value twice. Copies are visited readers first: where a copy is made is where its
    readers are."""
    made: dict[str, set[int]] = {}  # copy -> the stages that make it

    def stages(users: Iterable[Instruction]) -> set[int]:
        out: set[int] = set()
        for u in users:
            out |= made.get(u.name) or {home[u.name][0] if u.name in home else stage_of[u.name]}
        return out

    for copy in reversed(list(copies)):
        if copy not in home:  # recomputed where it is read
            made[copy] = stages(cut.entry[copy].users)
            continue
        original = cut.entry[copies[copy]]
        rows = stages(cut.entry[copy].users)
        if (rows - {home[copy][0]}) & stages(original.users):
            del home[copy]
            made[copy] = rows
            if slice_rows(cut, facts, cut.entry[copy], original):
                cut.entry.remove(cut.entry[copy])
        else:
            made[copy] = {home[copy][0]}


def _update_levels(cut: Module, home: dict[str, ProgramKey], shared: frozenset[str]) -> None:
    """Update instructions that read another stage's update result (directly or through
    their own stage's) move to a later update program of their stage (`KINDS`): one
    level more than the latest such read. Recomputed scalars are no reads."""
    level: dict[str, int] = {}
    for inst in cut.entry.instructions:
        key = home.get(inst.name)
        if key is None or not is_update(key[1]):
            continue
        n = 0
        for op in inst.operands:
            source = home.get(op.name)
            if source is None or op.name in shared or not is_update(source[1]):
                continue
            n = max(n, level[op.name] + (source[0] != key[0]))
        level[inst.name] = n
        home[inst.name] = (key[0], "U" * (n + 1))


def _late_sums(
    cut: Module, split: StepSplit, facts: BatchFacts, stage_of: dict[str, int]
) -> set[str]:
    """Sums over the batch computed from sums alone (batch-independent values aside) and
    read only once per step, on their own stage: computed once, in the update program,
    from the micro-batches' accumulated sums (they are linear in them), not once per
    micro-batch. A gradient that is the sum of two stages' parts (a tied embedding's) is
    then sent once per step, as the stage plan counts it, not once per micro-batch. (Read
    by another stage's update, it would make the updates wait on each other.)"""
    root = cut.entry.root
    late: set[str] = set()
    for inst in reversed(cut.entry.instructions):
        name = inst.name
        if name not in split.index or name in split.free or facts.state.get(name) != PARTIAL:
            continue
        if inst.opcode is Opcode.PARAMETER:
            continue
        if any(facts.state.get(op.name) not in (PARTIAL, None) for op in inst.operands):
            continue
        if all(
            u is root
            or (u.name in late or facts.state.get(u.name) == STEP)
            and stage_of[u.name] == stage_of[name]
            for u in inst.users
        ):
            late.add(name)
    return late


def _assemble(
    name: str,
    cut: Module,
    split: StepSplit,
    facts: BatchFacts,
    stage_of: dict[str, int],
    home: dict[str, ProgramKey],
    shared: frozenset[str],
    stages: int,
) -> StagePrograms:
    entry = cut.entry
    root = entry.root
    assert root is not None
    members: dict[ProgramKey, list[Instruction]] = {}
    for inst in entry.instructions:
        if inst.name in home:
            members.setdefault(home[inst.name], []).append(inst)
    sent = {n: k for n, k in home.items() if n not in shared}
    inputs = {key: _inputs(insts, sent) for key, insts in members.items()}
    outputs = _outputs(members, inputs, home, root)
    values = _values(cut, split, facts, stage_of, home, inputs, root)
    programs = {
        key: _program(name, cut, key, members[key], inputs[key], outputs[key])
        for key in sorted(members)
        if outputs[key]
    }
    accumulate = {}
    for key, program in programs.items():
        summed = [v for v in program.outputs if values[v].accumulate]
        if summed:
            accumulate[key] = _accumulate_text(name, key, [values[v] for v in summed])
    params = tuple(p.name for p in entry.parameters)
    step_outputs = (
        tuple(op.name for op in root.operands) if root.opcode is Opcode.TUPLE else (root.name,)
    )
    return StagePrograms(
        name,
        stages,
        facts.microbatches,
        facts.batch,
        programs,
        values,
        params,
        frozenset(facts.data),
        step_outputs,
        accumulate,
    )


def _inputs(insts: list[Instruction], home: dict[str, ProgramKey]) -> tuple[str, ...]:
    """What a program reads from elsewhere: operands made by another program or given to
    the step, looking through the instructions it recomputes."""
    own = {i.name for i in insts}
    seen: set[str] = set()
    found: list[str] = []
    stack = [op for inst in insts for op in reversed(inst.operands)]
    stack.reverse()
    while stack:
        op = stack.pop()
        if op.name in own or op.name in seen:
            continue
        seen.add(op.name)
        if op.name in home or op.opcode is Opcode.PARAMETER:
            found.append(op.name)
        else:  # recomputed here
            stack.extend(reversed(op.operands))
    return tuple(found)


def _outputs(
    members: dict[ProgramKey, list[Instruction]],
    inputs: dict[ProgramKey, tuple[str, ...]],
    home: dict[str, ProgramKey],
    root: Instruction,
) -> dict[ProgramKey, tuple[str, ...]]:
    read = {v for key, names in inputs.items() for v in names}
    results = root.operands if root.opcode is Opcode.TUPLE else [root]
    for op in results:
        if op.name not in home and op.opcode is not Opcode.PARAMETER:
            raise ConfigError(
                f"the step's output %{op.name} is computed from constants alone; "
                "rhino pipelines only steps whose outputs are computed values or "
                "parameters"
            )
        read.add(op.name)
    return {key: tuple(i.name for i in insts if i.name in read) for key, insts in members.items()}


def _values(
    cut: Module,
    split: StepSplit,
    facts: BatchFacts,
    stage_of: dict[str, int],
    home: dict[str, ProgramKey],
    inputs: dict[ProgramKey, tuple[str, ...]],
    root: Instruction,
) -> dict[str, Value]:
    readers: dict[str, list[ProgramKey]] = {}
    for key in sorted(inputs):
        for v in inputs[key]:
            readers.setdefault(v, []).append(key)
    results = {op.name for op in (root.operands if root.opcode is Opcode.TUPLE else [root])}
    values = {}
    for name in sorted(set(readers) | results, key=lambda n: (split.index.get(n, -1), n)):
        inst = cut.entry[name]
        if inst.shape.is_tuple:
            raise ConfigError(
                f"%{name} crosses from one stage program to another but is a "
                "tuple; rhino sends only arrays between programs"
            )
        producer = home.get(name)
        per_step = producer is not None and is_update(producer[1])
        once = any(is_update(k[1]) for k in readers.get(name, ())) or name in results
        if producer is None:
            varies = name in facts.data
        else:
            copy = name not in facts.state  # a micro-batch copy of a batch-independent value
            varies = (copy or facts.per_microbatch(name)) and not per_step
        values[name] = Value(
            name=name,
            producer=producer,
            stage=stage_of[name],
            shape=inst.shape,
            per_microbatch=varies,
            accumulate=varies and once and facts.state.get(name) == PARTIAL,
            readers=tuple(readers.get(name, ())),
        )
    return values


def _program(
    module: str,
    cut: Module,
    key: ProgramKey,
    insts: list[Instruction],
    inputs: tuple[str, ...],
    outputs: tuple[str, ...],
) -> Program:
    """The HLO text of one program: its inputs as parameters, what it computes (and
    recomputes), and the tuple of its outputs."""
    entry = cut.entry
    own = {i.name for i in insts}
    needed = _recomputed(insts, own, set(inputs))
    body = [i for i in entry.instructions if i.name in own or i.name in needed]
    pct = "%" if cut.percent_names else ""
    lines = [f"  {pct}{v} = {entry[v].shape} parameter({k})" for k, v in enumerate(inputs)]
    lines += ["  " + print_instruction(i, pct) for i in body]
    shapes = ", ".join(str(entry[v].shape) for v in outputs)
    args = ", ".join(pct + v for v in outputs)
    lines.append(f"  ROOT {pct}{entry.unused_name('outputs')} = ({shapes}) tuple({args})")
    stage, kind = key
    called = _called(cut, body)
    text = "\n\n".join(
        [f"HloModule {module}_stage{stage}_{kind}"]
        + [print_computation(c, pct) for c in called]
        + [f"ENTRY {pct}main {{\n" + "\n".join(lines) + "\n}"]
    )
    return Program(stage, kind, text + "\n", inputs, outputs, len(own))


def _recomputed(insts: list[Instruction], own: set[str], inputs: set[str]) -> set[str]:
    needed: set[str] = set()
    stack = [op for inst in insts for op in inst.operands]
    while stack:
        op = stack.pop()
        if op.name in own or op.name in inputs or op.name in needed:
            continue
        needed.add(op.name)
        stack.extend(op.operands)
    return needed


def _called(module: Module, body: list[Instruction]) -> list[Computation]:
    """The computations `body` calls, transitively, in the module's (callee-first) order."""
    reached: set[str] = set()
    stack = [c for inst in body for c in inst.called]
    while stack:
        comp = stack.pop()
        if comp.name not in reached:
            reached.add(comp.name)
            stack.extend(c for inst in comp.instructions for c in inst.called)
    return [c for c in module.computations if c.name in reached]


def accumulate_program(
    programs: StagePrograms, key: ProgramKey, layouts: list[str] | None = None
) -> str:
    """The accumulation of program `key`'s sums; with `layouts` (an HloSharding text per
    sum, e.g. the layouts the program's results came out in), sums and micro-batch
    values are added in those layouts."""
    return _accumulate_text(
        programs.module, key, [programs.values[v] for v in programs.accumulated(key)], layouts
    )


def _accumulate_text(
    module: str, key: ProgramKey, values: list[Value], layouts: list[str] | None = None
) -> str:
    """An HLO module whose parameters are the running sums then one micro-batch's
    values, and whose result is their element-wise sums, in `values` order."""
    n = len(values)
    where = [f", sharding={x}" for x in layouts] if layouts else [""] * n
    lines = [f"  sum{k} = {v.shape} parameter({k}){where[k]}" for k, v in enumerate(values)]
    lines += [f"  part{k} = {v.shape} parameter({n + k}){where[k]}" for k, v in enumerate(values)]
    lines += [f"  add{k} = {v.shape} add(sum{k}, part{k}){where[k]}" for k, v in enumerate(values)]
    shapes = ", ".join(str(v.shape) for v in values)
    root = f", sharding={{{', '.join(layouts)}}}" if layouts else ""
    lines.append(f"  ROOT sums = ({shapes}) tuple({', '.join(f'add{k}' for k in range(n))}){root}")
    stage, kind = key
    return (
        f"HloModule {module}_stage{stage}_{kind}_accumulate\n\nENTRY main {{\n"
        + "\n".join(lines)
        + "\n}\n"
    )
