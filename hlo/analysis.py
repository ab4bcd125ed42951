"""Graph facts the planner reads: order, FLOPs, bytes, loops, and a module summary.

All functions are pure: they read a Module and return facts, never change it.
FLOPs count a multiply-add as 2 (as papers quoting MFU do); an element-wise op costs
one FLOP per output element; data movement ops cost none.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from collections import Counter
from dataclasses import dataclass, field

from rhino.hlo.errors import RhinoError
from rhino.hlo.ir import Computation, Instruction, Module
from rhino.hlo.opcode import ELEMENTWISE, Opcode

# -- order -----------------------------------------------------------------------------


def topological_order(comp: Computation) -> list[Instruction]:
    """Instructions with every operand and control predecessor before its users.

    Ties keep definition order, so a well-formed computation comes back unchanged.
    """
    index = {id(i): k for k, i in enumerate(comp.instructions)}
    indegree: dict[int, int] = {}
    succs: dict[int, list[Instruction]] = {id(i): [] for i in comp.instructions}
    for inst in comp.instructions:
        preds = {id(p): p for p in (*inst.operands, *inst.control_predecessors) if id(p) in index}
        indegree[id(inst)] = len(preds)
        for p in preds.values():
            succs[id(p)].append(inst)
    import heapq

    ready = [(index[id(i)], i) for i in comp.instructions if indegree[id(i)] == 0]
    heapq.heapify(ready)
    order: list[Instruction] = []
    while ready:
        _, inst = heapq.heappop(ready)
        order.append(inst)
        for s in succs[id(inst)]:
            indegree[id(s)] -= 1
            if indegree[id(s)] == 0:
                heapq.heappush(ready, (index[id(s)], s))
    if len(order) != len(comp.instructions):
        raise RhinoError(f"computation {comp.name} has a cycle")
    return order


# -- per-instruction cost ---------------------------------------------------------------


def _prod(xs: Iterable[int]) -> int:
    return math.prod(xs)


def _dot_flops(inst: Instruction) -> float:
    lhs = inst.operands[0].shape
    contracting = _prod(lhs.dims[d] for d in inst.attr("lhs_contracting_dims", ()))
    return 2.0 * inst.shape.numel * contracting


def _conv_flops(inst: Instruction) -> float:
    labels = inst.attr("dim_labels")
    rhs = inst.operands[1].shape
    if labels is None:
        return 2.0 * inst.shape.numel * rhs.numel / max(1, rhs.dims[-1] if rhs.rank else 1)
    kernel_spatial = _prod(rhs.dims[d] for d in labels.kernel_spatial)
    in_features = rhs.dims[labels.kernel_input_feature]
    return 2.0 * inst.shape.numel * kernel_spatial * in_features


def _reduce_flops(inst: Instruction) -> float:
    n_inputs = len(inst.operands) // 2
    return float(sum(op.shape.numel for op in inst.operands[:n_inputs]))


def _reduce_window_flops(inst: Instruction) -> float:
    window = inst.attr("window")
    size = _prod(d.size for d in window.dims) if window is not None else 1
    outs = inst.shape.leaves()
    return float(sum(o.numel for o in outs) * size)


def _sort_flops(inst: Instruction) -> float:
    n = inst.operands[0].shape.numel
    return float(n * max(1.0, math.log2(max(n, 2))))


FLOP_RULES = {
    Opcode.DOT: _dot_flops,
    Opcode.CONVOLUTION: _conv_flops,
    Opcode.REDUCE: _reduce_flops,
    Opcode.REDUCE_WINDOW: _reduce_window_flops,
    Opcode.SELECT_AND_SCATTER: lambda i: float(i.operands[0].shape.numel * 2),
    Opcode.SORT: _sort_flops,
    Opcode.MAP: lambda i: float(i.shape.numel),
    Opcode.SCATTER: lambda i: float(i.operands[-1].shape.numel),
    Opcode.ALL_REDUCE: lambda i: float(sum(s.numel for s in i.shape.leaves())),
    Opcode.REDUCE_SCATTER: lambda i: float(i.operands[0].shape.numel),
    Opcode.BATCH_NORM_TRAINING: lambda i: float(i.operands[0].shape.numel * 7),
    Opcode.BATCH_NORM_INFERENCE: lambda i: float(i.operands[0].shape.numel * 4),
    Opcode.BATCH_NORM_GRAD: lambda i: float(i.operands[0].shape.numel * 10),
    Opcode.CHOLESKY: lambda i: float(i.shape.numel * i.shape.dims[-1] / 3 if i.shape.rank else 0),
    Opcode.TRIANGULAR_SOLVE: lambda i: float(i.shape.numel * i.operands[0].shape.dims[-1]),
}

# Instructions that move no data of their own (aliases, metadata, control).
NO_TRAFFIC = frozenset(
    {
        Opcode.PARAMETER, Opcode.CONSTANT, Opcode.GET_TUPLE_ELEMENT, Opcode.TUPLE,
        Opcode.BITCAST, Opcode.AFTER_ALL, Opcode.ADD_DEPENDENCY, Opcode.OPTIMIZATION_BARRIER,
        Opcode.PARTITION_ID, Opcode.REPLICA_ID, Opcode.DOMAIN,
    }
)  # fmt: skip


def instruction_flops(inst: Instruction) -> float:
    """FLOPs of this instruction alone (called computations excluded)."""
    rule = FLOP_RULES.get(inst.opcode)
    if rule is not None:
        return rule(inst)
    if inst.opcode in ELEMENTWISE:
        return float(inst.shape.numel)
    return 0.0


def instruction_bytes(inst: Instruction) -> tuple[int, int]:
    """(bytes read, bytes written) by this instruction alone."""
    if inst.opcode in NO_TRAFFIC or inst.opcode in (Opcode.WHILE, Opcode.CALL, Opcode.CONDITIONAL):
        return 0, 0
    written = inst.shape.byte_size
    if inst.opcode in (Opcode.SLICE, Opcode.DYNAMIC_SLICE, Opcode.GATHER):
        return written, written
    if inst.opcode is Opcode.DYNAMIC_UPDATE_SLICE:
        update = inst.operands[1].shape.byte_size
        return update, update
    return sum(op.shape.byte_size for op in inst.operands), written


# -- loops -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TripCount:
    """How many times a while loop runs, and how rhino knows."""

    count: int | None
    """Iterations, or None when it cannot be read from the loop."""
    source: str
    """"backend_config", "pattern" (induction variable vs constant), or "unknown"."""


def while_trip_count(inst: Instruction) -> TripCount:
    """Read a while loop's trip count from XLA's backend_config or the loop's pattern."""
    config = inst.attrs.get("backend_config")
    if config and "known_trip_count" in config:
        try:
            text = json.loads(config) if config.startswith('"') else config  # unquote a string form
            return TripCount(int(json.loads(text)["known_trip_count"]["n"]), "backend_config")
        except (ValueError, KeyError, TypeError):
            pass
    count = _pattern_trip_count(inst)
    return TripCount(count, "pattern") if count is not None else TripCount(None, "unknown")


_CMP = {"LT": lambda i, n, s: -(-(n - i) // s), "LE": lambda i, n, s: -(-(n + 1 - i) // s),
        "GT": lambda i, n, s: -(-(i - n) // -s), "GE": lambda i, n, s: -(-(i - n + 1) // -s)}  # fmt: skip


def _pattern_trip_count(inst: Instruction) -> int | None:
    """`while (i < N)` with i = init; i += step: trip = ceil((N - init) / step)."""
    cond = body = None
    for comp in inst.called:
        if comp.name == inst.attr("condition"):
            cond = comp
        if comp.name == inst.attr("body"):
            body = comp
    if cond is None or body is None or cond.root is None or cond.root.opcode is not Opcode.COMPARE:
        return None
    cmp = cond.root
    direction = cmp.attr("direction")
    lhs, rhs = cmp.operands
    if rhs.opcode is Opcode.GET_TUPLE_ELEMENT and lhs.opcode is Opcode.CONSTANT:
        lhs, rhs = rhs, lhs
        direction = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE"}.get(direction, direction)
    if lhs.opcode is not Opcode.GET_TUPLE_ELEMENT or direction not in _CMP:
        return None
    limit = _scalar(rhs)
    index = lhs.attr("index")
    init = _scalar(_tuple_element(inst.operands[0], index))
    step = _step(body, index)
    if limit is None or init is None or not step:
        return None
    trips = _CMP[direction](int(init), int(limit), int(step))
    return max(0, trips)


def _scalar(inst: Instruction | None) -> float | None:
    while inst is not None and inst.opcode in (Opcode.CONVERT, Opcode.COPY):
        inst = inst.operands[0]
    if (
        inst is None
        or inst.opcode is not Opcode.CONSTANT
        or inst.shape.numel != 1
        or inst.literal is None
    ):
        return None
    from rhino.hlo.errors import TextError
    from rhino.hlo.literal import decode_literal

    try:
        value = decode_literal(inst.literal, inst.shape)
    except TextError:
        return None
    return None if value is None else float(value.reshape(()))


def _tuple_element(inst: Instruction, index: int) -> Instruction | None:
    if inst.opcode is Opcode.TUPLE and index < len(inst.operands):
        return inst.operands[index]
    return None


def _step(body: Computation, index: int) -> float | None:
    root = body.root
    if root is None or root.opcode is not Opcode.TUPLE or index >= len(root.operands):
        return None
    update = root.operands[index]
    if update.opcode not in (Opcode.ADD, Opcode.SUBTRACT):
        return None
    a, b = update.operands
    if a.opcode is Opcode.GET_TUPLE_ELEMENT and a.attr("index") == index:
        step = _scalar(b)
    elif (
        b.opcode is Opcode.GET_TUPLE_ELEMENT
        and b.attr("index") == index
        and update.opcode is Opcode.ADD
    ):
        step = _scalar(a)
    else:
        return None
    if step is None:
        return None
    return -step if update.opcode is Opcode.SUBTRACT else step


# -- whole-module facts ------------------------------------------------------------------


class CostWalker:
    """FLOPs and bytes of computations, following calls, fusions and loops (memoized)."""

    def __init__(self, module: Module) -> None:
        self.module = module
        self._memo: dict[str, tuple[float, float]] = {}

    def computation_cost(self, comp: Computation) -> tuple[float, float]:
        """(FLOPs, bytes accessed) of one run of `comp`, callees included."""
        if comp.name in self._memo:
            return self._memo[comp.name]
        self._memo[comp.name] = (0.0, 0.0)  # recursion guard
        flops = 0.0
        traffic = 0.0
        for inst in comp.instructions:
            f, b = self.instruction_cost(inst)
            flops += f
            traffic += b
        self._memo[comp.name] = (flops, traffic)
        return flops, traffic

    def instruction_cost(self, inst: Instruction) -> tuple[float, float]:
        """(FLOPs, bytes) of `inst` including what it calls."""
        op = inst.opcode
        if op is Opcode.FUSION or op is Opcode.CALL or op is Opcode.ASYNC_START:
            f = sum(self.computation_cost(c)[0] for c in inst.called)
            read, written = instruction_bytes(inst)
            if op is Opcode.CALL:
                return f, sum(self.computation_cost(c)[1] for c in inst.called)
            return f, float(read + written)
        if op is Opcode.WHILE:
            trips = while_trip_count(inst).count or 1
            f = b = 0.0
            for c in inst.called:
                cf, cb = self.computation_cost(c)
                f += cf
                b += cb
            return f * trips, b * trips
        if op is Opcode.CONDITIONAL:
            costs = [self.computation_cost(c) for c in inst.called]
            return (max(c[0] for c in costs), max(c[1] for c in costs)) if costs else (0.0, 0.0)
        read, written = instruction_bytes(inst)
        return instruction_flops(inst), float(read + written)


@dataclass(frozen=True)
class TensorFact:
    name: str
    computation: str
    opcode: str
    shape: str
    bytes: int


@dataclass(frozen=True)
class LoopFact:
    name: str
    computation: str
    body: str
    trip_count: int | None
    trip_count_source: str
    body_instructions: int


@dataclass(frozen=True)
class ModuleSummary:
    """What `rhino parse` reports."""

    name: str
    computations: int
    instructions: int
    entry_instructions: int
    opcode_histogram: dict[str, int]
    parameters: int
    parameter_bytes: int
    output_bytes: int
    total_flops: float
    total_bytes: float
    largest_tensors: list[TensorFact] = field(default_factory=list)
    while_loops: list[LoopFact] = field(default_factory=list)
    fusions: int = 0
    unknown_opcodes: list[str] = field(default_factory=list)


def summarize(module: Module, *, top: int = 10) -> ModuleSummary:
    """Counts, histogram, parameter bytes, FLOPs (loops weighted by trip count), loops."""
    entry = module.entry
    hist = Counter(i.opcode_text for i in module.instructions())
    params = entry.parameters
    walker = CostWalker(module)
    flops, traffic = walker.computation_cost(entry)
    tensors = sorted(
        (
            i
            for i in module.instructions()
            if i.opcode not in (Opcode.TUPLE, Opcode.GET_TUPLE_ELEMENT)
        ),
        key=lambda i: (-i.shape.byte_size, i.name),
    )[:top]
    loops = []
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode is Opcode.WHILE:
                trip = while_trip_count(inst)
                body = next((c for c in inst.called if c.name == inst.attr("body")), None)
                loops.append(LoopFact(inst.name, comp.name, body.name if body else "?", trip.count,
                                      trip.source, len(body.instructions) if body else 0))  # fmt: skip
    return ModuleSummary(
        name=module.name,
        computations=len(module.computations),
        instructions=module.instruction_count,
        entry_instructions=len(entry.instructions),
        opcode_histogram=dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))),
        parameters=len(params),
        parameter_bytes=sum(p.shape.byte_size for p in params),
        output_bytes=entry.root.shape.byte_size if entry.root else 0,
        total_flops=flops,
        total_bytes=traffic,
        largest_tensors=[
            TensorFact(
                i.name,
                i.parent.name if i.parent else "?",
                i.opcode_text,
                str(i.shape),
                i.shape.byte_size,
            )
            for i in tensors
        ],  # fmt: skip
        while_loops=loops,
        fusions=hist.get("fusion", 0),
        unknown_opcodes=sorted(
            {i.opcode_text for i in module.instructions() if i.opcode is Opcode.UNKNOWN}
        ),
    )
