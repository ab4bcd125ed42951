"""Plan -> annotated HLO: write `sharding={...}` onto the instructions of a module.

`annotate` is a pure pass: it clones the module and sets the sharding of every
instruction named in the plan, then makes sure the entry computation's parameters and
ROOT carry one. What XLA (jax/jaxlib 0.10.2, through `rhino.runtime.xla_bridge`, which
goes HLO text -> StableHLO -> SPMD partitioner) does with shardings, found by running it:

Tuple-shaped instructions
    A tuple shape takes a tuple sharding with exactly one element per array leaf,
    flattened depth first; nested tuples are never written nested (XLA's parser rejects
    `{{{...}}, ...}`), and a nested empty tuple `()` contributes no element (XLA's
    `RequiredLeaves`: an element for it gives "Expected 4 results but got 3"). A whole
    shape that is an empty tuple takes one element. A single replicated sharding on a
    tuple is accepted; a single tiled one, or a tuple sharding with a leaf of the wrong
    rank, fails deep in the compiler ("Failed to get shape"). So `annotate` always writes
    the flat tuple form and checks element counts and ranks itself.

While loops
    - A sharding on the `while` instruction itself is rejected: the StableHLO exporter
      adds an element to it ("Shape (s32[], f32[8,16], f32[16,16]) has 3 leaf nodes
      while this sharding has 4"), whatever it is (even `{replicated}`); on a large
      module (examples/gpt_scan_tiny.hlo) the compile aborts the process instead. So
      `annotate` refuses a sharding for a `while` (AnnotationError), and `default` skips
      them.
    - Shardings on instructions inside a while body or condition that become operations
      in StableHLO (dot, add, reduce, call, ...) are accepted and honoured: a dot in the
      body split on columns compiles to all-gathers / all-to-all inside the loop and
      computes the right numbers.
    - Shardings on the body's or condition's `parameter`, on the body's ROOT tuple, and
      on `tuple` / `get-tuple-element` instructions anywhere (entry included) are
      accepted but DROPPED: the importer inlines body and condition into the while
      region, whose block arguments and yields carry no attributes, and tuples become
      plain SSA values. The loop-carried layout is therefore XLA's propagation, steered
      only through the operations inside the body and around the loop.
    - Instructions of `call`ed computations keep their shardings (the call becomes a
      `func.call` of a function that keeps them), and so does the call itself.

Metadata
    `metadata={op_name=...}` on an instruction makes XLA name the partitioned
    instructions after it (a jax dump's "jit(f)/dot_general"); `strip_metadata=True`
    removes it so XLA falls back to rhino's instruction names (see BRIDGE_NOTES.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from rhino.hlo.errors import RhinoError
from rhino.hlo.ir import Instruction, Module
from rhino.hlo.opcode import Opcode
from rhino.hlo.passes import clone_module
from rhino.hlo.printer import print_module
from rhino.hlo.shape import Shape
from rhino.hlo.sharding import HloSharding, ShardingKind

REJECTED_OPCODES = frozenset({Opcode.WHILE})
"""Opcodes whose sharding XLA 0.10.2 refuses through the bridge's compile path."""

DROPPED_OPCODES = frozenset({Opcode.TUPLE, Opcode.GET_TUPLE_ELEMENT})
"""Opcodes whose sharding is accepted but has no effect (see the module docstring);
parameters of non-entry computations are dropped too."""


class AnnotationError(RhinoError):
    """A plan that cannot be written onto the module: unknown instruction names, or a
    sharding that does not fit the instruction's shape."""


def annotate(
    module: Module,
    shardings: Mapping[str, HloSharding],
    *,
    default: HloSharding | None = None,
    strip_metadata: bool = False,
) -> Module:
    """A copy of `module` with `sharding=` set as the plan says.

    - Every instruction named in `shardings` (any computation: entry, while bodies and
      conditions, called computations) gets that sharding. A non-tuple sharding given
      for a tuple-shaped instruction is applied to each leaf.
    - Entry instructions not named and not already annotated get `default`, if given
      (`while` instructions excepted). Instructions of other computations never get
      `default`.
    - Afterwards every entry parameter and the entry ROOT carry a sharding: an entry
      parameter without one gets `{replicated}`; a ROOT `tuple` without one gets, per
      leaf, the sharding of its operand (`{replicated}` where the operand has none); any
      other ROOT without one gets `default`, else `{replicated}` (a ROOT `while` none).
    - Shardings already in the text are kept unless `shardings` names the instruction.
    - `strip_metadata` removes every `metadata=` attribute (all computations).

    Pre: the module verifies. Post: the module verifies, and every sharding written fits
    its instruction's shape (tuple element counts and tiled ranks checked; divisibility
    is not: XLA pads uneven shards, which the bridge then refuses to execute).
    Raises `AnnotationError` naming every unknown instruction, every instruction whose
    sharding does not fit, and every `while` given a sharding.
    """
    out = clone_module(module)
    problems = _apply_plan(out, shardings)
    problems += _fill_entry(out, set(shardings), default)
    if problems:
        shown = problems[:_MAX_PROBLEMS]
        if len(problems) > len(shown):
            shown.append(f"... and {len(problems) - len(shown)} more")
        raise AnnotationError(f"cannot annotate module {module.name}:\n  " + "\n  ".join(shown))
    if strip_metadata:
        for inst in out.instructions():
            if "metadata" in inst.attrs:
                inst.del_attr("metadata")
    return out


_MAX_PROBLEMS = 20


def _apply_plan(module: Module, shardings: Mapping[str, HloSharding]) -> list[str]:
    """Set the named shardings; return what went wrong (raise at once for unknown names)."""
    by_name = _instructions_by_name(module)
    unknown = sorted(name for name in shardings if name not in by_name)
    if unknown:
        raise AnnotationError(
            f"the plan names {len(unknown)} instruction(s) not in module {module.name}: "
            + ", ".join(f"%{n}" for n in unknown[:_MAX_PROBLEMS])
            + (" ..." if len(unknown) > _MAX_PROBLEMS else "")
        )
    problems: list[str] = []
    for name, sharding in shardings.items():
        inst = by_name[name]
        if inst is None:
            problems.append(f"%{name} names more than one instruction")
        elif inst.opcode in REJECTED_OPCODES:
            problems.append(
                f"%{name}: XLA rejects a sharding on a {inst.opcode.value} instruction; "
                f"annotate the operations inside its body instead"
            )
        else:
            _set(inst, sharding, problems)
    return problems


def _fill_entry(module: Module, named: set[str], default: HloSharding | None) -> list[str]:
    """`default` on the unannotated entry instructions; parameters and ROOT always."""
    problems: list[str] = []
    entry = module.entry
    root = entry.root
    for inst in entry.instructions:
        if inst.name in named or "sharding" in inst.attrs or inst is root:
            continue
        if default is not None and inst.opcode not in REJECTED_OPCODES:
            _set(inst, default, problems)
        elif inst.opcode is Opcode.PARAMETER:
            _set(inst, HloSharding.replicated(), problems)
    if (
        root is not None
        and root.name not in named
        and "sharding" not in root.attrs
        and root.opcode not in REJECTED_OPCODES
    ):
        _set(root, root_sharding(root, default), problems)
    return problems


def annotated_text(
    module: Module,
    shardings: Mapping[str, HloSharding],
    *,
    default: HloSharding | None = None,
    strip_metadata: bool = False,
) -> str:
    """`annotate(...)` printed as HLO text (what `xla_bridge.compile_spmd` takes)."""
    return print_module(annotate(module, shardings, default=default, strip_metadata=strip_metadata))


def fit_sharding(sharding: HloSharding, shape: Shape) -> HloSharding:
    """`sharding` in the form XLA wants for `shape`: for a tuple shape, a flat tuple
    sharding with one element per array leaf (a non-tuple sharding repeated per leaf).

    Raises ValueError saying why it does not fit (element count, tiled rank).
    """
    if not shape.is_tuple:
        if sharding.kind is ShardingKind.TUPLE:
            raise ValueError(f"a tuple sharding {sharding} for the array shape {shape}")
        _check_leaf(sharding, shape)
        return sharding
    leaves = shape.leaves()
    if sharding.kind is ShardingKind.TUPLE:
        want = max(len(leaves), 1)  # XLA's RequiredLeaves: an empty tuple takes one
        if len(sharding.elements) != want:
            raise ValueError(
                f"tuple sharding has {len(sharding.elements)} elements, the shape {shape} "
                f"has {want} leaves (nested tuples flattened, empty ones not counted)"
            )
        for i, (element, leaf) in enumerate(zip(sharding.elements, leaves, strict=False)):
            try:
                _check_leaf(element, leaf)
            except ValueError as e:
                raise ValueError(f"element {i}: {e}") from None
        return sharding
    for leaf in leaves:
        _check_leaf(sharding, leaf)
    return HloSharding.tuple_([sharding] * max(len(leaves), 1))


def _check_leaf(sharding: HloSharding, leaf: Shape) -> None:
    if sharding.kind is ShardingKind.TUPLE:
        raise ValueError(f"a tuple sharding {sharding} for the array leaf {leaf}")
    if sharding.kind is ShardingKind.TILED:
        rank = len(sharding.data_tile_shape())
        if rank != leaf.rank:
            raise ValueError(f"sharding {sharding} tiles {rank} dims, {leaf} has {leaf.rank}")


def _set(inst: Instruction, sharding: HloSharding, problems: list[str]) -> None:
    try:
        inst.set_attr("sharding", fit_sharding(sharding, inst.shape))
    except ValueError as e:
        problems.append(f"%{inst.name} ({inst.shape}): {e}")


def root_sharding(root: Instruction, default: HloSharding | None) -> HloSharding:
    """The sharding an unannotated ROOT gets: its operands' for a tuple, else default."""
    fallback = default if default is not None else HloSharding.replicated()
    if root.opcode is not Opcode.TUPLE:
        return fallback
    elements: list[HloSharding] = []
    for op in root.operands:
        have = op.sharding if "sharding" in op.attrs else None
        if have is None:
            have = HloSharding.replicated()
        n = len(op.shape.leaves())
        if have.kind is ShardingKind.TUPLE:
            elements.extend(have.elements[:n])
        else:
            elements.extend([have] * n)
    return HloSharding.tuple_(elements) if elements else fallback


def _instructions_by_name(module: Module) -> dict[str, Instruction | None]:
    """Every instruction by name; None for a name used more than once."""
    found: dict[str, Instruction | None] = {}
    for inst in module.instructions():
        found[inst.name] = None if inst.name in found else inst
    return found
