"""A Graphviz (dot) view of a computation."""

from __future__ import annotations

from rhino.hlo.ir import Module
from rhino.hlo.opcode import Opcode

_COLORS = {
    Opcode.DOT: "lightcoral",
    Opcode.CONVOLUTION: "lightcoral",
    Opcode.PARAMETER: "lightblue",
    Opcode.CONSTANT: "gray90",
    Opcode.WHILE: "gold",
    Opcode.FUSION: "khaki",
}


def entry_to_dot(module: Module) -> str:
    """The entry computation as a dot digraph: one node per instruction, one edge per operand."""
    comp = module.entry
    lines = [f'digraph "{module.name}" {{', "  node [shape=box, style=filled, fontsize=10];"]
    ids = {id(inst): f"n{k}" for k, inst in enumerate(comp.instructions)}
    for inst in comp.instructions:
        color = _COLORS.get(inst.opcode, "white")
        label = f"{inst.name}\\n{inst.opcode_text} {inst.shape}".replace('"', "'")
        lines.append(f'  {ids[id(inst)]} [label="{label}", fillcolor={color}];')
    for inst in comp.instructions:
        for op in inst.operands:
            lines.append(f"  {ids[id(op)]} -> {ids[id(inst)]};")
    lines.append("}")
    return "\n".join(lines) + "\n"
