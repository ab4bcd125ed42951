"""Print a `Module` back to HLO text that XLA's parser accepts.

The output is a fixpoint: `print_module(parse_module(print_module(m)))` equals
`print_module(m)`. Attribute values and literals are printed from their texts, so
anything rhino does not model comes back exactly as it was read.
"""

from __future__ import annotations

from rhino.hlo.ir import Computation, Instruction, Module


def print_module(module: Module) -> str:
    """The module as HLO text, one instruction per line."""
    pct = "%" if module.percent_names else ""
    header = f"HloModule {module.name}"
    if module.attrs:
        header += ", " + ", ".join(f"{k}={v}" for k, v in module.attrs.items())
    parts = [header, ""]
    for section in module.sections:
        parts.append(section)
        parts.append("")
    for comp in module.computations:
        parts.append(print_computation(comp, pct))
        parts.append("")
    return "\n".join(parts) + "\n"


def print_computation(comp: Computation, pct: str = "") -> str:
    head = f"{'ENTRY ' if comp.is_entry else ''}{pct}{comp.name}"
    if comp.signature:
        head += " " + comp.signature
    lines = [head + " {"]
    root = comp.root
    for inst in comp.instructions:
        lines.append("  " + print_instruction(inst, pct, is_root=inst is root))
    lines.append("}" + "".join(f", {k}={v}" for k, v in comp.attrs.items()))
    return "\n".join(lines)


def print_instruction(inst: Instruction, pct: str = "", *, is_root: bool = False) -> str:
    if inst.parameter_number is not None:
        args = str(inst.parameter_number)
    elif inst.literal is not None:
        args = inst.literal
    else:
        args = ", ".join(pct + op.name for op in inst.operands)
    text = f"{'ROOT ' if is_root else ''}{pct}{inst.name} = {inst.shape} {inst.opcode_text}({args})"
    return text + inst.attr_text
