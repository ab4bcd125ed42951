"""The step rewritten for one micro-batch: every per-example dimension cut to B / m
(`rhino.runtime.pipeline.microbatch` finds which), batch-independent values read per
example cut or sliced to the micro-batch's rows, sums the micro-batches need whole
computed from the whole batch's inputs.

    microbatch_module(module, facts) -> Module      (a Module -> Module pass)
"""

from __future__ import annotations

from rhino.hlo.attrs import SliceDims
from rhino.hlo.ir import Computation, Instruction, Module
from rhino.hlo.opcode import Opcode
from rhino.hlo.passes import clone_module
from rhino.hlo.shape import Shape
from rhino.runtime.pipeline.microbatch import BatchFacts, State, cut_dims, window_dims


def microbatch_module(
    module: Module, facts: BatchFacts, copies: dict[str, str] | None = None
) -> Module:
    """`module` (flat, as analysed) with every per-example dimension cut to one
    micro-batch; constants, names and everything batch-independent unchanged.
    Post: the module verifies; its parameters are those of `module` with the data
    parameters' dimension 0 divided by m, then, where `facts.counts_rows`, the rows of
    the batch the micro-batch holds (`ROWS`). `copies`, when given, gets for every
    micro-batch copy of a batch-independent value (and what computes its first row) the
    instruction it was made from."""
    m = facts.microbatches
    module = clone_module(module)
    entry = module.entry
    new = Computation(entry.name, is_entry=True)
    mapping: dict[str, Instruction] = {}
    added: dict[str, Instruction] = {}
    for number, (name, source) in enumerate(facts.inputs.items(), len(entry.parameters)):
        shape = entry[source].shape if source else Shape("s32", (facts.batch // m,))
        added[name] = new.add(Instruction(name, Opcode.PARAMETER, shape, parameter_number=number))
    rows = next((added[n] for n, source in facts.inputs.items() if source is None), None)
    resizer = _Resizer(new, mapping, facts, rows, copies if copies is not None else {})
    whole_of = {source: added[n] for n, source in facts.inputs.items() if source}

    def operand(user: Instruction, k: int) -> Instruction:
        op = user.operands[k]
        dim = facts.resize.get((user.name, k))
        if dim is None or m == 1:
            return mapping[op.name]
        return resizer.resized(op, dim)

    for inst in entry.instructions:
        if inst.name in facts.whole:
            mapping[inst.name] = _whole_copy(inst, facts, new, mapping, whole_of, root=inst)
            continue
        state = facts.state.get(inst.name)
        shape = _cut(inst.shape, state, m)
        ops = [operand(inst, k) for k in range(len(inst.operands))]
        clone = _clone(inst, shape, ops)
        if isinstance(state, int) and inst.opcode is Opcode.SLICE:
            _cut_slice(clone, state, m)
        operand_state = facts.state.get(inst.operands[0].name) if inst.operands else None
        if inst.opcode is Opcode.GATHER and isinstance(operand_state, int) and m > 1:
            _cut_window(clone, operand_state, m)
        mapping[inst.name] = new.add(clone, root=inst is entry.root)
    others = [c for c in module.computations if not c.is_entry]
    return Module(module.name, {}, [*others, new], list(module.sections), module.percent_names)


def _whole_copy(
    inst: Instruction,
    facts: BatchFacts,
    comp: Computation,
    mapping: dict[str, Instruction],
    whole_of: dict[str, Instruction],
    root: Instruction,
) -> Instruction:
    """`inst` computed for the whole batch, from the whole batch's inputs (`whole_of`:
    data parameter -> the parameter with its whole value), in `comp`: what depends on
    the batch is copied with its full shape, the rest is read from `mapping`. `root`,
    the value in `facts.whole`, keeps its name; the copies are named `<name>.whole`."""
    if inst.name in whole_of:
        return whole_of[inst.name]
    if inst is not root and inst.name in mapping and facts.state.get(inst.name) is None:
        return mapping[inst.name]
    key = f"{inst.name}.whole"
    if key in mapping:
        return mapping[key]
    ops = [_whole_copy(op, facts, comp, mapping, whole_of, root) for op in inst.operands]
    clone = _clone(inst, inst.shape, ops)
    if inst is not root:
        clone.name = comp.unused_name(key)
    mapping[key] = comp.add(clone)
    return mapping[key]


def _cut(shape: Shape, state: State, m: int) -> Shape:
    if isinstance(state, tuple) and shape.is_tuple:
        return Shape(
            "tuple",
            elements=tuple(_cut(e, s, m) for e, s in zip(shape.elements, state, strict=True)),
        )
    if not isinstance(state, int) or isinstance(state, bool):
        return shape
    dims = list(shape.dims)
    dims[state] //= m
    return shape.with_dims(tuple(dims))


def _clone(inst: Instruction, shape: Shape, ops: list[Instruction]) -> Instruction:
    clone = Instruction(
        inst.name,
        inst.opcode,
        shape,
        ops,
        inst.attrs,
        opcode_text=inst.opcode_text,
        parameter_number=inst.parameter_number,
        literal=inst.literal,
    )
    clone.called = inst.called
    return clone


def _cut_window(gather: Instruction, dim: int, m: int) -> None:
    """A gather whose operand is cut along `dim`: a window taken whole there is cut too."""
    if dim in window_dims(gather) and dim not in gather.attr("start_index_map", ()):
        sizes = list(gather.attr("slice_sizes"))
        sizes[dim] //= m
        gather.set_attr("slice_sizes", tuple(sizes))


def _cut_slice(inst: Instruction, dim: int, m: int) -> None:
    dims = list(inst.attr("slice").dims)
    start, limit, stride = dims[dim]
    dims[dim] = (start, limit // m, stride)
    inst.set_attr("slice", SliceDims(tuple(dims)))


class _Resizer:
    """Makes the micro-batch's copies of batch-independent values (`_cut_dims`), in the
    rewritten ENTRY computation `comp`."""

    def __init__(
        self,
        comp: Computation,
        mapping: dict[str, Instruction],
        facts: BatchFacts,
        rows: Instruction | None,
        copies: dict[str, str],
    ) -> None:
        self.comp = comp
        self.mapping = mapping
        self.facts = facts
        self.rows = rows
        self.copies = copies
        self.done: dict[tuple[str, int], Instruction] = {}
        self.anchor: Instruction | None = None
        """Where `_add` puts new instructions: before it, or (None) at the end."""

    def resized(self, inst: Instruction, dim: int) -> Instruction:
        """A copy of batch-independent `inst` with dimension `dim` cut to a micro-batch."""
        key = (inst.name, dim)
        if key in self.done:
            return self.done[key]
        m = self.facts.microbatches
        before = len(self.comp.instructions)
        if key in self.facts.sliced:
            self.done[key] = self.rows_of(self.mapping[inst.name], dim)
            self._made_from(inst, before)
            return self.done[key]
        cuts = [] if inst.opcode is Opcode.IOTA else cut_dims(inst, dim, self.facts.batch)
        whole = inst.name in self.facts.whole  # its operands: their whole-batch copies
        ops = [
            self._operand(op, whole) if d is None else self.resized(op, d)
            for op, d in zip(inst.operands, cuts, strict=True)
        ]
        dims = list(inst.shape.dims)
        dims[dim] //= m
        clone = _clone(inst, inst.shape.with_dims(tuple(dims)), ops)
        clone.name = self.comp.unused_name(f"{inst.name}.mb")
        if inst.opcode is Opcode.SLICE:
            _cut_slice(clone, dim, m)
        result = self.comp.add(clone)
        if inst.opcode is Opcode.IOTA and inst.attr("iota_dimension") == dim:
            result = self._from_first_row(result, dim, inst.shape.dims[dim])
        self.done[key] = result
        self.copies[clone.name] = inst.name
        self._made_from(inst, before)
        return result

    def _operand(self, op: Instruction, whole: bool) -> Instruction:
        copy = self.mapping.get(f"{op.name}.whole") if whole else None
        return copy or self.mapping[op.name]

    def _made_from(self, inst: Instruction, start: int) -> None:
        """The instructions added since `start` (besides copies of operands) come from
        `inst`."""
        for made in self.comp.instructions[start:]:
            self.copies.setdefault(made.name, inst.name)

    def _from_first_row(self, iota: Instruction, dim: int, whole: int) -> Instruction:
        """`iota` (cut along the batch) plus the count its micro-batch starts at."""
        count = self._start(whole)
        if iota.shape.dtype != "s32":
            count = self._add(Opcode.CONVERT, Shape(iota.shape.dtype, ()), [count])
        spread = self._add(Opcode.BROADCAST, iota.shape, [count], dimensions="{}")
        return self._add(Opcode.ADD, iota.shape, [iota, spread])

    def rows_of(self, whole: Instruction, dim: int) -> Instruction:
        """The micro-batch's rows of `whole` (the whole batch's value), along `dim`."""
        s32 = Shape("s32", ())
        zero = self._add(Opcode.CONSTANT, s32, [], literal="0")
        starts = [
            self._start(whole.shape.dims[dim]) if d == dim else zero
            for d in range(whole.shape.rank)
        ]
        dims = list(whole.shape.dims)
        dims[dim] //= self.facts.microbatches
        sizes = "{" + ",".join(map(str, dims)) + "}"
        return self._add(
            Opcode.DYNAMIC_SLICE,
            whole.shape.with_dims(tuple(dims)),
            [whole, *starts],
            dynamic_slice_sizes=sizes,
        )

    def _start(self, whole: int) -> Instruction:
        """Where the micro-batch starts in a dimension that holds the whole batch's
        `whole` elements as B examples' runs: its first row times their length."""
        assert self.rows is not None
        s32 = Shape("s32", ())
        first = self._add(Opcode.SLICE, Shape("s32", (1,)), [self.rows], slice="{[0:1]}")
        start = self._add(Opcode.RESHAPE, s32, [first])
        per_example = self._add(Opcode.CONSTANT, s32, [], literal=str(whole // self.facts.batch))
        return self._add(Opcode.MULTIPLY, s32, [start, per_example])

    def _add(
        self,
        opcode: Opcode,
        shape: Shape,
        ops: list[Instruction],
        *,
        literal: str | None = None,
        **attrs: str,
    ) -> Instruction:
        name = self.comp.unused_name(f"microbatch_{opcode.value}")
        inst = Instruction(name, opcode, shape, ops, dict(attrs), literal=literal)
        if self.anchor is not None:
            return self.comp.insert_before(self.anchor, inst)
        return self.comp.add(inst)


def slice_rows(module: Module, facts: BatchFacts, copy: Instruction, whole: Instruction) -> bool:
    """Make the micro-batch copy `copy` (of `module`, rewritten with `facts`) the
    micro-batch's rows sliced from `whole`, the value it is a copy of, instead of
    computing it from copies of `whole`'s operands (a stage that reads `whole` anyway
    then needs nothing more). False, and nothing changed, where the rewritten step has
    no rows parameter to slice by."""
    rows = next((n for n, source in facts.inputs.items() if source is None), None)
    dims = [d for d in range(copy.shape.rank) if copy.shape.dims[d] != whole.shape.dims[d]]
    if rows is None or len(dims) != 1:
        return False
    entry = module.entry
    resizer = _Resizer(entry, {}, facts, entry[rows], {})
    resizer.anchor = copy
    copy.replace_all_uses_with(resizer.rows_of(whole, dims[0]))
    return True
