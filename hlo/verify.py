"""`verify(module)`: the invariants every pass may assume and must keep.

Checks: unique names (module-wide), definition before use within a computation,
operands from the same computation, operand counts, parameter numbering, a ROOT in every
computation, and result shapes of the common opcodes. A failure raises HloVerifyError
naming the instruction and printing it with its neighbours.
"""

from __future__ import annotations

from collections.abc import Callable

from rhino.hlo.errors import HloVerifyError, RhinoError
from rhino.hlo.ir import Computation, Instruction, Module
from rhino.hlo.opcode import (
    BINARY_ELEMENTWISE,
    OPERAND_COUNT,
    TERNARY_ELEMENTWISE,
    UNARY_ELEMENTWISE,
    Opcode,
)
from rhino.hlo.printer import print_instruction
from rhino.hlo.shape import Shape

ShapeRule = Callable[[Instruction], "str | None"]


def verify(module: Module) -> None:
    """Raise HloVerifyError on the first broken invariant (with up to 4 more listed)."""
    problems: list[tuple[Instruction | None, str]] = []
    seen: dict[str, Computation] = {}
    for comp in module.computations:
        if comp.root is None:
            problems.append((None, f"computation {comp.name} has no ROOT"))
        _check_parameters(comp, problems)
        names = [inst.name for inst in comp.instructions]
        # names are checked one by one only where some clash (at C speed otherwise)
        clash = len(set(names)) != len(names) or not seen.keys().isdisjoint(names)
        defined: set[Instruction] = set()
        for inst in comp.instructions:
            if clash:
                if inst.name in seen:
                    problems.append(
                        (
                            inst,
                            f"name %{inst.name} is also used in computation {seen[inst.name].name}",
                        )
                    )
                seen[inst.name] = comp
            for op in inst.operands:
                if op not in defined or op.parent is not comp:
                    if op.parent is not comp:
                        problems.append(
                            (inst, f"operand %{op.name} belongs to another computation")
                        )
                    else:
                        problems.append((inst, f"operand %{op.name} is used before it is defined"))
            defined.add(inst)
            opcode = inst.opcode
            if opcode in OPERAND_COUNT or opcode in SHAPE_RULES:
                message = _check_instruction(inst)
                if message:
                    problems.append((inst, message))
        if not clash:
            seen.update(dict.fromkeys(names, comp))
        if len(problems) >= 5:
            break
    if problems:
        raise HloVerifyError(_report(problems))


def _check_parameters(comp: Computation, problems: list[tuple[Instruction | None, str]]) -> None:
    numbers = [i.parameter_number for i in comp.instructions if i.opcode is Opcode.PARAMETER]
    if sorted(n for n in numbers if n is not None) != list(range(len(numbers))):
        shown = sorted(numbers, key=lambda n: -1 if n is None else n)
        problems.append(
            (
                None,
                f"computation {comp.name}: parameter numbers {shown} are not 0..{len(numbers) - 1}",
            )
        )


def _check_instruction(inst: Instruction) -> str | None:
    expected = OPERAND_COUNT.get(inst.opcode)
    if expected is not None and len(inst.operands) != expected:
        return f"{inst.opcode_text} takes {expected} operands, got {len(inst.operands)}"
    rule = SHAPE_RULES.get(inst.opcode)
    if rule is None:
        return None
    try:
        return rule(inst)
    except RhinoError as e:  # a malformed attribute value
        return str(e).split("\n", 1)[0]


def _report(problems: list[tuple[Instruction | None, str]]) -> str:
    first, message = problems[0]
    lines = []
    if first is not None:
        comp = first.parent
        where = f"%{first.name} in computation {comp.name if comp else '?'}"
        span = first.span()
        if span is not None:
            where += f" ({span})"
        lines.append(f"{where}: {message}")
        if comp is not None:
            k = comp.instructions.index(first)
            for j in range(max(0, k - 2), min(len(comp.instructions), k + 3)):
                mark = ">>" if j == k else "  "
                lines.append(f"  {mark} {print_instruction(comp.instructions[j])}")
    else:
        lines.append(message)
    for inst, msg in problems[1:]:
        lines.append(f"also: %{inst.name}: {msg}" if inst else f"also: {msg}")
    return "\n".join(lines)


# -- shape rules: return a message when the result shape is wrong ----------------------
# an enum member read through its class costs ~80 ns; _elementwise reads two an instruction
_BITCAST_CONVERT, _COMPARE = Opcode.BITCAST_CONVERT, Opcode.COMPARE


def _got(inst: Instruction, dims: tuple[int, ...]) -> str | None:
    if inst.shape.dims != dims:
        return f"result shape {inst.shape} does not match the expected dims {list(dims)}"
    return None


def _elementwise(inst: Instruction) -> str | None:
    opcode = inst.opcode
    if opcode is _BITCAST_CONVERT:  # may change rank when bit widths differ
        return None
    dims = inst.shape.dims
    for op in inst.operands:
        shape = op.shape
        if shape.dims == dims and not shape.is_tuple:  # the common case, in short
            continue
        if shape.is_tuple:
            return f"operand %{op.name} is a tuple"
        if shape.dims != dims and not (opcode in (Opcode.SELECT, Opcode.CLAMP) and shape.rank == 0):
            return f"operand %{op.name} has dims {list(shape.dims)}, the result has {list(dims)}"
    if opcode is _COMPARE and inst.shape.dtype != "pred":
        return f"compare must produce pred, got {inst.shape.dtype}"
    return None


def _broadcast(inst: Instruction) -> str | None:
    dims = inst.attr("dimensions", ())
    src = inst.operands[0].shape
    if len(dims) != src.rank:
        return f"dimensions={list(dims)} has {len(dims)} entries for a rank-{src.rank} operand"
    for i, d in enumerate(dims):
        if d >= inst.shape.rank or inst.shape.dims[d] != src.dims[i]:
            return (
                f"operand dim {i} (size {src.dims[i]}) does not map to result dim {d} "
                f"of {inst.shape}"
            )
    return None


def _transpose(inst: Instruction) -> str | None:
    perm = inst.attr("dimensions", ())
    src = inst.operands[0].shape
    if sorted(perm) != list(range(src.rank)):
        return f"dimensions={list(perm)} is not a permutation of {src.rank} dims"
    return _got(inst, tuple(src.dims[p] for p in perm))


def _reshape(inst: Instruction) -> str | None:
    src = inst.operands[0].shape
    if src.numel != inst.shape.numel and not inst.shape.dynamic and not src.dynamic:
        return (
            f"reshape from {src} ({src.numel} elements) to {inst.shape} "
            f"({inst.shape.numel} elements)"
        )
    return None


def _dot(inst: Instruction) -> str | None:
    lhs, rhs = inst.operands[0].shape, inst.operands[1].shape
    lb = inst.attr("lhs_batch_dims", ())
    rb = inst.attr("rhs_batch_dims", ())
    lc = inst.attr("lhs_contracting_dims", ())
    rc = inst.attr("rhs_contracting_dims", ())
    if len(lb) != len(rb) or len(lc) != len(rc):
        return "lhs and rhs have different numbers of batch or contracting dims"
    for a, b in list(zip(lb, rb, strict=True)) + list(zip(lc, rc, strict=True)):
        if a >= lhs.rank or b >= rhs.rank or lhs.dims[a] != rhs.dims[b]:
            return f"lhs dim {a} and rhs dim {b} are paired but have different sizes"
    lfree = [d for d in range(lhs.rank) if d not in lb and d not in lc]
    rfree = [d for d in range(rhs.rank) if d not in rb and d not in rc]
    want = (
        tuple(lhs.dims[d] for d in lb)
        + tuple(lhs.dims[d] for d in lfree)
        + tuple(rhs.dims[d] for d in rfree)
    )
    return _got(inst, want)


def _get_tuple_element(inst: Instruction) -> str | None:
    src = inst.operands[0].shape
    index = inst.attr("index")
    if not src.is_tuple:
        return f"operand %{inst.operands[0].name} is not a tuple"
    if index is None or not 0 <= index < len(src.elements):
        return f"index={index} is out of range for a {len(src.elements)}-tuple"
    if _strip(src.elements[index]) != _strip(inst.shape):
        return (
            f"result shape {inst.shape} differs from tuple element {index}: {src.elements[index]}"
        )
    return None


def _tuple(inst: Instruction) -> str | None:
    if not inst.shape.is_tuple or len(inst.shape.elements) != len(inst.operands):
        return (
            f"a tuple of {len(inst.operands)} operands must have a {len(inst.operands)}-tuple shape"
        )
    for k, (e, op) in enumerate(zip(inst.shape.elements, inst.operands, strict=True)):
        if _strip(e) != _strip(op.shape):
            return f"element {k} shape {e} differs from operand %{op.name}: {op.shape}"
    return None


def _slice(inst: Instruction) -> str | None:
    sl = inst.attr("slice")
    src = inst.operands[0].shape
    if sl is None or len(sl.dims) != src.rank:
        return f"slice needs one [start:limit] per dim of {src}"
    want = []
    for (start, limit, stride), size in zip(sl.dims, src.dims, strict=True):
        if not 0 <= start <= limit <= size:
            return f"slice [{start}:{limit}] is out of bounds for a dim of size {size}"
        want.append((limit - start + stride - 1) // stride)
    return _got(inst, tuple(want))


def _concatenate(inst: Instruction) -> str | None:
    (dim,) = inst.attr("dimensions", (0,))
    total = sum(op.shape.dims[dim] for op in inst.operands)
    first = list(inst.operands[0].shape.dims)
    first[dim] = total
    return _got(inst, tuple(first))


def _reduce(inst: Instruction) -> str | None:
    n = len(inst.operands)
    if n % 2:
        return f"reduce takes inputs and as many init values, got {n} operands"
    dims = set(inst.attr("dimensions", ()))
    src = inst.operands[0].shape
    want = tuple(s for i, s in enumerate(src.dims) if i not in dims)
    results = inst.shape.elements if inst.shape.is_tuple else (inst.shape,)
    for r in results:
        if r.dims != want:
            return f"result {r} does not match the input {src} reduced over {sorted(dims)}"
    return None


def _strip(s: Shape) -> tuple[object, ...]:
    if s.is_tuple:
        return tuple(_strip(e) for e in s.elements)
    return (s.dtype, s.dims)


SHAPE_RULES: dict[Opcode, ShapeRule] = {
    **{op: _elementwise for op in UNARY_ELEMENTWISE | BINARY_ELEMENTWISE | TERNARY_ELEMENTWISE},
    Opcode.BROADCAST: _broadcast,
    Opcode.TRANSPOSE: _transpose,
    Opcode.RESHAPE: _reshape,
    Opcode.DOT: _dot,
    Opcode.GET_TUPLE_ELEMENT: _get_tuple_element,
    Opcode.TUPLE: _tuple,
    Opcode.SLICE: _slice,
    Opcode.CONCATENATE: _concatenate,
    Opcode.REDUCE: _reduce,
}
