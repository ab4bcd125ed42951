"""A training step split into forward, backward and optimizer update, from the graph alone.

Pipeline planning (Rhino §5) places forward instructions on stages and mirrors the rest:
the backward of forward stage s runs on stage s's devices, and a parameter's update runs
where the parameter lives. This module finds which instruction is which, and builds the
forward graph the stage ILP works on.

Roles, from the dataflow of the ENTRY computation (names and metadata such as
`transpose(jvp(...))` are not read):
    loss      the scalar the gradients differentiate (`rhino.search.pipeline.loss`: the
              step's other scalars are learning rates, metrics, gradient norms);
              `loss=` overrides
    forward   the loss and its ancestors
    state     entry parameters that are not forward (optimizer moments, step count)
    update    every other instruction that depends on a state parameter (the new
              parameters and moments are computed from the moments)
    backward  every other instruction (the gradients)
    output    the ROOT tuple, which only gathers results
An instruction is *free* when it is not a parameter and all its operands are free
(constants, iotas and what is computed from them alone): every stage that reads it
recomputes it, so it is never sent and takes no part in the stage ILP.

A forward parameter with an update user is a *weight* (its new value is computed from
it); any other forward parameter is *data* (tokens, labels): what depends on data is
per micro-batch, what depends on weights alone is computed once per step.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rhino.hlo.analysis import CostWalker, topological_order
from rhino.hlo.errors import ConfigError
from rhino.hlo.ir import Instruction, Module
from rhino.hlo.opcode import Opcode
from rhino.search.pipeline.loss import find_loss


class Role(enum.Enum):
    FORWARD = "forward"
    BACKWARD = "backward"
    UPDATE = "update"
    STATE = "state"
    OUTPUT = "output"


@dataclass(frozen=True, eq=False)
class StepSplit:
    """The ENTRY computation of a training step, in topological order, with roles."""

    order: tuple[Instruction, ...]
    """Instructions of the ENTRY computation, operands before users."""
    index: dict[str, int]
    """Instruction name -> position in `order`."""
    loss: str
    """Name of the loss instruction."""
    roles: tuple[Role, ...]
    """Role of each instruction of `order`."""
    free: frozenset[str]
    """Instructions computed from constants alone (recomputed wherever read)."""
    flops: tuple[float, ...]
    """FLOPs of each instruction (called computations and loop trips included)."""
    per_microbatch: frozenset[str]
    """Instructions that depend on a data parameter (split by micro-batch)."""
    weights: frozenset[str]
    """Forward parameters that the update rewrites (the model's weights)."""
    forward_share: float = 0.0
    """The forward's share of the step's dot and convolution FLOPs."""

    def role(self, name: str) -> Role:
        return self.roles[self.index[name]]

    def count(self, role: Role) -> int:
        return sum(1 for r in self.roles if r is role)


def split_step(module: Module, loss: str | None = None) -> StepSplit:
    """Roles of the ENTRY computation's instructions (see the module docstring).

    Raises RhinoError when no loss can be found, or `loss` names no instruction.
    """
    entry = module.entry
    order = tuple(topological_order(entry))
    index = {inst.name: k for k, inst in enumerate(order)}
    walker = CostWalker(module)
    flops = tuple(walker.instruction_cost(inst)[0] for inst in order)
    if loss is not None:
        _named_loss(entry.get(loss), loss, entry.name)
    free = _free(order)
    choice = find_loss(order, flops, free, loss)
    loss_inst = order[index[choice.name]]
    forward = ancestors(loss_inst)
    params = [i for i in order if i.opcode is Opcode.PARAMETER]
    state = {i.name for i in params if i.name not in forward}
    tainted = _descendants(order, state)
    roles = []
    for inst in order:
        if inst.name in forward:
            roles.append(Role.FORWARD)
        elif inst.name in state:
            roles.append(Role.STATE)
        elif inst is entry.root and inst.opcode is Opcode.TUPLE:
            roles.append(Role.OUTPUT)
        elif inst.name in tainted:
            roles.append(Role.UPDATE)
        else:
            roles.append(Role.BACKWARD)
    weights = frozenset(
        p.name for p in params if p.name in forward and any(u.name in tainted for u in p.users)
    )
    data = {p.name for p in params if p.name in forward and p.name not in weights}
    return StepSplit(
        order,
        index,
        loss_inst.name,
        tuple(roles),
        free,
        flops,
        frozenset(_descendants(order, data)),
        weights,
        choice.share,
    )


def state_scalars(split: StepSplit) -> frozenset[str]:
    """Update scalars computed from optimizer state and constants alone (a step count,
    Adam's bias corrections, a scheduled learning rate): every stage whose update reads
    one recomputes it from the state, rather than receive it (sent, they would make the
    stages' updates wait on each other, in a cycle when two stages each compute one the
    other reads)."""
    found: set[str] = set()
    for k, inst in enumerate(split.order):
        if split.roles[k] is not Role.UPDATE or inst.shape.is_tuple or inst.shape.rank:
            continue
        if all(
            op.name in found or op.name in split.free or split.role(op.name) is Role.STATE
            for op in inst.operands
        ):
            found.add(inst.name)
    return frozenset(found)


def _named_loss(inst: Instruction | None, name: str, entry: str) -> Instruction:
    if inst is None:
        raise ConfigError(
            f"loss {name}: no instruction %{name} in the ENTRY computation {entry}", "loss"
        )
    return inst


def ancestors(inst: Instruction) -> set[str]:
    """`inst` and every instruction it depends on (operands, transitively)."""
    seen = {inst.name}
    stack = [inst]
    while stack:
        for op in stack.pop().operands:
            if op.name not in seen:
                seen.add(op.name)
                stack.append(op)
    return seen


def _descendants(order: tuple[Instruction, ...], sources: set[str]) -> set[str]:
    """`sources` and every instruction that depends on one of them."""
    found = set(sources)
    for inst in order:
        if inst.name not in found and any(op.name in found for op in inst.operands):
            found.add(inst.name)
    return found


def _free(order: tuple[Instruction, ...]) -> frozenset[str]:
    free: set[str] = set()
    for inst in order:
        if inst.opcode in (Opcode.PARAMETER, Opcode.RNG) or inst.opcode.value.startswith("rng"):
            continue
        if all(op.name in free for op in inst.operands) and not inst.control_predecessors:
            free.add(inst.name)
    return frozenset(free)


# -- the forward graph the stage ILP works on -----------------------------------------------


@dataclass(frozen=True)
class ForwardGraph:
    """Forward, non-free instructions: what the stage ILP places."""

    names: tuple[str, ...]
    """Instruction names, in topological order."""
    compute: tuple[float, ...]
    """Seconds of each (FLOPs over the device's rate for its element type)."""
    bytes: tuple[int, ...]
    """Bytes of each one's result."""
    consumers: tuple[tuple[int, ...], ...]
    """For each, the indices of the forward instructions that read it."""


def forward_graph(split: StepSplit, flops_per_second: dict[str, float]) -> ForwardGraph:
    """The forward graph of `split`; compute in seconds at `flops_per_second[dtype]`
    (the "f32" rate for an element type that is not listed)."""
    keep = [
        k
        for k, inst in enumerate(split.order)
        if split.roles[k] is Role.FORWARD and inst.name not in split.free
    ]
    position = {split.order[k].name: n for n, k in enumerate(keep)}
    fallback = flops_per_second["f32"]
    compute, sizes, consumers = [], [], []
    for k in keep:
        inst = split.order[k]
        rate = flops_per_second.get(_dtype(inst), fallback)
        compute.append(split.flops[k] / rate)
        sizes.append(inst.shape.byte_size)
        users = sorted({position[u.name] for u in inst.users if u.name in position})
        consumers.append(tuple(users))
    return ForwardGraph(
        tuple(split.order[k].name for k in keep), tuple(compute), tuple(sizes), tuple(consumers)
    )


def _dtype(inst: Instruction) -> str:
    leaves = inst.shape.leaves()
    return leaves[0].dtype if leaves else "f32"


# -- mirroring the forward plan ---------------------------------------------------------


def mirror(split: StepSplit, forward_stage: dict[str, int], stages: int) -> tuple[int, ...]:
    """A stage for every instruction of `split.order`, given the forward instructions'
    stages (every forward, non-free one): see `rhino.search.pipeline` for the rules."""
    order, index, roles = split.order, split.index, split.roles
    stage: list[int | None] = [forward_stage.get(inst.name) for inst in order]
    holds: dict[int, int] = {}  # forward instruction -> the latest stage holding its result
    for k, inst in enumerate(order):
        if roles[k] is Role.FORWARD and stage[k] is not None:
            readers = [stage[index[u.name]] for u in inst.users if u.name in forward_stage]
            holds[k] = max([stage[k] or 0, *(r for r in readers if r is not None)])
    for k, inst in enumerate(order):
        if stage[k] is None and roles[k] is Role.BACKWARD and inst.name not in split.free:
            stage[k] = _backward_stage(inst, index, stage, holds, roles)
    _place_updates(split, stage)
    loss_stage = stage[index[split.loss]]
    for k in range(len(order) - 1, -1, -1):  # unplaced: with their earliest reader
        if stage[k] is None:
            if roles[k] is Role.OUTPUT:
                stage[k] = loss_stage if loss_stage is not None else stages - 1
                continue
            readers = [stage[index[u.name]] for u in order[k].users]
            stage[k] = min((r for r in readers if r is not None), default=0)
    return tuple(s if s is not None else 0 for s in stage)


def _backward_stage(
    inst: Instruction,
    index: dict[str, int],
    stage: list[int | None],
    holds: dict[int, int],
    roles: tuple[Role, ...],
) -> int | None:
    anchor: int | None = None
    ceiling: int | None = None
    for op in inst.operands:
        k = index[op.name]
        if k in holds:
            anchor = holds[k] if anchor is None else max(anchor, holds[k])
        elif roles[k] is Role.BACKWARD:
            s = stage[k]
            if s is not None:
                ceiling = s if ceiling is None else min(ceiling, s)
    if anchor is None:
        return ceiling
    return anchor if ceiling is None else min(anchor, ceiling)


def _place_updates(split: StepSplit, stage: list[int | None]) -> None:
    """Update instructions: one that reads a weight goes to the weight's stage; then,
    latest first, one whose update readers are placed goes to the earliest of theirs; the
    rest to the stage of their largest placed operand (ties: the earliest stage)."""
    order, index, roles = split.order, split.index, split.roles
    updates = [
        k for k in range(len(order)) if roles[k] is Role.UPDATE and order[k].name not in split.free
    ]
    for k in updates:
        weights = [stage[index[op.name]] for op in order[k].operands if op.name in split.weights]
        if weights:
            stage[k] = min(s for s in weights if s is not None)
    for k in reversed(updates):
        if stage[k] is None:
            readers = [
                stage[index[u.name]] for u in order[k].users if roles[index[u.name]] is Role.UPDATE
            ]
            stage[k] = min((r for r in readers if r is not None), default=None)
    for k in updates:
        if stage[k] is None:
            placed = [
                (op.shape.byte_size, stage[index[op.name]])
                for op in order[k].operands
                if stage[index[op.name]] is not None
            ]
            if placed:
                stage[k] = min(placed, key=lambda t: (-t[0], t[1] or 0))[1]
