"""Module-to-module passes. Each takes a module and returns a new one; the input is untouched.

Pre- and postcondition of every pass: the module verifies (`rhino.hlo.verify`).
"""

from __future__ import annotations

from rhino.hlo.collector import collector_paused
from rhino.hlo.ir import Computation, Instruction, Module
from rhino.hlo.opcode import Opcode


def clone_module(module: Module) -> Module:
    """A deep copy: new computations and instructions, the same names, shapes, attribute
    texts and source locations (shapes and decoded attribute values are immutable and
    shared). Printing the copy prints the module."""
    with collector_paused():  # as the parser does: many objects, none freed
        return _clone(module)


def _clone(module: Module) -> Module:
    comps = {}
    for comp in module.computations:
        copy = Computation(comp.name, is_entry=comp.is_entry, signature=comp.signature)
        copy.attrs = dict(comp.attrs)
        comps[comp.name] = copy
    for comp in module.computations:
        copy = comps[comp.name]
        mapping: dict[int, Instruction] = {}
        for inst in comp.instructions:
            new = inst.clone([mapping[id(op)] for op in inst.operands])
            if inst.called:
                new.called = tuple(comps[c.name] for c in inst.called)
            if inst.control_predecessors:
                new.control_predecessors = tuple(mapping[id(p)] for p in inst.control_predecessors)
            copy.add(new, root=inst is comp.root)
            mapping[id(inst)] = new
    return Module(
        module.name,
        dict(module.attrs),
        [comps[c.name] for c in module.computations],
        list(module.sections),
        module.percent_names,
        module.source,
    )


def inline_calls(module: Module, origin: dict[str, str] | None = None) -> Module:
    """Replace every `call` by the body of the computation it calls, recursively.

    JAX lowers nested `jit`s (relu, log_softmax, where, ...) to `call`s; the planner
    wants one flat graph. Computations left with no caller are dropped. Inlined
    instructions keep their names where those are free, else get a `.N` suffix.
    `origin`, when given, is filled with: inlined instruction name -> the name of the
    outermost `call` it replaces (a plan made on the module with its calls then places
    the inlined instructions where it placed their call).
    Post: no `call` remains; the module computes the same values.
    """
    return _inline(module, (Opcode.CALL,), origin)


def flatten(module: Module, origin: dict[str, str] | None = None) -> Module:
    """Inline every `call` and every `fusion`: the one flat graph the planner plans and
    `rhino run` compiles.

    A post-optimization dump hides its work in fusions, which the planner would see as
    opaque (planned replicated) and XLA's CPU backend refuses to compile without their
    backend configs; their bodies are ordinary instructions.
    `origin` as for `inline_calls`.
    Post: no `call` or `fusion` remains; the module computes the same values.
    """
    return _inline(module, (Opcode.CALL, Opcode.FUSION), origin)


def _inline(
    module: Module, opcodes: tuple[Opcode, ...], origin: dict[str, str] | None = None
) -> Module:
    out = clone_module(module)
    used = _Names({inst.name for inst in out.instructions()})
    for comp in out.computations:
        while True:
            calls = [i for i in comp.instructions if i.opcode in opcodes and len(i.called) == 1]
            if not calls:
                break
            # in order: a call that is another's operand is replaced by its body's root
            # before the other is inlined
            comp.splice({call: _inline_one(comp, call, used, origin) for call in calls})
    return drop_unreachable(out)


def _inline_one(
    comp: Computation, call: Instruction, used: _Names, origin: dict[str, str] | None
) -> list[Instruction]:
    """The body of `call`'s computation cloned, its parameters the call's operands, and
    the call's users now using the clone of its root; the clones, for `comp.splice` to
    put where the call is."""
    callee = call.called[0]
    mapping: dict[int, Instruction] = {}
    clones: list[Instruction] = []
    for inst in callee.instructions:
        if inst.opcode is Opcode.PARAMETER:
            mapping[id(inst)] = call.operands[inst.parameter_number or 0]
            continue
        clone = Instruction(
            used.fresh(inst.name),
            inst.opcode,
            inst.shape,
            [mapping[id(op)] for op in inst.operands],
            inst.attrs,
            opcode_text=inst.opcode_text,
            literal=inst.literal,
        )
        clone.called = inst.called
        clone.control_predecessors = tuple(mapping[id(p)] for p in inst.control_predecessors)
        clones.append(clone)
        mapping[id(inst)] = clone
        if origin is not None:
            origin[clone.name] = origin.get(call.name, call.name)
    assert callee.root is not None
    result = mapping[id(callee.root)]
    call.replace_all_uses_with(result)
    if comp.root is call:
        comp.root = result
    return clones


class _Names:
    """The instruction names taken in a module, and fresh ones: `name`, else the first
    free of `name.i1`, `name.i2`, ..."""

    def __init__(self, used: set[str]) -> None:
        self.used = used
        self.tried: dict[str, int] = {}
        """name -> the k of the last `name.ik` handed out: every lower one is taken (names
        are only ever added), so the search for the next goes on from there (a body
        inlined 500 times tried 1, 2, ..., 500 for its 500th copy)."""

    def fresh(self, name: str) -> str:
        candidate = name
        k = self.tried.get(name, 0)
        if k:
            candidate = f"{name}.i{k}"
        while candidate in self.used:
            k += 1
            candidate = f"{name}.i{k}"
        self.tried[name] = k
        self.used.add(candidate)
        return candidate


def drop_unreachable(module: Module) -> Module:
    """Remove computations that the entry computation does not reach (in place; returned)."""
    reached: set[str] = set()
    stack = [module.entry]
    while stack:
        comp = stack.pop()
        if comp.name in reached:
            continue
        reached.add(comp.name)
        for inst in comp.instructions:
            stack.extend(inst.called)
    module.retain_computations(reached)
    return module
