"""Fidelity: the collectives XLA's SPMD partitioner inserted, against the plan's prediction.

`measure_collectives(partitioned_text, mesh)` reads XLA's partitioned module (what
`Compiled.partitioned_hlo()` returns) with rhino's parser and lists every collective that
runs in one step; `compare(predicted, measured)` pairs them with the planner's predicted
collectives and reports the difference. Nothing here imports jax: the measured side is
plain text in, plain data out.

Bytes (the convention of `rhino.search.spmd.comm`, so that both sides compare directly): per
device, per execution, the buffer on the FULL side of the collective:

    all-gather          its output              (n shards gathered)
    reduce-scatter      its input               (before scattering)
    all-reduce          its input (= output)    tuple forms: the sum of the operands
    all-to-all          its input (= output)    tuple form (CPU): the sum of the operands
    collective-permute  its input (= output)

`count` is how many times the collective runs per step: the product of the trip counts
of the while loops around it (`rhino.hlo.analysis.while_trip_count`; an unknown trip
count counts once, with a note). `total_bytes = nbytes * count` is what `compare` uses.

Mesh axes: ids in replica groups are partition ids, which rhino lays on its
`DeviceMesh` row-major (partition p is mesh device p). A collective's axes are the
subset of mesh axes whose `DeviceMesh.axes_groups` is the same set of groups (axes of
size 1 are left out; the order is the one that reproduces XLA's order inside the groups
when one does, as that is an all-gather's concatenation order). No subset matching:
`axes is None`, reported as "unmatched". A collective-permute's axes are the mesh axes
along which its sources and targets differ.

CPU has no reduce-scatter: XLA emits an all-reduce whose result only feeds a
`dynamic-slice` at offsets computed from `partition-id` (in the same computation, inside
a fusion, or carried into a while loop). Such an all-reduce is reported as kind
"all-reduce" with `sliced=True` (the bytes it moves are a full all-reduce's), and
`compare` lets it match a predicted reduce-scatter.

Attribution: `compile_spmd` strips metadata and hands XLA each instruction's name as its
location, so XLA marks what it derived from rhino instruction "y" with
`metadata={op_name="y"}`. XLA leaves op_name off one family of collectives: those that
bring the entry's result to its output sharding (seen: all-gathers feeding the ROOT
tuple, and the ROOT get-tuple-element of a while loop). `attribute` calls these "output"
reshards and gives them the annotated module's ROOT name when the caller passes it.
Any other collective without op_name takes the op_name of its nearest user, else of its
nearest operand (`attribution` says which).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rhino.hlo.analysis import replica_groups, while_trip_count
from rhino.hlo.errors import ConfigError
from rhino.hlo.ir import Computation, Instruction, Module
from rhino.hlo.opcode import Opcode
from rhino.hlo.parser import parse_module
from rhino.search.mesh import DeviceMesh
from rhino.search.units import format_bytes

TOLERANCE = 0.10
"""A predicted and a measured collective agree when the measured total bytes are within
10% of the predicted ones (|measured - predicted| <= 0.10 * predicted)."""


# -- measured ------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredCollective:
    """One collective in XLA's partitioned module."""

    kind: str
    """XLA opcode without "-start": "all-gather", "all-reduce", "reduce-scatter",
    "all-to-all", "collective-permute" (also "collective-broadcast", "ragged-all-to-all")."""
    nbytes: int
    """Per-device bytes of one execution, on the full side (see module)."""
    count: int
    """Executions per step (product of enclosing while-loop trip counts)."""
    axes: tuple[int, ...] | None
    """Mesh axes the groups run over; () when every device is alone; None: no match."""
    groups: tuple[tuple[int, ...], ...]
    """Replica groups as partition ids, in XLA's order; () for a collective-permute."""
    instruction: str | None
    """The rhino instruction it came from (see `attribution`), or None."""
    attribution: str
    """How `instruction` was found: "metadata", "user", "output", "operand", "none"."""
    name: str
    """The collective's own name in XLA's module."""
    computation: str
    """The computation of XLA's module it sits in."""
    pairs: tuple[tuple[int, int], ...] = ()
    """collective-permute: (source, target) partition ids."""
    sliced: bool = False
    """An all-reduce whose every use is a partition-id dynamic-slice (a reduce-scatter
    on CPU)."""
    sliced_nbytes: int = 0
    """Per-device bytes kept after the slice (a reduce-scatter's output); 0 if not sliced."""
    note: str = ""
    """Anything the numbers do not say (unknown trip count, conditional branch...)."""

    @property
    def total_bytes(self) -> int:
        """Bytes per device per step: `nbytes * count`."""
        return self.nbytes * self.count

    @property
    def row_kind(self) -> str:
        """The kind this collective totals under: a sliced all-reduce is a reduce-scatter."""
        return "reduce-scatter" if self.sliced else self.kind

    def describe(self) -> str:
        """`all-gather of 64 KiB over mesh axis 1 at %dot.3` (x3 when in a loop)."""
        times = f" x{self.count}" if self.count != 1 else ""
        sliced = " (+ partition-id dynamic-slice)" if self.sliced else ""
        where = _where(self.instruction, self.attribution, self.name)
        amount = f"{format_bytes(self.nbytes)}{times}"
        return f"{self.kind}{sliced} of {amount} over {_axes_text(self.axes)} {where}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["axes"] = list(self.axes) if self.axes is not None else "unmatched"
        d["groups"] = [list(g) for g in self.groups]
        d["pairs"] = [list(p) for p in self.pairs]
        d["total_bytes"] = self.total_bytes
        return d


def _operand_bytes(inst: Instruction) -> int:
    return sum(op.shape.byte_size for op in inst.operands)


def _all_gather_bytes(inst: Instruction) -> int:
    # all-gather-start's shape is (inputs, outputs)
    if (
        inst.opcode_text.endswith("-start")
        and inst.shape.is_tuple
        and len(inst.shape.elements) == 2
    ):
        return inst.shape.elements[1].byte_size
    return inst.shape.byte_size


BYTE_RULES: dict[str, Callable[[Instruction], int]] = {
    "all-gather": _all_gather_bytes,
    "all-reduce": _operand_bytes,
    "reduce-scatter": _operand_bytes,
    "all-to-all": _operand_bytes,
    "collective-permute": lambda i: i.operands[0].shape.byte_size,
    "collective-broadcast": _operand_bytes,
    "ragged-all-to-all": lambda i: i.operands[0].shape.byte_size,
}
"""Per-device full-side bytes of one execution, per kind (see module)."""


def collective_kind(inst: Instruction) -> str | None:
    """The collective kind of `inst` (sync or `-start` form), or None for anything else."""
    text = inst.opcode_text
    kind = text.removesuffix("-start")
    return kind if kind in BYTE_RULES else None


def measure_collectives(
    partitioned: str | Module, mesh: DeviceMesh, *, root: str | None = None
) -> tuple[MeasuredCollective, ...]:
    """Every collective one step of XLA's partitioned module (its text, or the text
    parsed by `parse_partitioned`) runs, in program order.

    `root`: the name of the ENTRY's ROOT instruction in the annotated module, to which
    the output reshards (collectives XLA inserts without an op_name to bring the result
    to its output sharding) are attributed; see `attribute`.

    Walks the computations reachable from the entry (loop bodies weighted by their trip
    counts, fusions, calls, conditional branches, async computations). Raises
    HloParseError on text rhino cannot parse, ConfigError when the module's
    `num_partitions` is not the number of mesh devices.
    """
    module = parse_partitioned(partitioned) if isinstance(partitioned, str) else partitioned
    parts = module.attrs.get("num_partitions")
    if parts is not None and parts.strip().isdigit() and int(parts) != mesh.size:
        raise ConfigError(
            f"the partitioned module {module.name} has num_partitions={parts} but mesh "
            f"{mesh} has {mesh.size} devices"
        )
    return tuple(_Measurer(module, mesh, root).run())


def parse_partitioned(text: str) -> Module:
    """XLA's partitioned module (`Compiled.partitioned_hlo()`) read by rhino's parser."""
    return parse_module(text, "<partitioned>")


# opcodes that launch no kernel of their own: they name, alias or group buffers
_NO_KERNEL = frozenset(
    {
        Opcode.PARAMETER,
        Opcode.CONSTANT,
        Opcode.TUPLE,
        Opcode.GET_TUPLE_ELEMENT,
        Opcode.BITCAST,
        Opcode.AFTER_ALL,
        Opcode.OPTIMIZATION_BARRIER,
        Opcode.PARTITION_ID,
        Opcode.REPLICA_ID,
        Opcode.ASYNC_UPDATE,
        Opcode.ASYNC_DONE,
    }
)


def while_runs(inst: Instruction) -> tuple[list[tuple[Computation, int]], bool]:
    """The computations a while loop calls, each with how often one execution of the loop
    runs it (the body once a trip, the condition once more), and whether the trip count
    is known (an unknown one counts as one trip)."""
    trips = while_trip_count(inst).count
    n = trips if trips is not None else 1
    condition = inst.attr("condition")
    return [(c, n + 1 if c.name == condition else n) for c in inst.called], trips is not None


def kernel_launches(module: Module) -> int:
    """How many kernels one step of XLA's compiled (partitioned) module launches: every
    instruction of the entry that computes something (a fusion, a custom call, a
    collective, a copy...), counted once per trip of the while loops around it; the
    larger branch of a conditional. Fused and reducer computations are inside their
    kernel. (The fixed cost per kernel is what a roofline misses on small programs.)"""
    memo: dict[str, int] = {}

    def count(comp: Computation) -> int:
        if comp.name not in memo:
            memo[comp.name] = 0  # recursion guard
            total = 0
            for inst in comp.instructions:
                if inst.opcode is Opcode.WHILE:
                    total += sum(count(c) * runs for c, runs in while_runs(inst)[0])
                elif inst.opcode is Opcode.CONDITIONAL:
                    total += max((count(c) for c in inst.called), default=0)
                elif inst.opcode is Opcode.CALL or inst.opcode is Opcode.ASYNC_START:
                    total += sum(count(c) for c in inst.called)
                elif inst.opcode not in _NO_KERNEL:
                    total += 1
            memo[comp.name] = total
        return memo[comp.name]

    return count(module.entry)


class _Measurer:
    """One walk over a partitioned module (callers indexed once, computations memoized)."""

    def __init__(self, module: Module, mesh: DeviceMesh, root: str | None) -> None:
        self.module = module
        self.mesh = mesh
        self.root = root
        self.callers: dict[str, list[Instruction]] = defaultdict(list)
        for comp in module.computations:
            for inst in comp.instructions:
                for called in inst.called:
                    self.callers[called.name].append(inst)
        self._memo: dict[str, list[tuple[MeasuredCollective, int, str]]] = {}
        self._axes: dict[tuple[tuple[int, ...], ...], tuple[int, ...] | None] = {}

    def run(self) -> Iterator[MeasuredCollective]:
        for record, count, note in self._collect(self.module.entry):
            notes = "; ".join(n for n in (record.note, note) if n)
            yield dataclasses.replace(record, count=count, note=notes)

    def _collect(self, comp: Computation) -> list[tuple[MeasuredCollective, int, str]]:
        """(collective, executions per run of `comp`, note) for `comp` and its callees."""
        if comp.name in self._memo:
            return self._memo[comp.name]
        self._memo[comp.name] = []  # recursion guard (HLO has no recursion)
        found: list[tuple[MeasuredCollective, int, str]] = []
        for inst in comp.instructions:
            kind = collective_kind(inst)
            if kind is not None:
                found.append((self._measure(inst, kind), 1, ""))
            for callee, times, note in self._callees(inst):
                for record, count, inner in self._collect(callee):
                    found.append((record, count * times, "; ".join(n for n in (note, inner) if n)))
        self._memo[comp.name] = found
        return found

    def _callees(self, inst: Instruction) -> Iterator[tuple[Computation, int, str]]:
        """Computations `inst` runs, with how many times per execution of `inst`."""
        if inst.opcode is Opcode.WHILE:
            runs, known = while_runs(inst)
            note = "" if known else f"trip count of %{inst.name} unknown: counted once"
            for callee, times in runs:
                yield callee, times, note
        elif inst.opcode is Opcode.CONDITIONAL:
            for callee in inst.called:
                yield callee, 1, f"in branch {callee.name} of %{inst.name} (counted as taken)"
        elif inst.opcode not in (Opcode.ASYNC_UPDATE, Opcode.ASYNC_DONE):  # started once
            for callee in inst.called:
                yield callee, 1, ""

    def _measure(self, inst: Instruction, kind: str) -> MeasuredCollective:
        note = ""
        if kind == "collective-permute":
            raw = inst.attr("source_target_pairs") or ()
            pairs = tuple((int(s), int(t)) for s, t in raw)
            groups: tuple[tuple[int, ...], ...] = ()
            axes = permute_axes(pairs, self.mesh)
        else:
            pairs = ()
            found = replica_groups(inst)
            if found is None:  # `{}` or absent: one group of every partition
                found = [list(range(self.mesh.size))]
            groups = tuple(tuple(g) for g in found)
            if groups not in self._axes:
                self._axes[groups] = groups_axes(groups, self.mesh)
            axes = self._axes[groups]
        if axes is None:
            note = f"replica groups match no mesh axes of {self.mesh}"
        sliced_bytes = 0
        if kind == "all-reduce":
            slices = _slice_uses(inst, self.callers, set())
            sliced_bytes = sum(slices) if slices else 0
        instruction, attribution = attribute(inst, root=self.root)
        return MeasuredCollective(
            kind=kind,
            nbytes=BYTE_RULES[kind](inst),
            count=1,
            axes=axes,
            groups=groups,
            instruction=instruction,
            attribution=attribution,
            name=inst.name,
            computation=inst.parent.name if inst.parent else "?",
            pairs=pairs,
            sliced=sliced_bytes > 0,
            sliced_nbytes=sliced_bytes,
            note=note,
        )


# -- mesh axes -------------------------------------------------------------------------------


def groups_axes(groups: Sequence[Sequence[int]], mesh: DeviceMesh) -> tuple[int, ...] | None:
    """The mesh axes whose replica groups are `groups` (see module), or None."""
    if any(not 0 <= d < mesh.size for g in groups for d in g):
        return None
    wanted = sorted(tuple(sorted(g)) for g in groups)
    ordered = sorted((tuple(g) for g in groups), key=lambda g: (min(g), g) if g else (-1, g))
    live = [a for a in range(mesh.ndim) if mesh.shape[a] > 1]
    for r in range(len(live) + 1):
        for subset in itertools.combinations(live, r):
            if sorted(tuple(sorted(g)) for g in mesh.axes_groups(subset)) != wanted:
                continue
            for perm in itertools.permutations(subset):
                if [tuple(g) for g in mesh.axes_groups(perm)] == ordered:
                    return perm
            return subset
    return None


def permute_axes(pairs: Sequence[tuple[int, int]], mesh: DeviceMesh) -> tuple[int, ...] | None:
    """Mesh axes along which a collective-permute's sources and targets differ."""
    if any(not (0 <= s < mesh.size and 0 <= t < mesh.size) for s, t in pairs):
        return None
    differ = {
        a
        for s, t in pairs
        for a, (cs, ct) in enumerate(zip(mesh.coords(s), mesh.coords(t), strict=True))
        if cs != ct
    }
    return tuple(sorted(differ))


# -- all-reduce + dynamic-slice ------------------------------------------------------------------

_PASS_THROUGH = frozenset({Opcode.BITCAST, Opcode.COPY, Opcode.RESHAPE, Opcode.GET_TUPLE_ELEMENT})


def _slice_uses(
    value: Instruction, callers: dict[str, list[Instruction]], seen: set[int]
) -> list[int] | None:
    """Bytes of every partition-id dynamic-slice that consumes `value`, or None when
    `value` has any other use (or none, or is a computation's result)."""
    if id(value) in seen:
        return []
    seen.add(id(value))
    if value.is_root or not value.users:
        return None
    out: list[int] = []
    for user in value.users:
        at = [k for k, op in enumerate(user.operands) if op is value]
        if user.opcode is Opcode.DYNAMIC_SLICE and at == [0]:
            if not any(_depends_on_partition(o, callers) for o in user.operands[1:]):
                return None
            out.append(user.shape.byte_size)
            continue
        if user.opcode in _PASS_THROUGH:
            inner = _slice_uses(user, callers, seen)
        elif user.opcode is Opcode.FUSION and user.called:
            params = {p.parameter_number: p for p in user.called[0].parameters}
            inner = []
            for k in at:
                got = _slice_uses(params[k], callers, seen) if k in params else None
                if got is None:
                    inner = None
                    break
                inner.extend(got)
        else:
            return None
        if inner is None:
            return None
        out.extend(inner)
    return out


_Node = tuple[Instruction, tuple[int, ...]]


def _depends_on_partition(inst: Instruction, callers: dict[str, list[Instruction]]) -> bool:
    """Does `inst` depend on partition-id (or replica-id)? Follows values across fusion,
    call and while boundaries, tracking tuple elements so that one loop-carried index
    does not make every loop value depend on it."""
    stack: list[_Node] = [(inst, ())]
    seen: set[tuple[int, tuple[int, ...]]] = set()
    while stack:
        node, path = stack.pop()
        key = (id(node), path)
        if key in seen or len(path) > 8:
            continue
        seen.add(key)
        if node.opcode in (Opcode.PARTITION_ID, Opcode.REPLICA_ID):
            return True
        stack.extend(_value_sources(node, path, callers))
    return False


def _value_sources(
    node: Instruction, path: tuple[int, ...], callers: dict[str, list[Instruction]]
) -> list[_Node]:
    """Where element `path` of `node`'s value comes from."""
    op = node.opcode
    if op is Opcode.CONSTANT:
        return []
    if op is Opcode.TUPLE:
        if path:
            return [(node.operands[path[0]], path[1:])] if path[0] < len(node.operands) else []
        return [(o, ()) for o in node.operands]
    if op is Opcode.GET_TUPLE_ELEMENT:
        return [(node.operands[0], (int(node.attr("index", 0)), *path))]
    if op is Opcode.PARAMETER:
        comp = node.parent
        out: list[_Node] = []
        for caller in callers.get(comp.name, []) if comp is not None else []:
            if caller.opcode is Opcode.WHILE:
                body = next((c for c in caller.called if c.name == caller.attr("body")), None)
                out.append((caller.operands[0], path))
                if body is not None and body.root is not None:
                    out.append((body.root, path))
            elif node.parameter_number is not None and node.parameter_number < len(caller.operands):
                out.append((caller.operands[node.parameter_number], path))
        return out
    if op is Opcode.WHILE:
        body = next((c for c in node.called if c.name == node.attr("body")), None)
        roots = [(body.root, path)] if body is not None and body.root is not None else []
        return [(node.operands[0], path), *roots]
    if op in (Opcode.FUSION, Opcode.CALL) and node.called and node.called[0].root is not None:
        return [(node.called[0].root, path)]
    return [(o, ()) for o in node.operands]


# -- attribution ---------------------------------------------------------------------------------


def op_name(inst: Instruction) -> str | None:
    """The `op_name` of an instruction's metadata, unquoted, or None."""
    if "metadata" not in inst.attrs:
        return None
    meta = inst.attr("metadata")
    raw = meta.get("op_name") if meta is not None else None
    if not raw:
        return None
    if raw.startswith('"'):
        try:
            text = json.loads(raw)
        except ValueError:
            text = raw.strip('"')
        return str(text) or None
    return raw


def attribute(
    inst: Instruction, *, root: str | None = None, depth: int = 3
) -> tuple[str | None, str]:
    """(rhino instruction, how found) for a collective of XLA's partitioned module.

    Its own op_name ("metadata"). Without one, the users within `depth` steps, breadth
    first: the first op_name found ("user"); reaching the entry's ROOT first means an
    output reshard ("output", attributed to `root`, the annotated module's ROOT name,
    when given: XLA puts no op_name on the collectives that bring the entry's result to
    its output sharding, nor on the ROOT tuple). Then the operands ("operand"). Else
    (None, "none").
    """
    own = op_name(inst)
    if own is not None:
        return own, "metadata"

    def entry_root(i: Instruction) -> bool:
        return i.is_root and i.parent is not None and i.parent.is_entry

    if entry_root(inst):
        return root, "output"
    frontier = list(inst.users)
    for _ in range(depth):
        for other in frontier:
            name = op_name(other)
            if name is not None:
                return name, "user"
            if entry_root(other):
                return root, "output"
        frontier = [user for other in frontier for user in other.users]
    operands = list(inst.operands)
    for _ in range(depth):
        for other in operands:
            name = op_name(other)
            if name is not None:
                return name, "operand"
        operands = [op for other in operands for op in other.operands]
    return None, "none"


# -- predicted and the comparison ---------------------------------------------------------------


@dataclass(frozen=True)
class PredictedCollective:
    """One collective the plan expects XLA to insert (filled in by the planner)."""

    kind: str
    """XLA opcode: "all-gather", "all-reduce", "reduce-scatter", "all-to-all",
    "collective-permute"."""
    axes: tuple[int, ...]
    """Mesh axes it runs over (as `ReshardStep.axes`)."""
    nbytes: float
    """Per-device bytes of one execution, full side (`rhino.search.spmd.comm`'s convention)."""
    instruction: str | None
    """The rhino instruction whose operand or result it reshards (XLA's op_name)."""
    note: str = ""
    """Free text carried into the report (e.g. "strided spec realized by a rewrite")."""
    count: int = 1
    """Executions per step (trip count of an enclosing loop)."""

    @property
    def total_bytes(self) -> float:
        """Bytes per device per step: `nbytes * count`."""
        return self.nbytes * self.count

    def describe(self) -> str:
        """`all-gather of 64 KiB over mesh axis 0 at %dot.3`."""
        times = f" x{self.count}" if self.count != 1 else ""
        where = f"at %{self.instruction}" if self.instruction else "(no instruction)"
        amount = f"{format_bytes(self.nbytes)}{times}"
        return f"{self.kind} of {amount} over {_axes_text(self.axes)} {where}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["axes"] = list(self.axes)
        d["total_bytes"] = self.total_bytes
        return d


@dataclass(frozen=True)
class CollectiveMatch:
    """A predicted collective paired with the measured one XLA inserted for it."""

    predicted: PredictedCollective
    """What the plan expected."""
    measured: MeasuredCollective
    """What XLA inserted."""
    rule: str
    """"combined", "instruction" (same instruction, kind and axes) or "kind+axes"."""
    within_tolerance: bool
    """Measured total bytes within `tolerance` of predicted."""
    combined: tuple[PredictedCollective, ...] = ()
    """Rule "combined": the other predicted collectives XLA's combiner merged into the
    same measured one."""

    @property
    def predicted_bytes(self) -> float:
        return self.predicted.total_bytes + sum(p.total_bytes for p in self.combined)

    @property
    def ratio(self) -> float | None:
        """Measured / predicted total bytes (None when 0 bytes were predicted)."""
        p = self.predicted_bytes
        return self.measured.total_bytes / p if p else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "predicted": self.predicted.to_dict(),
            "measured": self.measured.to_dict(),
            "rule": self.rule,
            "within_tolerance": self.within_tolerance,
            "ratio": self.ratio,
            "combined": [p.to_dict() for p in self.combined],
        }


@dataclass(frozen=True)
class KindAxesTotal:
    """Bytes per step of one (kind, mesh axes) on both sides."""

    kind: str
    """Collective kind; a sliced all-reduce counts as "reduce-scatter"."""
    axes: tuple[int, ...] | None
    """Mesh axes (sorted), or None for measured groups that match no axes."""
    predicted_bytes: float
    """Predicted total bytes per device per step."""
    measured_bytes: float
    """Measured total bytes per device per step."""
    predicted_count: int
    """Number of predicted collectives (each counted once, whatever its `count`)."""
    measured_count: int
    """Number of measured collectives (each counted once, whatever its `count`)."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["axes"] = list(self.axes) if self.axes is not None else "unmatched"
        return d


@dataclass(frozen=True)
class FidelityReport:
    """Predicted against measured communication of one plan (see `compare`)."""

    predicted_bytes: float
    """Sum of predicted total bytes (per device per step)."""
    measured_bytes: float
    """Sum of measured total bytes (per device per step)."""
    by_kind_axes: tuple[KindAxesTotal, ...]
    """Totals per (kind, axes), sorted by kind then axes."""
    matches: tuple[CollectiveMatch, ...]
    """Pairs, in predicted order."""
    unpredicted: tuple[MeasuredCollective, ...]
    """XLA inserted these; the plan did not predict them."""
    missing: tuple[PredictedCollective, ...]
    """The plan predicted these; XLA did not insert them."""
    tolerance: float = TOLERANCE
    """Relative byte tolerance used (see `TOLERANCE`)."""

    @property
    def ratio(self) -> float | None:
        """Measured / predicted bytes: 1.0 when both are 0, None when only predicted is."""
        if self.predicted_bytes == 0:
            return 1.0 if self.measured_bytes == 0 else None
        return self.measured_bytes / self.predicted_bytes

    @property
    def ok(self) -> bool:
        """Every collective paired, each pair and the total within tolerance."""
        gap = abs(self.measured_bytes - self.predicted_bytes)
        return (
            not self.unpredicted
            and not self.missing
            and all(m.within_tolerance for m in self.matches)
            and gap <= self.tolerance * self.predicted_bytes
        )

    def messages(self) -> list[str]:
        """One line per disagreement, for people."""
        lines = [
            f"XLA inserted {m.describe()} that the plan did not predict" for m in self.unpredicted
        ]
        lines += [
            f"the plan predicted {p.describe()} that XLA did not insert" for p in self.missing
        ]
        for match in self.matches:
            if not match.within_tolerance:
                p, m = match.predicted, match.measured
                lines.append(
                    f"{p.kind} over {_axes_text(p.axes)} at %{p.instruction}: predicted "
                    f"{format_bytes(match.predicted_bytes)}, "
                    f"XLA moves {format_bytes(m.total_bytes)} ({m.name})"
                )
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "predicted_bytes": self.predicted_bytes,
            "measured_bytes": self.measured_bytes,
            "ratio": self.ratio,
            "ok": self.ok,
            "tolerance": self.tolerance,
            "by_kind_axes": [t.to_dict() for t in self.by_kind_axes],
            "matches": [m.to_dict() for m in self.matches],
            "unpredicted": [m.to_dict() for m in self.unpredicted],
            "missing": [p.to_dict() for p in self.missing],
            "messages": self.messages(),
        }


def compare(
    predicted: Sequence[PredictedCollective],
    measured: Sequence[MeasuredCollective],
    *,
    tolerance: float = TOLERANCE,
) -> FidelityReport:
    """Pair predicted with measured collectives and total both sides.

    Kinds agree when equal, and a predicted reduce-scatter agrees with a sliced
    all-reduce; axes agree as sets. Pairing, each collective used at most once:
      1. "instruction": same instruction name, kinds agree, axes agree (any bytes; a
         pair outside tolerance is reported with both numbers);
      2. "kind+axes": among the rest, kinds and axes agree and total bytes are within
         tolerance (measured within ±tolerance of predicted).
    In each round the closest pairs in bytes go first (ties: list order). What is left
    is reported as unpredicted (measured) or missing (predicted). One predicted
    collective that XLA splits into several (or the reverse) shows up as unpaired.
    """
    free_p = set(range(len(predicted)))
    free_m = set(range(len(measured)))
    pairs: dict[int, CollectiveMatch] = {}
    rows: dict[int, dict[str, float]] = {}  # combined collective -> its bytes' share per kind

    def agree(p: PredictedCollective, m: MeasuredCollective) -> bool:
        kind_ok = p.kind == m.kind or (p.kind == "reduce-scatter" and m.sliced)
        return kind_ok and m.axes is not None and set(p.axes) == set(m.axes)

    def close(p: PredictedCollective, m: MeasuredCollective) -> bool:
        return abs(m.total_bytes - p.total_bytes) <= tolerance * p.total_bytes

    def gap(p: PredictedCollective, m: MeasuredCollective) -> float:
        return abs(m.total_bytes - p.total_bytes) / max(p.total_bytes, m.total_bytes, 1.0)

    # XLA's combiners merge collectives of several instructions into one, named
    # "(a:b:c)"; its uses slice the pieces apart, so merged reduce-scatters show up as
    # one all-reduce
    for j in sorted(free_m):
        m = measured[j]
        names = _combined_names(m.instruction)
        if m.axes is None or len(names) < 2:
            continue
        group = [
            i
            for i in sorted(free_p)
            if predicted[i].instruction in names
            and set(predicted[i].axes) == set(m.axes)
            and (
                predicted[i].kind == m.kind
                or (predicted[i].kind == "reduce-scatter" and m.kind == "all-reduce")
            )
        ]
        if not group:
            continue
        total = sum(predicted[i].total_bytes for i in group)
        free_m.discard(j)
        free_p.difference_update(group)
        within = abs(m.total_bytes - total) <= tolerance * total
        pairs[group[0]] = CollectiveMatch(
            predicted[group[0]], m, "combined", within, tuple(predicted[i] for i in group[1:])
        )
        by_kind: dict[str, float] = defaultdict(float)
        for i in group:
            by_kind[predicted[i].kind] += predicted[i].total_bytes
        rows[j] = {kind: b / total if total else 1 / len(by_kind) for kind, b in by_kind.items()}
    rounds: list[tuple[str, Callable[[PredictedCollective, MeasuredCollective], bool]]] = [
        ("instruction", lambda p, m: p.instruction is not None and p.instruction == m.instruction),
        ("kind+axes", close),
    ]
    for rule, extra in rounds:
        candidates = sorted(
            (gap(predicted[i], measured[j]), i, j)
            for i in free_p
            for j in free_m
            if agree(predicted[i], measured[j]) and extra(predicted[i], measured[j])
        )
        for _, i, j in candidates:
            if i in free_p and j in free_m:
                free_p.discard(i)
                free_m.discard(j)
                p, m = predicted[i], measured[j]
                pairs[i] = CollectiveMatch(p, m, rule, close(p, m))
    return FidelityReport(
        predicted_bytes=float(sum(p.total_bytes for p in predicted)),
        measured_bytes=float(sum(m.total_bytes for m in measured)),
        by_kind_axes=_totals(predicted, measured, rows),
        matches=tuple(pairs[i] for i in sorted(pairs)),
        unpredicted=tuple(measured[j] for j in sorted(free_m)),
        missing=tuple(predicted[i] for i in sorted(free_p)),
        tolerance=tolerance,
    )


def _combined_names(instruction: str | None) -> set[str]:
    """The instructions of a combined collective's op_name "(a:b:c)"."""
    if not instruction or not instruction.startswith("(") or ":" not in instruction:
        return set()
    return set(instruction[1:-1].split(":"))


def _totals(
    predicted: Sequence[PredictedCollective],
    measured: Sequence[MeasuredCollective],
    rows: Mapping[int, Mapping[str, float]],
) -> tuple[KindAxesTotal, ...]:
    """Totals per (kind, axes). A combined collective (`rows`: measured index -> share of
    its bytes per kind) is split over the kinds of the predicted ones it merges."""
    Key = tuple[str, tuple[int, ...] | None]
    p_bytes: dict[Key, float] = defaultdict(float)
    m_bytes: dict[Key, float] = defaultdict(float)
    p_count: dict[Key, int] = defaultdict(int)
    m_count: dict[Key, int] = defaultdict(int)
    for p in predicted:
        key: Key = (p.kind, tuple(sorted(p.axes)))
        p_bytes[key] += p.total_bytes
        p_count[key] += 1
    for j, m in enumerate(measured):
        axes = tuple(sorted(m.axes)) if m.axes is not None else None
        for kind, share in (rows.get(j) or {m.row_kind: 1.0}).items():
            m_bytes[(kind, axes)] += m.total_bytes * share
            m_count[(kind, axes)] += 1

    def order(key: Key) -> tuple[str, int, tuple[int, ...]]:
        kind, axes = key
        return (kind, 1 if axes is None else 0, axes or ())

    keys = sorted(set(p_count) | set(m_count), key=order)
    return tuple(
        KindAxesTotal(k[0], k[1], p_bytes[k], m_bytes[k], p_count[k], m_count[k]) for k in keys
    )


# -- text ------------------------------------------------------------------------------


def _axes_text(axes: tuple[int, ...] | None) -> str:
    if axes is None:
        return "unmatched replica groups"
    if not axes:
        return "no mesh axis"
    if len(axes) == 1:
        return f"mesh axis {axes[0]}"
    return f"mesh axes {list(axes)}"


def _where(instruction: str | None, attribution: str, name: str) -> str:
    if attribution == "metadata":
        return f"at %{instruction}"
    if attribution == "output":
        target = f"%{instruction}" if instruction else "the entry's result"
        return f"resharding {target} to its output sharding (XLA's %{name})"
    if instruction is None:
        return f"(XLA's %{name}, no instruction)"
    return f"at %{instruction} (from its {attribution}; XLA's %{name})"


__all__ = [
    "BYTE_RULES",
    "TOLERANCE",
    "CollectiveMatch",
    "FidelityReport",
    "KindAxesTotal",
    "MeasuredCollective",
    "PredictedCollective",
    "attribute",
    "collective_kind",
    "compare",
    "groups_axes",
    "measure_collectives",
    "op_name",
    "permute_axes",
]
