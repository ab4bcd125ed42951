"""The loss of a training step: the scalar its gradients differentiate, from the dataflow.

A training step returns its new state (parameters, optimizer moments, RNG keys) beside
any number of scalars: the loss, the learning rate of a schedule, accuracies, metric
accumulators' results, a gradient norm. Which scalar is the loss is read from what the
step computes, never from the order of its outputs or from names:

    A          what the new state needs: the ancestors of the ROOT's non-scalar leaves
               (the new weights and moments read the gradients, and the gradients read
               the forward's residuals: activations, the softmax of a cross-entropy)
    F(c)       the ancestors of scalar c, c included: its forward
    share(c)   the dot and convolution FLOPs in F(c), over the step's
    gradient   an array computed from dots or convolutions that the optimizer reads
               (an operand of what depends on a parameter no dot or convolution
               depends on: a moment, a step count), and what makes it with its shape
               from the dot that computes it (a clipped gradient's raw gradient)
    candidate  a floating-point scalar, not computed from constants alone, that A does
               not hold (the gradients never read the loss's value), with
               0 < share(c) <= MAX_FORWARD_SHARE (a forward holds at most about a third
               to a half of a training step's heavy compute; a gradient norm holds it
               all), and no gradient in F(c) (a reported gradient norm's pieces)
    score(c)   |F(c) & A| over instructions not computed from constants alone: how much
               of the scalar's forward the gradients read. The loss's forward is read to
               its end (the cross-entropy's softmax); an accuracy's argmax is not read
    foreign    a parameter in F(c) outside A: a metric accumulator's running total that
               a metric's result reads, never the loss

The loss is the candidate of the highest score that reads no foreign parameter; of
several such (the sum of the per-example losses, the mean computed from it, the mean
times the batch that a metric adds up: the gradients read them alike), the one the step
returns, else the one all the others depend on. Two that do not depend on each other
(two objectives) are ambiguous: the step is refused with the candidates, to be named
with `loss=` (`--loss`). A named loss is checked for its share too: a forward that holds
none or nearly all of the heavy compute is no forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rhino.hlo.errors import RhinoError
from rhino.hlo.ir import Computation, Instruction
from rhino.hlo.opcode import Opcode
from rhino.hlo.shape import FLOAT_DTYPES

HEAVY = frozenset({Opcode.DOT, Opcode.CONVOLUTION})

MAX_FORWARD_SHARE = 2 / 3
"""The largest share of the step's dot and convolution FLOPs a forward may hold: the
backward computes at least an input gradient per forward product, most a weight gradient
too, so the forward holds about 1/3 (1/2 with frozen weights)."""

LISTED = 6
"""Candidates named in a refusal."""


@dataclass(frozen=True)
class LossChoice:
    """The loss found, and how it was told from the other scalars."""

    name: str
    share: float
    """Its forward's share of the step's dot and convolution FLOPs."""
    candidates: tuple[str, ...]
    """Every candidate scalar, the loss among them (best score first)."""


def find_loss(
    order: Sequence[Instruction],
    flops: Sequence[float],
    free: frozenset[str],
    named: str | None = None,
) -> LossChoice:
    """The loss of the computation whose instructions `order` lists (topological order;
    `flops` per instruction, callees included; `free` the instructions computed from
    constants alone). `named`: the loss given by the user, checked. See the module
    docstring; raises RhinoError when there is no candidate or several equally good."""
    if not order:
        raise RhinoError("empty ENTRY computation: nothing to pipeline")
    root = order[-1].parent.root if order[-1].parent else None
    assert root is not None
    index = {inst.name: k for k, inst in enumerate(order)}
    heavy = _heavy_flops(order, flops)
    total = sum(heavy.values())
    if total <= 0:
        raise RhinoError(_none_found(root, {}, order))
    positions = sorted(heavy)
    weight = [heavy[k] / total for k in positions]
    reached = _heavy_ancestors(order, index, {k: j for j, k in enumerate(positions)})

    def share_of(k: int) -> float:
        return sum(weight[j] for j in _bits(reached[k]))

    if named is not None:
        k = index[named]
        _check_share(order[k], share_of(k))
        return LossChoice(named, share_of(k), (named,))
    needed = _ancestors([leaf for leaf in _leaves(root) if not _is_scalar_float(leaf)], index)
    shares = {
        k: share_of(k)
        for k, inst in enumerate(order)
        if _is_scalar_float(inst) and reached[k] and k not in needed and inst.name not in free
    }
    gradients = _gradients(order, index, reached)
    scored = []
    for k, share in shares.items():
        inst = order[k]
        if share > MAX_FORWARD_SHARE:
            continue
        forward = _ancestors([inst], index)
        if not gradients.isdisjoint(forward):
            continue
        score = sum(1 for j in forward if j in needed and order[j].name not in free)
        foreign = any(order[j].opcode is Opcode.PARAMETER and j not in needed for j in forward)
        scored.append((score, not foreign, k, forward))
    if not scored:
        raise RhinoError(_none_found(root, shares, order))
    scored.sort(key=lambda t: (-t[0], not t[1], t[2]))
    best = [t for t in scored if t[0] == scored[0][0] and t[1] == scored[0][1]]
    names = tuple(order[t[2]].name for t in scored)
    chosen = _first_of_chain(best, {index[leaf.name] for leaf in _leaves(root)})
    if chosen is None:
        listed = ", ".join(f"%{order[t[2]].name}" for t in best[:LISTED])
        raise RhinoError(
            f"cannot tell the loss of the step: {len(best)} scalars are equally "
            f"likely ({listed}); name it with `loss`"
        )
    return LossChoice(order[chosen].name, shares[chosen], names)


def _gradients(order: Sequence[Instruction], index: dict[str, int], reached: list[int]) -> set[int]:
    """Positions of the gradients: the arrays computed from dots or convolutions that the
    optimizer reads (the operands, not themselves so computed, of what depends on a
    parameter no dot or convolution depends on: a moment, a step count, a metric total),
    and up from each, what makes it with its shape and feeds no dot or convolution (a
    clipped gradient's gradient, to the dot that makes it)."""
    reaches = [False] * len(order)  # a dot or convolution depends on it
    for k in range(len(order) - 1, -1, -1):
        reaches[k] = any(
            order[index[u.name]].opcode in HEAVY or reaches[index[u.name]]
            for u in order[k].users
            if u.name in index
        )
    optimizer = [False] * len(order)
    for k, inst in enumerate(order):
        if inst.opcode is Opcode.PARAMETER:
            optimizer[k] = not reaches[k]
        else:
            optimizer[k] = any(optimizer[index[op.name]] for op in inst.operands)
    read = [index[op.name] for k, inst in enumerate(order) if optimizer[k] for op in inst.operands]
    found: set[int] = set()
    stack = [j for j in read if not optimizer[j] and reached[j] and _is_array(order[j])]
    while stack:  # up the chain of the gradient's own shape, to the dot that makes it
        j = stack.pop()
        if j in found:
            continue
        found.add(j)
        if order[j].opcode in HEAVY:
            continue
        for op in order[j].operands:
            i = index[op.name]
            same = _is_array(op) and op.shape.dims == order[j].shape.dims
            if same and reached[i] and not reaches[i] and op.opcode is not Opcode.PARAMETER:
                stack.append(i)
    return found


def _is_array(inst: Instruction) -> bool:
    return not inst.shape.is_tuple and inst.shape.rank > 0


def _first_of_chain(best: list[tuple[int, bool, int, set[int]]], outputs: set[int]) -> int | None:
    """Of equally good candidates (score, clean, position, forward), which is the loss:
    they are one value and the scalings of it the step makes (the sum, the mean, the
    mean times the batch a metric adds up), one depending on the next. The one the step
    returns, else the first of the chain (all the others depend on it); None when they
    are no chain (two objectives)."""
    returned = [t for t in best if t[2] in outputs]
    group = returned or best
    first = [t for t in group if all(t[2] in o[3] for o in group)]
    return first[0][2] if first else None


def _check_share(inst: Instruction, share: float) -> None:
    if share <= 0 or share > MAX_FORWARD_SHARE:
        raise RhinoError(
            f"%{inst.name} cannot be the loss: its forward holds {share:.1%} of "
            "the step's dot and convolution FLOPs (a training step's forward "
            f"holds more than 0% and at most {MAX_FORWARD_SHARE:.0%})"
        )


def _none_found(root: Instruction, shares: dict[int, float], order: Sequence[Instruction]) -> str:
    seen = sorted(shares.items(), key=lambda t: t[1])[:LISTED]
    listed = ", ".join(f"%{order[k].name} ({s:.0%})" for k, s in seen)
    why = (
        f"the floating-point scalars that depend on a dot or convolution hold these shares "
        f"of its FLOPs: {listed}"
        if seen
        else "no floating-point scalar depends on a dot or convolution"
    )
    return (
        f"cannot find the loss of %{root.name}: no scalar is differentiated by the step "
        f"({why}); name it with `loss`"
    )


def _is_scalar_float(inst: Instruction) -> bool:
    shape = inst.shape
    return not shape.is_tuple and shape.rank == 0 and shape.dtype in FLOAT_DTYPES


def _leaves(root: Instruction) -> list[Instruction]:
    """The ROOT's values: the operands of its tuples, nested tuples opened."""
    if root.opcode is not Opcode.TUPLE:
        return [root]
    return [leaf for op in root.operands for leaf in _leaves(op)]


def _heavy_flops(order: Sequence[Instruction], flops: Sequence[float]) -> dict[int, float]:
    """Position -> FLOPs of every dot and convolution, and of every instruction that
    calls one (a call, a loop, a conditional, a fusion)."""
    memo: dict[str, bool] = {}
    return {
        k: flops[k]
        for k, inst in enumerate(order)
        if flops[k] > 0
        and (inst.opcode in HEAVY or any(_calls_heavy(c, memo) for c in inst.called))
    }


def _calls_heavy(comp: Computation, memo: dict[str, bool]) -> bool:
    if comp.name not in memo:
        memo[comp.name] = False  # recursion guard
        memo[comp.name] = any(
            inst.opcode in HEAVY or any(_calls_heavy(c, memo) for c in inst.called)
            for inst in comp.instructions
        )
    return memo[comp.name]


def _heavy_ancestors(
    order: Sequence[Instruction], index: dict[str, int], heavy: dict[int, int]
) -> list[int]:
    """Per position, the heavy instructions among its ancestors (itself included), as a
    bit set: bit j for the heavy instruction `heavy` numbers j."""
    reached = [0] * len(order)
    for k, inst in enumerate(order):
        bits = 1 << heavy[k] if k in heavy else 0
        for op in inst.operands:
            bits |= reached[index[op.name]]
        reached[k] = bits
    return reached


def _bits(bits: int) -> list[int]:
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return out


def _ancestors(insts: list[Instruction], index: dict[str, int]) -> set[int]:
    """Positions of `insts` and of every instruction they depend on."""
    seen = {index[i.name] for i in insts}
    stack = list(insts)
    while stack:
        for op in stack.pop().operands:
            k = index[op.name]
            if k not in seen:
                seen.add(k)
                stack.append(op)
    return seen
