"""Graph facts the planner reads: order, FLOPs, bytes, loops, and a module summary.

All functions are pure: they read a Module and return facts, never change it.
FLOPs count a multiply-add as 2 (as papers quoting MFU do); an element-wise op costs
one FLOP per output element; data movement ops cost none.
"""

from __future__ import annotations

import heapq
import json
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rhino.hlo.errors import RhinoError, TextError
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
        Opcode.PARAMETER,
        Opcode.CONSTANT,
        Opcode.GET_TUPLE_ELEMENT,
        Opcode.TUPLE,
        Opcode.BITCAST,
        Opcode.AFTER_ALL,
        Opcode.ADD_DEPENDENCY,
        Opcode.OPTIMIZATION_BARRIER,
        Opcode.PARTITION_ID,
        Opcode.REPLICA_ID,
        Opcode.DOMAIN,
    }
)


def instruction_flops(inst: Instruction) -> float:
    """FLOPs of this instruction alone (called computations excluded)."""
    opcode = inst.opcode
    if opcode in ELEMENTWISE:
        return float(inst.shape.numel)
    rule = FLOP_RULES.get(opcode)
    if rule is not None:
        return rule(inst)
    return 0.0


# instructions whose traffic is counted in what they call, or that move none
_NO_BYTES = NO_TRAFFIC | {Opcode.WHILE, Opcode.CALL, Opcode.CONDITIONAL}
# instructions that read only as much as they write
_READ_AS_WRITTEN = frozenset({Opcode.SLICE, Opcode.DYNAMIC_SLICE, Opcode.GATHER})


def instruction_bytes(inst: Instruction) -> tuple[int, int]:
    """(bytes read, bytes written) by this instruction alone."""
    opcode = inst.opcode
    if opcode in _NO_BYTES:
        return 0, 0
    written = inst.shape.byte_size
    if opcode in _READ_AS_WRITTEN:
        return written, written
    if opcode is Opcode.DYNAMIC_UPDATE_SLICE:
        update = inst.operands[1].shape.byte_size
        return update, update
    read = 0
    for op in inst.operands:
        read += op.shape.byte_size
    return read, written


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


_CMP = {
    "LT": lambda i, n, s: -(-(n - i) // s),
    "LE": lambda i, n, s: -(-(n + 1 - i) // s),
    "GT": lambda i, n, s: -(-(i - n) // -s),
    "GE": lambda i, n, s: -(-(i - n + 1) // -s),
}


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
    from rhino.hlo.literal import decode_scalar

    try:  # not decode_literal: numpy's import is a sixth of `rhino parse`
        value = decode_scalar(inst.literal, inst.shape)
    except TextError:
        return None
    return None if value is None or isinstance(value, complex) else float(value)


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


# -- replica groups ---------------------------------------------------------------------

_DEVICE_IDS = re.compile(r"\(\s*([^()]*(?:\([^()]*\))?[^()]*)\s*\)\s*(\{[^{}]*\})?\s*")
_IOTA_IDS = re.compile(r"\[([\d,\s]+)\](?:T\(([\d,\s]+)\))?")
_EXPLICIT_IDS = re.compile(r"\d+(?:\s*,\s*\d+)*")
_AXIS_REF = re.compile(r"'([^']*)'(?::\((\d+)\)(\d+))?")


def replica_groups(inst: Instruction) -> list[list[int]] | None:
    """The replica groups of a collective, as lists of ids in XLA's order within a group.

    Reads every form of `replica_groups=` XLA prints: explicit `{{0,1},{2,3}}`, iota
    `[2,4]<=[8]` / `[4,2]<=[2,4]T(1,0)`, and the mesh form `mesh['a'=2,'b'=4] {'a'}`,
    whose device order may come in a separate `device_ids=` attribute (rhino's attribute
    scanner splits `replica_groups=mesh[...], device_ids=([2,4]T(1,0)) {'a'}` in two; the
    `{...}` of grouped axes then ends `device_ids`' value). Mesh form, as XLA computes it
    (MeshAxesReplicaGroupList::flattened_replica_groups): the device ids (iota, or
    `device_ids` = an explicit list `(0,4,1,5,...)` or an iota `([2,4]T(1,0))`) are laid
    row-major on the mesh; there is one group per setting of the axes not listed, and
    within a group the listed axes vary in the order listed (the last fastest). A sub-axis
    `'a':(k)m` is the part of axis a of size m below the k major positions.

    Returns None when the instruction has no `replica_groups`, or `{}` (one group of all
    participants, whose number the module's `num_partitions` gives). Ids are partition
    ids for SPMD collectives (`use_global_device_ids=true` or a channel_id).
    Raises HloParseError (located) on an inconsistent mesh form.
    """
    from rhino.hlo.attrs import MeshReplicaGroups

    value = inst.attr("replica_groups")
    if value is None:
        return None
    if not isinstance(value, MeshReplicaGroups):
        groups = [list(g) for g in value]
        return groups or None
    try:
        return _mesh_form_groups(value, inst.attrs.get("device_ids"))
    except TextError as e:
        key = "device_ids" if "device_ids" in inst.attrs else "replica_groups"
        raise inst.attr_error(key, e) from None


def _mesh_form_groups(value: Any, device_ids_text: str | None) -> list[list[int]]:
    """Groups of a decoded `mesh[...]` value and the text of its `device_ids=`, if any."""
    axes: tuple[tuple[str, int], ...] = value.axes
    n = math.prod(size for _, size in axes)
    ids = list(range(n))
    grouped_text = value.text[value.text.index("]") + 1 :].strip()
    if device_ids_text is not None:
        if grouped_text:
            raise TextError(f"grouped axes given twice: {grouped_text} and in device_ids")
        m = _DEVICE_IDS.fullmatch(device_ids_text)
        if m is None:
            raise TextError(
                f"expected device_ids=(0,4,1,5,...) or ([2,4]T(1,0)) then {{'axis',...}}, "
                f"got {device_ids_text!r}"
            )
        ids = _device_ids(m.group(1).strip(), n)
        grouped_text = (m.group(2) or "").strip()
    if not (grouped_text.startswith("{") and grouped_text.endswith("}")):
        raise TextError(
            f"expected the grouped mesh axes like {{'a'}} after mesh[...], got {grouped_text!r}"
        )
    refs = _axis_refs(grouped_text[1:-1], axes)
    return _groups_on_mesh(axes, refs, ids)


def _device_ids(text: str, n: int) -> list[int]:
    """`0,4,1,5` (explicit) or `[2,4]T(1,0)` (iota reshaped, transposed), flattened."""
    import numpy as np

    m = _IOTA_IDS.fullmatch(text)
    if m is not None:
        dims = [int(x) for x in m.group(1).split(",")]
        perm = [int(x) for x in m.group(2).split(",")] if m.group(2) else list(range(len(dims)))
        if sorted(perm) != list(range(len(dims))):
            raise TextError(f"device_ids {text}: T({m.group(2)}) is not a permutation of {dims}")
        if math.prod(dims) != n:
            raise TextError(f"device_ids {text} holds {math.prod(dims)} ids, the mesh {n}")
        return [int(x) for x in np.arange(n).reshape(dims).transpose(perm).ravel()]
    if _EXPLICIT_IDS.fullmatch(text) is None:
        raise TextError(f"expected device ids like 0,4,1,5 or [2,4]T(1,0), got {text!r}")
    ids = [int(x) for x in text.split(",")]
    if sorted(ids) != list(range(n)):
        raise TextError(f"device_ids ({text}) is not a permutation of the {n} mesh devices")
    return ids


_AxisRef = tuple[int, int, int | None]
"""(mesh axis index, pre-size, sub-axis size or None for the whole axis)."""


def _axis_refs(text: str, axes: tuple[tuple[str, int], ...]) -> list[_AxisRef]:
    names = [a for a, _ in axes]
    refs: list[_AxisRef] = []
    pos = 0
    for m in _AXIS_REF.finditer(text):
        if text[pos : m.start()].strip(" ,"):
            break
        pos = m.end()
        if m.group(1) not in names:
            raise TextError(f"grouped axis {m.group(1)!r} is not an axis of mesh {names}")
        axis = names.index(m.group(1))
        size = axes[axis][1]
        pre, sub = (int(m.group(2)), int(m.group(3))) if m.group(2) else (1, None)
        if sub is not None and (sub < 2 or size % (pre * sub)):
            raise TextError(f"sub-axis {m.group(0)} does not divide axis {names[axis]}={size}")
        refs.append((axis, pre, sub))
    if text[pos:].strip(" ,"):
        raise TextError(f"expected grouped axes like 'a' or 'a':(2)4, got {text[pos:]!r}")
    return refs


def _groups_on_mesh(
    axes: tuple[tuple[str, int], ...], refs: list[_AxisRef], ids: list[int]
) -> list[list[int]]:
    """Reshape ids onto the mesh (each axis split where sub-axes need it), move the
    grouped dims last in the order listed, and cut into groups."""
    import numpy as np

    dims: list[int] = []
    dim_of_ref = [0] * len(refs)
    for axis, (name, size) in enumerate(axes):
        mine = sorted((k for k, r in enumerate(refs) if r[0] == axis), key=lambda k: refs[k][1])
        prefix = 1
        for k in mine:
            _, pre, sub = refs[k]
            if sub is None and len(mine) > 1:
                raise TextError(f"axis {name!r} is grouped whole and by sub-axes at once")
            sub = size if sub is None else sub
            if pre % prefix:
                raise TextError(f"sub-axes of {name!r} overlap")
            if pre != prefix:
                dims.append(pre // prefix)
            dim_of_ref[k] = len(dims)
            dims.append(sub)
            prefix = pre * sub
        if prefix != size:
            dims.append(size // prefix)
    grouped = dim_of_ref
    rest = [d for d in range(len(dims)) if d not in grouped]
    per_group = math.prod(dims[d] for d in grouped)
    array = np.asarray(ids).reshape(dims).transpose(rest + grouped).reshape(-1, per_group)
    return [[int(x) for x in row] for row in array]


# -- whole-module facts ------------------------------------------------------------------


# instructions whose cost is that of the computations they call
_CALLERS = frozenset(
    {Opcode.FUSION, Opcode.CALL, Opcode.ASYNC_START, Opcode.WHILE, Opcode.CONDITIONAL}
)


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
        if op not in _CALLERS:
            read, written = instruction_bytes(inst)
            return instruction_flops(inst), float(read + written)
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


# tuples and their elements: the tensors they hold are listed where they are made
_ALIASES = frozenset({Opcode.TUPLE, Opcode.GET_TUPLE_ELEMENT})
_UNKNOWN = Opcode.UNKNOWN


def _largest(insts: list[Instruction], top: int) -> list[Instruction]:
    """`sorted(insts, key=(-bytes, name))[:top]`, sorting only the instructions at least
    as large as the top-th largest (a 48k-instruction module has ~50 of them; sorting
    all, most of them ties broken by name, took longer than summing their FLOPs)."""

    def key(i: Instruction) -> tuple[int, str]:
        return -i.shape.byte_size, i.name

    if top <= 0 or top >= len(insts):
        return sorted(insts, key=key)[:top]
    sizes = [i.shape.byte_size for i in insts]
    floor = heapq.nlargest(top, sizes)[-1]
    return sorted((i for i, b in zip(insts, sizes, strict=True) if b >= floor), key=key)[:top]


def summarize(module: Module, *, top: int = 10) -> ModuleSummary:
    """Counts, histogram, parameter bytes, FLOPs (loops weighted by trip count), loops."""
    entry = module.entry
    insts = [i for c in module.computations for i in c.instructions]
    hist = Counter(i.opcode_text for i in insts)
    params = entry.parameters
    walker = CostWalker(module)
    flops, traffic = walker.computation_cost(entry)
    tensors = _largest([i for i in insts if i.opcode not in _ALIASES], top)
    loops = []
    for comp in module.computations:
        for inst in comp.instructions:
            if inst.opcode is Opcode.WHILE:
                trip = while_trip_count(inst)
                body = next((c for c in inst.called if c.name == inst.attr("body")), None)
                loops.append(
                    LoopFact(
                        inst.name,
                        comp.name,
                        body.name if body else "?",
                        trip.count,
                        trip.source,
                        len(body.instructions) if body else 0,
                    )
                )
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
        ],
        while_loops=loops,
        fusions=hist.get("fusion", 0),
        unknown_opcodes=sorted({i.opcode_text for i in insts if i.opcode is _UNKNOWN}),
    )
