"""Sharding constraints: make XLA convert layouts the way the plan priced them.

XLA's SPMD partitioner honours the sharding of every annotated instruction, but between
two annotated instructions it picks its own conversion, and a loop-carried value (whose
sharding the bridge cannot write, see runtime/spmd/annotate.py) gets whatever its propagation
infers. `add_constraints` pins both down with `custom-call(x),
custom_call_target="Sharding"` (what `jax.lax.with_sharding_constraint` emits):

- per planned reshard (`Plan.reshards`), one constraint per layout of its path, inserted
  before the reader, so XLA goes through the same intermediate layouts (one collective
  each) as the plan's shortest conversion path;
- per while loop, the carried layout of each leaf (`Plan.carried`) on every
  `get-tuple-element` of the body's and condition's parameter and of the loop's result,
  and on each element of the initial tuple and of the body's result.

A layout XLA cannot express (partial sums, non-maximal strides) gets no constraint; the
returned notes say where. Each constraint's `metadata` names the reader, so the
collectives XLA emits for it are attributed to the instruction the plan charged them to.

Pre: `module` is the plan's module (calls inlined) annotated by `apply_plan`.
Post: the module verifies; the values computed are unchanged (constraints are identities).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rhino.hlo.ir import Computation, Instruction, Module
from rhino.hlo.opcode import Opcode
from rhino.hlo.sharding import HloSharding
from rhino.runtime.spmd.annotate import root_sharding
from rhino.search.mesh import DeviceMesh
from rhino.search.spmd.plan import Plan, PlannedReshard
from rhino.search.spmd.spec import SpecError, parse_spec

TARGET = '"Sharding"'


@dataclass
class _Writer:
    module: Module
    mesh: DeviceMesh
    used: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    added: int = 0
    shared: dict[tuple[int, tuple[str, ...]], Instruction] = field(default_factory=dict)

    def sharding(self, layout: str, value: Instruction) -> HloSharding | None:
        if value.shape.is_tuple:
            return None
        try:
            spec = parse_spec(layout, self.mesh.ndim)
            return spec.to_hlo_sharding(self.mesh, value.shape.rank)
        except SpecError:
            return None

    def chain(
        self,
        value: Instruction,
        layouts: tuple[str, ...],
        reader: str,
        comp: Computation,
        anchor: Instruction,
    ) -> Instruction:
        """`value` through one constraint per expressible layout, inserted before `anchor`."""
        current = value
        for layout in layouts:
            sharding = self.sharding(layout, value)
            if sharding is None:
                if not value.shape.is_tuple:
                    self.notes.append(
                        f"%{reader}: layout {layout} of %{value.name} cannot be written as "
                        "a sharding; XLA converts it its own way"
                    )
                continue
            name = self.fresh(f"{value.name}.as")
            inst = Instruction(
                name,
                Opcode.CUSTOM_CALL,
                value.shape,
                [current],
                {
                    "custom_call_target": TARGET,
                    "sharding": str(sharding),
                    "metadata": f'{{op_name="{reader}"}}',
                },
            )
            comp.insert_before(anchor, inst)
            self.added += 1
            current = inst
        return current

    def fresh(self, base: str) -> str:
        k = 0
        name = base
        while name in self.used:
            k += 1
            name = f"{base}.{k}"
        self.used.add(name)
        return name

    def after(self, value: Instruction, layout: str, reader: str) -> None:
        """Every reader of `value` reads it through a constraint to `layout` instead."""
        comp = value.parent
        if comp is None or value is comp.root or not value.users:
            return
        users = list(value.users)
        nxt = comp.instructions[comp.instructions.index(value) + 1]
        pinned = self.chain(value, (layout,), reader, comp, nxt)
        if pinned is value:
            return
        for user in users:
            for j, op in enumerate(user.operands):
                if op is value:
                    user.replace_operand(j, pinned)

    def before(self, reader: Instruction, j: int, layouts: tuple[str, ...], name: str) -> None:
        """Operand `j` of `reader` arrives through the layouts. Readers of one value that
        want it through the same layouts share one chain (as XLA would: it is one
        conversion), placed right after the value."""
        comp = reader.parent
        if comp is None:
            return
        value = reader.operands[j]
        key = (id(value), layouts)
        pinned = self.shared.get(key)
        if pinned is None:
            anchor = reader
            if value.parent is comp and value.opcode is not Opcode.PARAMETER:
                anchor = comp.instructions[comp.instructions.index(value) + 1]
            pinned = self.chain(value, layouts, name, comp, anchor)
            self.shared[key] = pinned
        if pinned is not value:
            reader.replace_operand(j, pinned)


def add_constraints(module: Module, plan: Plan) -> tuple[Module, tuple[str, ...]]:
    """Insert the plan's constraints into `module` (in place; see module doc).

    Returns the module and notes on the layouts that could not be written.
    """
    writer = _Writer(module, plan.mesh)
    writer.used = {inst.name for inst in module.instructions()}
    by_name = {inst.name: inst for inst in module.instructions()}
    paths: dict[tuple[str, str, int], tuple[str, ...]] = {}
    for r in plan.reshards:
        paths[(r.consumer, r.where, r.operand)] = r.path
    for inst in list(module.instructions()):
        if inst.opcode is Opcode.WHILE:
            _loop(writer, inst, plan, paths)
    for r in plan.reshards:
        if r.where == "operand" and r.consumer in by_name:
            reader = by_name[r.consumer]
            if r.operand < len(reader.operands) and not reader.operands[r.operand].shape.is_tuple:
                writer.before(reader, r.operand, r.path, r.consumer)
    _state(writer, module, plan.reshards)
    return module, tuple(writer.notes)


def _loop(
    writer: _Writer,
    loop: Instruction,
    plan: Plan,
    paths: dict[tuple[str, str, int], tuple[str, ...]],
) -> None:
    """Pin the layout of every carried leaf of `loop`, inside and around it."""
    elements = loop.shape.elements
    if any(e.is_tuple for e in elements):
        writer.notes.append(f"%{loop.name}: nested carried tuples; loop layouts left to XLA")
        return
    layouts = {i: plan.carried.get(f"{loop.name}#{i}") for i in range(len(elements))}
    for comp in loop.called:
        for param in comp.parameters:
            for gte in list(param.users):
                layout = _element_layout(gte, layouts)
                if layout is not None:
                    writer.after(gte, layout, f"{loop.name}#{gte.attr('index')}")
    body = next((c for c in loop.called if c.name == loop.attr("body")), None)
    result = body.root if body is not None else None
    if result is not None and result.opcode is Opcode.TUPLE:
        for i, layout in layouts.items():
            if layout is not None and i < len(result.operands):
                path = paths.get((f"{loop.name}#{i}", "loop", 0), (layout,))
                writer.before(result, i, path, f"{loop.name}#{i}")
    init = loop.operands[0]
    if init.opcode is Opcode.TUPLE and list(init.users) == [loop]:
        for i, layout in layouts.items():
            if layout is not None and i < len(init.operands):
                path = paths.get((f"{loop.name}#{i}", "init", 0), (layout,))
                writer.before(init, i, path, f"{loop.name}#{i}")
    for gte in list(loop.users):
        layout = _element_layout(gte, layouts)
        if layout is not None:
            writer.after(gte, layout, f"{loop.name}#{gte.attr('index')}")


def _element_layout(gte: Instruction, layouts: dict[int, str | None]) -> str | None:
    if gte.opcode is not Opcode.GET_TUPLE_ELEMENT:
        return None
    return layouts.get(gte.attr("index"))


def _state(writer: _Writer, module: Module, reshards: tuple[PlannedReshard, ...]) -> None:
    """Updated state leaves leave the step in their parameter's layout."""
    root = module.entry.root
    if root is None or root.opcode is not Opcode.TUPLE:
        return
    if any(op.shape.is_tuple for op in root.operands):
        return
    changed = False
    for r in reshards:
        if r.where == "state" and 0 <= r.operand < len(root.operands):
            before = root.operands[r.operand]
            writer.before(root, r.operand, r.path, r.consumer)
            changed = changed or root.operands[r.operand] is not before
    if changed:
        root.set_attr("sharding", root_sharding(root, None))
