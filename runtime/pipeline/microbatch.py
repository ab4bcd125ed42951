"""Cut a training step into micro-batches: which values follow the batch, and the step
rewritten for a micro-batch.

    batch_facts(module, split, m) -> BatchFacts     (a Module -> Facts pass)
    microbatch_module(module, facts) -> Module      (a Module -> Module pass, in
                                                     `rhino.runtime.pipeline.rewrite`)

The batch is read from the dataflow: the step's inputs (forward parameters that are not
weights, `rhino.search.pipeline.split`) are grouped by the size B of their dimension 0, and the
largest group the analysis accepts is the data (an RNG key or a table gathered from is
refused alone and leaves it; it is read whole, as a batch-independent value); m must
divide B. Every instruction of the ENTRY computation (calls inlined) gets a *state*:

    None        batch-independent: the same in every micro-batch (weights, constants)
    d (an int)  per example, the batch being the major factor of dimension d: a
                micro-batch holds 1/m of that dimension
    PARTIAL     a sum over the examples (a `reduce` or `dot` or `scatter` over the
                batch, and what is computed from it linearly): the full-batch value is
                the SUM of the micro-batches' values
    STEP        computed once per step, after the micro-batches: the optimizer update
                (role update), and anything that uses a sum over the batch non-linearly

The rules are a table by opcode (`_RULES`); a rule reads its operands' states and
returns the instruction's state, or raises `ConfigError` naming the instruction when the
micro-batches cannot compute the full-batch step exactly (statistics over the batch fed
back into per-example values, as batch normalization does; a reduction over the batch
that is not a sum).

Why summing is exact, read from the graph: a mean over the batch is a sum followed by a
division by a literal constant (jax writes `divide(reduce(x), broadcast(constant(B*S)))`).
The rewrite changes shapes, never constants, so a micro-batch computes sum_over_its_rows /
(B*S), and the m of them add up to the full-batch mean; its gradient (the cotangent
broadcast(1/(B*S)) over the micro-batch's rows, contracted with the activations) likewise
adds up to the full-batch gradient. No micro-batch gradient is rescaled; the pass checks
linearity instead of assuming it (PARTIAL only flows through linear instructions).

An operand that is batch-independent but has the batch's shape where a per-example
operand meets it (`broadcast(constant)` of the full batch shape, an iota) is *resized*:
the rewrite gives that use a copy with the micro-batch's shape.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias

from rhino.hlo.errors import ConfigError
from rhino.hlo.ir import Computation, Instruction, Module
from rhino.hlo.opcode import ELEMENTWISE, Opcode
from rhino.hlo.passes import flatten
from rhino.hlo.shape import FLOAT_DTYPES
from rhino.search.pipeline.loss import HEAVY
from rhino.search.pipeline.split import Role, StepSplit, ancestors

PARTIAL = "partial"
STEP = "step"
ROWS = "microbatch_rows"
"""The parameter a rewritten step reads its micro-batch's rows of the batch from (s32[B/m],
rows k*B/m .. (k+1)*B/m - 1 for micro-batch k), where it has one (`BatchFacts.counts_rows`)."""

State: TypeAlias = "int | str | None | tuple[State, ...]"
"""None, a batched dimension, PARTIAL, STEP, or per element of a tuple."""


@dataclass(frozen=True)
class BatchFacts:
    """Where the batch is in every instruction of a (flat) training step."""

    batch: int
    """B: the examples of one step (dimension 0 of every data parameter)."""
    microbatches: int
    """m: B / m examples per micro-batch."""
    data: tuple[str, ...]
    """The data parameters (tokens, labels, images), split along dimension 0."""
    state: dict[str, State]
    """Instruction name -> its state (module docstring)."""
    resize: dict[tuple[str, int], int] = field(default_factory=dict)
    """(user, operand index) -> the dimension of that batch-independent operand to cut."""
    sliced: frozenset[tuple[str, int]] = frozenset()
    """(batch-independent instruction, dimension) computed whole, the micro-batch's rows
    sliced from it: those no cut of their operands gives (`_check_resizable`)."""
    counts_rows: bool = False
    """A resized value counts along the batch (an iota, as the counters of JAX's random
    bits are) or is sliced from the whole batch's: the micro-batch's copy starts at its
    first row, which the rewritten step reads from the parameter `ROWS` (the rows of the
    batch it holds)."""
    whole: frozenset[str] = frozenset()
    """Sums over the batch (or values computed from them) that per-example values read,
    computed in every micro-batch from the whole batch's inputs (a masked mean's count of
    tokens): batch-independent, each micro-batch reads the whole step's value."""
    inputs: dict[str, str | None] = field(default_factory=dict)
    """The parameters the rewritten step adds after the step's own, in order: name ->
    the data parameter whose whole value it is (for `whole`), or None for the rows of
    the batch the micro-batch holds (`ROWS`, where `counts_rows`)."""

    def per_microbatch(self, name: str) -> bool:
        """Does the value differ between micro-batches (per example or a partial sum)?"""
        return _varies(self.state[name])


def _varies(state: State) -> bool:
    if isinstance(state, tuple):
        return any(_varies(s) for s in state)
    return state is not None and state != STEP


class _Facts:
    """The analysis in progress: states so far, and the resize requests."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.state: dict[str, State] = {}
        self.resize: dict[tuple[str, int], int] = {}
        self.counts_rows = False
        self.whole: set[str] = set()
        self.cut: set[tuple[str, int]] = set()
        self.sliced: set[tuple[str, int]] = set()

    def of(self, inst: Instruction) -> State:
        return self.state[inst.name]

    def align(self, user: Instruction, k: int, dim: int) -> None:
        """Operand k of `user` must be cut along `dim`: fine when it is batched there,
        resized when it is batch-independent, refused otherwise."""
        op = user.operands[k]
        state = self.of(op)
        if state == dim:
            return
        if state is None and op.shape.rank > dim and op.shape.dims[dim] % self.batch == 0:
            _check_resizable(op, dim, self)
            self.resize[(user.name, k)] = dim
            return
        raise _refuse(
            user,
            f"operand {k} %{op.name} is {_describe(state)} where the batch "
            f"is dimension {dim} of the others",
        )


def _describe(state: State) -> str:
    if state is None:
        return "batch-independent"
    if state == PARTIAL:
        return "a sum over the batch"
    if state == STEP:
        return "computed once per step"
    if isinstance(state, int):
        return f"per example (batch in dimension {state})"
    return "a tuple"


class _Refusal(ConfigError):
    """The step cannot be cut into micro-batches at `inst`."""

    def __init__(self, inst: Instruction, why: str) -> None:
        super().__init__(
            f"cannot cut the step into micro-batches at %{inst.name} "
            f"({inst.opcode_text}): {why}; run it with 1 micro-batch"
        )
        self.inst = inst
        self.why = why


def _refuse(inst: Instruction, why: str) -> ConfigError:
    return _Refusal(inst, why)


class _WholeBatch(_Refusal):
    """`value`, a sum over the batch (or computed from one), is read per example at
    `inst`: every micro-batch can compute it from the whole batch's inputs when that is
    cheap (a count of the unmasked tokens that a masked mean divides by)."""

    def __init__(self, inst: Instruction, why: str, value: Instruction) -> None:
        super().__init__(inst, why)
        self.value = value


def flat_step(module: Module) -> tuple[Module, dict[str, str]]:
    """`module` with its calls and fusions inlined and every get-tuple-element of a
    tuple replaced by the element (what inlining a call that returns a tuple leaves),
    dead instructions dropped; and, per inlined instruction, the call or fusion it came
    from. Post: the module verifies and computes the same values."""
    origin: dict[str, str] = {}
    flat = flatten(module, origin)
    entry = flat.entry
    for inst in list(entry.instructions):
        op = inst.operands[0] if inst.operands else None
        if inst.opcode is Opcode.GET_TUPLE_ELEMENT and op and op.opcode is Opcode.TUPLE:
            inst.replace_all_uses_with(op.operands[inst.attr("index")])
    for inst in reversed(list(entry.instructions)):
        if not inst.users and inst is not entry.root and inst.opcode is not Opcode.PARAMETER:
            entry.remove(inst)
    return flat, origin


# -- the analysis ------------------------------------------------------------------------


def batch_facts(module: Module, split: StepSplit, microbatches: int) -> BatchFacts:
    """The state of every ENTRY instruction of `module` (calls inlined; `split` made on
    it). Pre: the module verifies. Raises ConfigError when no set of inputs can be the
    batch, m does not divide it, or an instruction cannot be micro-batched.

    Which inputs are the batch is read from the dataflow: the step's inputs (forward
    parameters that are not weights) are grouped by the size of their dimension 0, the
    largest group (in bytes) first, and a group is the batch when the analysis accepts
    it. An input the analysis refuses alone (an RNG key, whose two words are sliced apart;
    a table gathered from) leaves the group, and the rest is tried again; a refusal no
    single input explains is the step's, and is raised."""
    groups = input_groups(split)
    if not groups:
        raise ConfigError(
            f"{module.name}: no input to cut into micro-batches (every "
            "forward parameter is a weight the update rewrites or a scalar)"
        )
    first: ConfigError | None = None
    for group in groups:
        data = list(group)
        while data:
            batch = data[0].shape.dims[0]
            try:
                return _analyse(module, split, microbatches, data, batch)
            except _Refusal as refusal:
                first = first or refusal
                culprits = _inputs_behind(refusal.inst, data)
                if not culprits or len(culprits) == len(data):
                    break
                data = [p for p in data if p.name not in culprits]
    assert first is not None
    raise first


def input_groups(split: StepSplit) -> list[list[Instruction]]:
    """The step's inputs with a dimension 0, grouped by its size, the most bytes first."""
    groups: dict[int, list[Instruction]] = {}
    for inst in data_parameters(split):
        if inst.shape.rank and not inst.shape.is_tuple and inst.shape.dims[0] > 0:
            groups.setdefault(inst.shape.dims[0], []).append(inst)
    return sorted(
        groups.values(), key=lambda g: (-sum(p.shape.byte_size for p in g), g[0].shape.dims[0])
    )


def _inputs_behind(inst: Instruction, data: list[Instruction]) -> set[str]:
    """The inputs among `data` that `inst` depends on."""
    return (ancestors(inst) - {inst.name}) & {p.name for p in data}


def _analyse(
    module: Module, split: StepSplit, microbatches: int, data: list[Instruction], batch: int
) -> BatchFacts:
    names = {p.name for p in data}
    heavy = _heavy_behind(split)
    whole: set[str] = set()
    while True:
        facts = _Facts(batch)
        facts.whole = whole
        try:
            for inst in split.order:
                facts.state[inst.name] = _state_of(inst, split, names, facts)
            break
        except _WholeBatch as need:
            if heavy[need.value.name]:  # a statistic of the model's outputs over the batch
                raise _Refusal(
                    need.inst,
                    f"{need.why}; %{need.value.name} is computed from "
                    "the whole batch's dots or convolutions, so no micro-batch "
                    "can compute it alone",
                ) from None
            if need.value.name in whole:
                raise
            whole.add(need.value.name)
    for name, _ in sorted(facts.sliced, key=lambda t: split.index[t[0]]):
        if heavy[name]:
            raise _refuse(
                split.order[split.index[name]],
                "it would be computed for the whole "
                "batch in every micro-batch (its dots or convolutions read the "
                "batch's inputs)",
            )
    if microbatches < 1 or batch % microbatches:
        raise ConfigError(
            f"{microbatches} micro-batches do not divide the batch of {batch} "
            f"examples (dimension 0 of %{data[0].name})"
        )
    inputs: dict[str, str | None] = {}
    if whole:
        for p in _inputs_of(whole, split, names):
            inputs[module.entry.unused_name(f"{p}.whole")] = p
    if facts.counts_rows:
        inputs[module.entry.unused_name(ROWS)] = None
    return BatchFacts(
        batch,
        microbatches,
        tuple(p.name for p in data),
        facts.state,
        facts.resize,
        frozenset(facts.sliced),
        facts.counts_rows,
        frozenset(whole),
        inputs,
    )


def _inputs_of(values: set[str], split: StepSplit, data: set[str]) -> list[str]:
    """The data parameters `values` are computed from, in parameter order."""
    found: set[str] = set()
    for name in values:
        found |= _inputs_behind(
            split.order[split.index[name]], [split.order[split.index[p]] for p in data]
        )
    return sorted(found, key=lambda p: split.index[p])


def _heavy_behind(split: StepSplit) -> dict[str, bool]:
    """Per instruction: is it, or anything it depends on, a dot or a convolution?"""
    heavy: dict[str, bool] = {}
    for inst in split.order:
        heavy[inst.name] = inst.opcode in HEAVY or any(heavy[op.name] for op in inst.operands)
    return heavy


def data_parameters(split: StepSplit) -> list[Instruction]:
    """The step's inputs: forward parameters that the update does not rewrite (the batch
    among them, and per-step inputs such as an RNG key)."""
    return [
        inst
        for inst in split.order
        if inst.opcode is Opcode.PARAMETER
        and split.role(inst.name) is Role.FORWARD
        and inst.name not in split.weights
    ]


def _state_of(inst: Instruction, split: StepSplit, data: set[str], facts: _Facts) -> State:
    if inst.opcode is Opcode.PARAMETER:
        return 0 if inst.name in data else None
    if inst.name in facts.whole:
        return None
    ops = [facts.of(op) for op in inst.operands]
    role = split.role(inst.name)
    if role in (Role.UPDATE, Role.OUTPUT) or STEP in ops:
        return _step(inst, ops, role)
    if all(s is None for s in ops):
        return None
    return _RULES.get(inst.opcode, _no_rule)(inst, ops, facts)


def _step(inst: Instruction, ops: list[State], role: Role) -> State:
    """Once per step: reads sums (accumulated first) and batch-independent values."""
    for k, s in enumerate(ops):
        if s in (None, PARTIAL, STEP) or (role is Role.OUTPUT and s == 0):
            continue
        name = inst.operands[k].name
        if role in (Role.UPDATE, Role.OUTPUT):
            raise _refuse(inst, f"it runs once per step but reads %{name}, which is {_describe(s)}")
        total = next(op for op, t in zip(inst.operands, ops, strict=True) if t == STEP)
        raise _WholeBatch(
            inst,
            f"it combines %{name}, {_describe(s)}, with %{total.name}, which "
            "needs the whole batch first (e.g. a mean over a batch-dependent "
            "count)",
            total,
        )
    return STEP if role is not Role.OUTPUT else None


Rule: TypeAlias = Callable[[Instruction, list[State], _Facts], State]


def _no_rule(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    raise _refuse(inst, "rhino has no micro-batch rule for this opcode with per-example operands")


def _linear(inst: Instruction, ops: list[State]) -> State:
    """An instruction that reads a sum over the batch: still a sum when it is linear in
    it (the other operands batch-independent), else it must wait for the whole sum."""
    if any(isinstance(s, int) for s in ops):
        total = next(op for op, s in zip(inst.operands, ops, strict=True) if s == PARTIAL)
        raise _WholeBatch(
            inst,
            "it combines per-example values with a sum over the whole "
            "batch (batch statistics): each micro-batch would see its own sum",
            total,
        )
    partial = [k for k, s in enumerate(ops) if s == PARTIAL]
    others = [k for k in range(len(ops)) if k not in partial]
    op = inst.opcode
    sums_only = all(_is_zero(inst.operands[k]) for k in others)
    if op in (Opcode.ADD, Opcode.SUBTRACT) and sums_only:
        return PARTIAL
    if op is Opcode.MULTIPLY and len(partial) == 1:
        return PARTIAL
    if op is Opcode.DIVIDE and partial == [0]:
        return PARTIAL
    if (
        op is Opcode.SELECT
        and 0 not in partial
        and all(_is_zero(inst.operands[k]) for k in others if k != 0)
    ):
        return PARTIAL
    if op in (Opcode.NEGATE, Opcode.COPY) or (
        op is Opcode.CONVERT and inst.shape.dtype in FLOAT_DTYPES
    ):
        return PARTIAL
    return STEP


def _elementwise(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    if PARTIAL in ops:
        return _linear(inst, ops)
    dims = {s for s in ops if isinstance(s, int)}
    if len(dims) != 1:
        raise _refuse(inst, f"its operands hold the batch in different dimensions {sorted(dims)}")
    (d,) = dims
    for k, op in enumerate(inst.operands):
        if op.shape.rank:
            facts.align(inst, k, d)
    return d


def _is_zero(inst: Instruction) -> bool:
    """A constant zero, possibly broadcast, converted or reshaped."""
    while inst.opcode in (Opcode.BROADCAST, Opcode.CONVERT, Opcode.RESHAPE, Opcode.COPY):
        inst = inst.operands[0]
    if inst.opcode is not Opcode.CONSTANT or inst.shape.rank or inst.literal is None:
        return False
    try:
        return float(inst.literal.strip()) == 0.0
    except ValueError:
        return inst.literal.strip() == "false"


def _broadcast(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    (s,) = ops
    if isinstance(s, int):
        return int(inst.attr("dimensions")[s])
    return s


def _transpose(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    (s,) = ops
    if isinstance(s, int):
        return list(inst.attr("dimensions")).index(s)
    return s


def _reshape(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    (s,) = ops
    if not isinstance(s, int):
        return s
    d = _reshaped_dim(inst.operands[0].shape.dims, inst.shape.dims, s, facts.batch)
    if d is None:
        raise _refuse(
            inst,
            f"the reshape {list(inst.operands[0].shape.dims)} -> "
            f"{list(inst.shape.dims)} splits the batch (dimension {s}) or moves "
            "it off the major position",
        )
    return d


def _reshaped_dim(dims: tuple[int, ...], out: tuple[int, ...], d: int, batch: int) -> int | None:
    """The output dimension that holds the batch as its major factor: the one with as
    many elements before it as dimension d of the input has, and room for the batch."""
    before = math.prod(dims[:d])
    for r in range(len(out)):
        if math.prod(out[:r]) == before and out[r] % batch == 0:
            return r
    return None


def _reduce(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    n = len(inst.operands) // 2
    inputs, inits = ops[:n], ops[n:]
    if any(s is not None for s in inits):
        raise _refuse(inst, "its initial value depends on the batch")
    reduced = set(inst.attr("dimensions"))
    summed = _is_add(inst.called[0]) if inst.called else False
    if n == 1 and inputs[0] == PARTIAL:
        return PARTIAL if summed else STEP
    dims = {s for s in inputs if s is not None}
    if len(dims) != 1 or not isinstance(next(iter(dims)), int):
        raise _refuse(inst, "its inputs disagree on the batch")
    (d,) = dims
    assert isinstance(d, int)
    for k in range(n):
        facts.align(inst, k, d)
    if d in reduced:
        if n == 1 and summed:
            return PARTIAL
        raise _refuse(inst, "it reduces over the batch with something other than a sum")
    out = d - sum(1 for r in reduced if r < d)
    return tuple([out] * n) if inst.shape.is_tuple else out


def _is_add(comp: Computation) -> bool:
    root = comp.root
    return (
        root is not None
        and root.opcode is Opcode.ADD
        and all(op.opcode is Opcode.PARAMETER for op in root.operands)
    )


def _dot(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    lhs, rhs = ops
    if PARTIAL in ops:
        return PARTIAL if None in ops else STEP
    lb, rb = list(inst.attr("lhs_batch_dims", ())), list(inst.attr("rhs_batch_dims", ()))
    lc = list(inst.attr("lhs_contracting_dims", ()))
    rc = list(inst.attr("rhs_contracting_dims", ()))
    if isinstance(lhs, int):
        return _dot_side(inst, facts, 0, lhs, (lb, lc, rb, rc), rhs)
    assert isinstance(rhs, int)
    d = _dot_side(inst, facts, 1, rhs, (rb, rc, lb, lc), lhs)
    if isinstance(d, int) and d >= len(lb):  # the rhs's free dimensions follow the lhs's
        return d + inst.operands[0].shape.rank - len(lb) - len(lc)
    return d


def _dot_side(
    inst: Instruction, facts: _Facts, k: int, d: int, dims: tuple[list[int], ...], other: State
) -> State:
    """Operand k holds the batch in dimension d; `dims` are its batch and contracting
    dimensions, then the other operand's."""
    own_b, own_c, oth_b, oth_c = dims
    if d in own_b:
        facts.align(inst, 1 - k, oth_b[own_b.index(d)])
        return own_b.index(d)
    if d in own_c:
        facts.align(inst, 1 - k, oth_c[own_c.index(d)])
        return PARTIAL
    if other is not None:
        raise _refuse(inst, "both operands are per example but the batch is a free dimension")
    rank = inst.operands[k].shape.rank
    free = [i for i in range(rank) if i not in own_b and i not in own_c]
    return len(own_b) + free.index(d)


def _convolution(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    lhs, rhs = ops
    if PARTIAL in ops:
        return PARTIAL if None in ops else STEP
    labels = inst.attr("dim_labels")
    groups = inst.attr("feature_group_count", 1), inst.attr("batch_group_count", 1)
    if isinstance(lhs, int) and labels.lhs[lhs] == "b":
        if rhs is not None:
            raise _refuse(inst, "the kernel is per example")
        return labels.out.index("b")
    if isinstance(lhs, int) and labels.lhs[lhs] == "f" and groups == (1, 1):
        facts.align(inst, 1, labels.rhs.index("i"))
        return PARTIAL
    raise _refuse(inst, "the batch is not the input's batch or contracted feature dimension")


def _gather(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    """Per example along the indices' batch; a batched gather (`operand_batching_dims`,
    as `take_along_axis` makes) may read a per-example operand along a batching dim."""
    operand, indices = ops
    if PARTIAL in ops:
        raise _refuse(inst, "it gathers from or by a sum over the batch")
    vector = inst.attr("index_vector_dim", inst.operands[1].shape.rank)
    operand_batch = list(inst.attr("operand_batching_dims", ()))
    index_batch = list(inst.attr("start_indices_batching_dims", ()))
    offset = list(inst.attr("offset_dims", ()))
    if isinstance(operand, int) and operand not in operand_batch:
        # the batch in a window taken whole and never indexed: an offset dimension
        kept = window_dims(inst)
        sizes = inst.attr("slice_sizes")
        whole = sizes[operand] == inst.operands[0].shape.dims[operand]
        if operand not in kept or not whole or operand in inst.attr("start_index_map", ()):
            raise _refuse(inst, "it gathers from a per-example operand")
        if indices is not None:
            raise _refuse(inst, "both its operand and its indices are per example")
        return offset[kept.index(operand)]
    if isinstance(operand, int):
        at = index_batch[operand_batch.index(operand)]
        facts.align(inst, 1, at)
    else:
        assert isinstance(indices, int)
        at = indices
        if at in index_batch:
            facts.align(inst, 0, operand_batch[index_batch.index(at)])
    if at == vector:
        raise _refuse(inst, "the batch is the index vector dimension")
    batch_out = [i for i in range(inst.shape.rank) if i not in offset]
    index_dims = [i for i in range(inst.operands[1].shape.rank) if i != vector]
    return batch_out[index_dims.index(at)]


def window_dims(inst: Instruction) -> list[int]:
    """A gather's operand dimensions that its offset (window) dimensions come from."""
    dropped = {*inst.attr("collapsed_slice_dims", ()), *inst.attr("operand_batching_dims", ())}
    return [d for d in range(inst.operands[0].shape.rank) if d not in dropped]


def _scatter(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    """A scatter-add: a sum over the batch when every example's updates may land
    anywhere; per example when the batch is a batching dimension (`input_batching_dims`,
    the gradient of a batched gather)."""
    if len(ops) != 3 or not inst.called or not _is_add(inst.called[0]):
        raise _refuse(inst, "only a single scatter-add is micro-batched")
    operand, indices, updates = ops
    if indices is None and updates == PARTIAL and operand in (None, PARTIAL):
        if operand is None and not _is_zero(inst.operands[0]):
            raise _refuse(inst, "it scatters into a non-zero operand")
        return PARTIAL
    if PARTIAL in (indices, updates):
        raise _refuse(inst, "its indices and updates disagree on the batch")
    # the updates' scatter dimensions (not window ones) are the indices' but the vector's
    vector = inst.attr("index_vector_dim", inst.operands[1].shape.rank)
    index_dims = [i for i in range(inst.operands[1].shape.rank) if i != vector]
    window = set(inst.attr("update_window_dims", ()))
    update_dims = [i for i in range(inst.operands[2].shape.rank) if i not in window]
    pairs = dict(zip(update_dims, index_dims, strict=True))
    operand_batch = list(inst.attr("input_batching_dims", ()))
    index_batch = list(inst.attr("scatter_indices_batching_dims", ()))
    if isinstance(updates, int):
        if updates not in pairs:
            raise _refuse(inst, "the batch is a window dimension of its updates")
        at = pairs[updates]
    elif isinstance(indices, int):
        at = indices
    elif isinstance(operand, int) and operand in operand_batch:
        at = index_batch[operand_batch.index(operand)]
    else:
        raise _refuse(inst, "it scatters into a per-example operand")
    back = {i: u for u, i in pairs.items()}
    if at not in back:
        raise _refuse(inst, "the batch is the index vector dimension")
    facts.align(inst, 1, at)
    facts.align(inst, 2, back[at])
    if at in index_batch:  # each example's updates land in its own rows
        out = operand_batch[index_batch.index(at)]
        facts.align(inst, 0, out)
        return out
    if operand is not None or not _is_zero(inst.operands[0]):
        raise _refuse(inst, "it scatters into a non-zero or per-example operand")
    return PARTIAL  # every example's update is added in: a sum over the batch


def _slice(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    (s,) = ops
    if isinstance(s, int):
        start, limit, stride = inst.attr("slice").dims[s]
        if (start, limit, stride) != (0, inst.operands[0].shape.dims[s], 1):
            raise _refuse(inst, "it slices the batch")
    return s


def _concatenate(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    if PARTIAL in ops:
        return (
            PARTIAL
            if all(s == PARTIAL or _is_zero(o) for s, o in zip(ops, inst.operands, strict=True))
            else STEP
        )
    (d,) = {s for s in ops if isinstance(s, int)}
    if d == inst.attr("dimensions")[0]:
        raise _refuse(inst, "it concatenates along the batch")
    for k in range(len(ops)):
        facts.align(inst, k, d)
    return d


def _pad(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    s, value = ops
    if value is not None:
        raise _refuse(inst, "its padding value depends on the batch")
    if s == PARTIAL:
        return PARTIAL if _is_zero(inst.operands[1]) else STEP
    assert isinstance(s, int)
    if tuple(inst.attr("padding").dims[s]) != (0, 0, 0):
        raise _refuse(inst, "it pads the batch")
    return s


def _reduce_window(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    if len(ops) != 2 or not isinstance(ops[0], int) or ops[1] is not None:
        raise _refuse(inst, "only a single-input reduce-window over per-example values")
    w = inst.attr("window").dims[ops[0]]
    if (w.size, w.stride, w.pad_low, w.pad_high, w.lhs_dilate, w.rhs_dilate) != (1, 1, 0, 0, 1, 1):
        raise _refuse(inst, "its window spans several examples")
    return ops[0]


def _select_and_scatter(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    """A max-pool's gradient: per example when its window stays within one example."""
    operand, source, init = ops
    if not isinstance(operand, int) or init is not None:
        raise _refuse(inst, "only per-example operands with a batch-independent initial value")
    w = inst.attr("window").dims[operand]
    if (w.size, w.stride, w.pad_low, w.pad_high) != (1, 1, 0, 0):
        raise _refuse(inst, "its window spans several examples")
    facts.align(inst, 1, operand)
    return operand


def _reverse(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    (s,) = ops
    if isinstance(s, int) and s in inst.attr("dimensions"):
        raise _refuse(inst, "it reverses the batch")
    return s


def _topk(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    """The k largest along the last dimension: per example when the batch is another."""
    (s,) = ops
    if not isinstance(s, int) or s == inst.operands[0].shape.rank - 1:
        raise _refuse(inst, "it ranks across the batch")
    return (s, s) if inst.shape.is_tuple else s


def _get_tuple_element(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    (s,) = ops
    return s[inst.attr("index")] if isinstance(s, tuple) else s


def _tuple(inst: Instruction, ops: list[State], facts: _Facts) -> State:
    return tuple(ops)


_RULES: dict[Opcode, Rule] = {
    **{op: _elementwise for op in ELEMENTWISE},
    Opcode.BROADCAST: _broadcast,
    Opcode.TRANSPOSE: _transpose,
    Opcode.RESHAPE: _reshape,
    Opcode.BITCAST: _reshape,
    Opcode.REDUCE: _reduce,
    Opcode.DOT: _dot,
    Opcode.CONVOLUTION: _convolution,
    Opcode.GATHER: _gather,
    Opcode.SCATTER: _scatter,
    Opcode.SLICE: _slice,
    Opcode.CONCATENATE: _concatenate,
    Opcode.PAD: _pad,
    Opcode.REDUCE_WINDOW: _reduce_window,
    Opcode.SELECT_AND_SCATTER: _select_and_scatter,
    Opcode.REVERSE: _reverse,
    Opcode.GET_TUPLE_ELEMENT: _get_tuple_element,
    Opcode.TUPLE: _tuple,
    Opcode.TOPK: _topk,
}
"""Opcode -> the state of its result from its operands' (not all batch-independent)."""


def _check_resizable(inst: Instruction, dim: int, facts: _Facts) -> None:
    """How a batch-independent value is made with the micro-batch's shape in `dim`: what
    it is computed from is cut along the dimensions that become `dim` (`_cut_dims`),
    down to broadcasts that add the dimension and iotas (an iota along the batch counts
    from the micro-batch's first row). Where no cut of the operands gives it (a loop, a
    parameter), it is computed whole and the micro-batch's rows are sliced from it.
    Either way the micro-batch's copy holds exactly its rows of the whole batch's value."""
    key = (inst.name, dim)
    if key in facts.sliced or key in facts.cut:
        return
    if inst.opcode is Opcode.IOTA:
        facts.counts_rows |= inst.attr("iota_dimension") == dim
        facts.cut.add(key)
        return
    try:
        cuts = cut_dims(inst, dim, facts.batch)
    except _Refusal:
        facts.sliced.add(key)
        facts.counts_rows = True
        return
    facts.cut.add(key)
    for op, d in zip(inst.operands, cuts, strict=True):
        if d is not None:
            _check_resizable(op, d, facts)


def cut_dims(inst: Instruction, dim: int, batch: int) -> list[int | None]:
    """Per operand of batch-independent `inst`, the dimension to cut so that `inst` comes
    out cut along `dim` (None: the operand is read whole); refused where no cut of the
    operands gives it."""
    op = inst.opcode
    ops = inst.operands
    if op in ELEMENTWISE:
        return [dim if o.shape.rank else None for o in ops]
    if op is Opcode.BROADCAST:
        mapped = list(inst.attr("dimensions"))
        return [mapped.index(dim) if dim in mapped else None]
    if op is Opcode.TRANSPOSE:
        return [int(inst.attr("dimensions")[dim])]
    if op in (Opcode.RESHAPE, Opcode.BITCAST):
        d = _reshaped_dim(inst.shape.dims, ops[0].shape.dims, dim, batch)
        if d is not None:
            return [d]
    elif op is Opcode.REDUCE:
        kept = [i for i in range(ops[0].shape.rank) if i not in set(inst.attr("dimensions"))]
        n = len(ops) // 2
        return [kept[dim]] * n + [None] * n
    elif op is Opcode.GATHER:
        offset = set(inst.attr("offset_dims", ()))
        vector = inst.attr("index_vector_dim", ops[1].shape.rank)
        if dim not in offset:
            batch_out = [i for i in range(inst.shape.rank) if i not in offset]
            index_dims = [i for i in range(ops[1].shape.rank) if i != vector]
            return [None, index_dims[batch_out.index(dim)]]
    elif op in (Opcode.SLICE, Opcode.PAD, Opcode.REVERSE, Opcode.CONCATENATE):
        whole = {
            Opcode.SLICE: lambda: (
                tuple(inst.attr("slice").dims[dim]) == (0, ops[0].shape.dims[dim], 1)
            ),
            Opcode.PAD: lambda: tuple(inst.attr("padding").dims[dim]) == (0, 0, 0),
            Opcode.REVERSE: lambda: dim not in inst.attr("dimensions"),
            Opcode.CONCATENATE: lambda: dim != inst.attr("dimensions")[0],
        }[op]()
        if whole:
            return [dim] + [None] * (len(ops) - 1) if op is Opcode.PAD else [dim] * len(ops)
    raise _refuse(
        inst,
        f"it is batch-independent but read as if per example (dimension "
        f"{dim}), and rhino cannot compute it for one micro-batch",
    )
