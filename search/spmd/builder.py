"""From an HLO module and a mesh to a sharding problem: nodes, strategies, edge costs.

    build_graph(module, mesh, cluster) -> ShardingGraph

Pre: `module` verifies. Calls and fusions are inlined first (`hlo.passes.flatten`).
Nodes are the instructions of the entry computation and of while bodies (weighted by the
loop's trip count), plus one node per array leaf of every while loop's carried tuple:
the body's parameter, the body's result and the loop's result all hold a carried value
in that node's layout, which is how the body is planned consistently with the loop.
`tuple` and `get-tuple-element` are not nodes: an edge runs from the instruction that
produced an array leaf to the instruction that reads it.

Edge (u, v) costs C[k][l] = reshard time of the tensor from u's strategy k result layout
to the layout v's strategy l reads it in, times v's weight.
"""

from __future__ import annotations

import functools
import gc
import math
import re
from dataclasses import dataclass, field

import numpy as np

from rhino.hlo.analysis import while_trip_count
from rhino.hlo.errors import InfeasibleError
from rhino.hlo.ir import Computation, Instruction, Module
from rhino.hlo.opcode import Opcode
from rhino.hlo.passes import flatten
from rhino.hlo.shape import Shape
from rhino.search.cluster import Cluster
from rhino.search.mesh import DeviceMesh
from rhino.search.spmd.comm import GroupKey, latency_by_key
from rhino.search.spmd.reshard import reshard
from rhino.search.spmd.rules import strategies as rule_strategies
from rhino.search.spmd.rules import unmodelled
from rhino.search.spmd.spec import ShardingSpec
from rhino.search.spmd.strategy import Context, Strategy, candidate_specs, strided_candidates

PASS_THROUGH = (Opcode.TUPLE, Opcode.GET_TUPLE_ELEMENT)


@dataclass
class GraphNode:
    """One decision: the strategy of an instruction (or of a while loop's carried leaf)."""

    name: str
    """Instruction name, or `<while>#<leaf>` for a carried value."""
    inst: Instruction
    """The instruction (the while loop, for a carried value)."""
    strategies: list[Strategy]
    """Its strategies; index k is the ILP's choice k."""
    weight: float = 1.0
    """How often it runs per step (a while body's trip count)."""
    leaf_shapes: tuple[Shape, ...] = ()
    """Array shape of each result leaf."""
    order: int = 0
    """Position in program order (for liveness)."""
    last_use: int = 0
    """Position of the last reader (for liveness)."""
    carried: bool = False
    """Is this a while loop's carried value?"""
    quiet: bool = False
    """Nothing heavy (a dot, a convolution, a loop, a call) reads its result, even through
    other instructions (a gradient on its way into the optimizer update): the collectives
    that make its result do not depend on each other, and XLA combines them
    (`rhino.search.spmd.comm.COMBINE_THRESHOLD_BYTES`)."""
    tail: bool = False
    """Quiet and not heavy itself: the conversions of its operands are combined too."""
    kind: int = -1
    """Index of its strategy list in `ShardingGraph.kinds`: instructions alike in
    everything the rules read (repeated layers) share one list, and edge matrices and
    cost vectors are computed once per kind."""

    def memory(self, k: int, mesh: DeviceMesh) -> float:
        """Bytes per device of the results under strategy k."""
        s = self.strategies[k]
        return float(
            sum(
                math.prod(spec.shard_shape(shape.dims, mesh)) * shape.element_bytes
                for spec, shape in zip(s.outs, self.leaf_shapes, strict=False)
            )
        )


@dataclass
class ShardingGraph:
    """The search space of one module on one mesh (before it becomes an ILP)."""

    module: Module
    """The module planned (calls and fusions inlined)."""
    mesh: DeviceMesh
    cluster: Cluster
    nodes: list[GraphNode] = field(default_factory=list)
    edges: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    """(u, v) -> cost matrix [len(u.strategies), len(v.strategies)] in seconds."""
    state: list[tuple[str, int]] = field(default_factory=list)
    """(parameter name, output leaf) pairs of state carried from step to step."""
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the user may want to know that is not a problem (state taken by shape)."""
    """Opcodes planned replicated because rhino does not model them, and the like."""
    index: dict[str, int] = field(default_factory=dict)
    """Node name -> position in `nodes`."""
    operand_sources: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    """(node, operand index) -> (node, result leaf) that operand is read from."""
    backward: set[tuple[int, int]] = field(default_factory=set)
    """Edges that point backwards in program order: a loop body's result into the
    carried value it updates, a step's updated state into its parameter."""
    kinds: list[list[Strategy]] = field(default_factory=list)
    """Distinct strategy lists (see `GraphNode.kind`)."""
    combined: dict[tuple[int, int], dict[GroupKey, np.ndarray]] = field(default_factory=dict)
    """Edges whose conversions XLA combines with others (into a `tail` node, the step's
    state edges) -> the latency of those collectives per group key, as matrices like
    `edges`; `edges` leaves it out (see `rhino.search.spmd.combine`)."""

    def node(self, name: str) -> GraphNode:
        return self.nodes[self.index[name]]

    @functools.cached_property
    def state_leaf(self) -> dict[str, int]:
        """Parameter name -> the (first) output leaf of the step that updates it."""
        found: dict[str, int] = {}
        for name, leaf in self.state:
            found.setdefault(name, leaf)
        return found


def build_graph(
    module: Module,
    mesh: DeviceMesh,
    cluster: Cluster,
    *,
    pins: dict[str, ShardingSpec] | None = None,
    max_strategies: int = 64,
    state: bool = True,
    strides: bool = True,
) -> ShardingGraph:
    """The nodes, strategies and edge costs of `module` on `mesh` (see module doc).

    With `strides`, layouts with non-maximal strides are candidates where a reshape
    makes them useful (§4.3.3); without, every spec uses maximal strides.
    With `state`, the step's updated state (see `state_pairs`) must come back in the
    layout its parameter arrives in, as the next step will read it: an edge from each
    output leaf to its parameter costs the reshard between the two.
    """
    # ~10 objects per instruction, none freed: the cyclic GC would rescan the growing
    # heap over and over (a quarter of the time on the 72-layer GPT), as in the parser
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(module, mesh, cluster, pins, max_strategies, state, strides)
    finally:
        if gc_was_enabled:
            gc.enable()


def _build(
    module: Module,
    mesh: DeviceMesh,
    cluster: Cluster,
    pins: dict[str, ShardingSpec] | None,
    max_strategies: int,
    state: bool,
    strides: bool,
) -> ShardingGraph:
    flat = flatten(module)
    strided = strided_candidates(list(flat.instructions()), mesh) if strides else {}
    ctx = Context(mesh, cluster, max_strategies, dict(pins or {}), strided)
    graph = ShardingGraph(flat, mesh, cluster)
    pairs = state_pairs(flat) if state else []
    builder = _Builder(graph, ctx, reaches_heavy(flat.entry))
    builder.computation(flat.entry, weight=1.0, params=None)
    if state:
        builder.state_edges(pairs)
        if pairs and "input_output_alias" not in flat.attrs:
            graph.notes.append(
                f"the module has no input_output_alias: {len(pairs)} outputs were taken for "
                "updated "
                "state by equal shape and order, each kept in its parameter's layout (donate the "
                "state when lowering, e.g. jax.jit(..., donate_argnums=...), to say which)"
            )
    unknown_pins = set(ctx.pinned) - set(graph.index)
    if unknown_pins:
        raise InfeasibleError(
            f"pinned instructions not found in {module.name}: {', '.join(sorted(unknown_pins))}"
        )
    return graph


UNREAD_ATTRIBUTES = frozenset(
    {
        "metadata",
        "to_apply",
        "calls",
        "body",
        "condition",
        "select",
        "scatter",
        "branch_computations",
        "frontend_attributes",
        "sharding",
        "statistics",
    }
)
"""Attributes no rule reads (names of called computations, provenance): instructions
that differ only in these get the same strategies."""


def _signature(
    inst: Instruction, ctx: Context, read: dict[str, tuple[tuple[str, str], ...]]
) -> tuple[object, ...]:
    """Everything `rules.strategies` reads of `inst` (see UNREAD_ATTRIBUTES). `read`
    memoizes the attributes read by attribute text: repeated layers repeat the text, and
    most instructions then never split theirs."""
    text = inst.attr_text
    attrs = read.get(text)
    if attrs is None:
        attrs = read[text] = tuple(
            sorted((k, v) for k, v in inst.attrs.items() if k not in UNREAD_ATTRIBUTES)
        )
    operands, strided = inst.operands, ctx.strided
    return (
        inst.opcode_text,
        inst.shape,
        tuple([op.shape for op in operands]),
        attrs,
        strided.get(inst.name),
        tuple([strided.get(op.name) for op in operands]),
        ctx.pinned.get(inst.name),
    )


_ALIAS = re.compile(r"\{\s*(\d*)\s*\}\s*:\s*\(\s*(\d+)\s*,\s*\{\s*\}")


def state_pairs(module: Module) -> list[tuple[int, int]]:
    """(parameter number, output leaf) pairs: state a training step returns updated.

    From `input_output_alias` when the module has one (donated buffers); otherwise the
    parameters and the output leaves are paired in order by equal shape (a step
    `(params, opt_state, batch) -> (loss, params, opt_state)` pairs every parameter and
    optimizer buffer with its update).
    """
    entry = module.entry
    root = entry.root
    leaves = root.shape.leaves() if root is not None else []
    alias = module.attrs.get("input_output_alias")
    if alias:
        pairs = []
        for out, param in _ALIAS.findall(alias):
            pairs.append((int(param), int(out) if out else 0))
        return pairs
    params = entry.parameters
    pairs = []
    j = 0
    for p in params:
        k = j
        while k < len(leaves) and (leaves[k].dims, leaves[k].dtype) != (
            p.shape.dims,
            p.shape.dtype,
        ):
            k += 1
        if k < len(leaves):
            pairs.append((p.parameter_number or 0, k))
            j = k + 1
    return pairs if len(pairs) >= 1 and root is not None and root.shape.is_tuple else []


HEAVY = frozenset(
    {
        Opcode.DOT,
        Opcode.CONVOLUTION,
        Opcode.WHILE,
        Opcode.CALL,
        Opcode.CONDITIONAL,
        Opcode.CUSTOM_CALL,
        Opcode.UNKNOWN,
    }
)
"""Opcodes whose collectives and inputs are on the step's critical path (with what may
hide one: loops, calls, custom calls and opcodes rhino does not model)."""


def reaches_heavy(comp: Computation) -> dict[int, bool]:
    """id of each instruction of `comp` -> is it, or does anything that reads it, even
    through other instructions, heavy (`HEAVY`)?"""
    found: dict[int, bool] = {}
    for inst in reversed(comp.instructions):
        found[id(inst)] = inst.opcode in HEAVY or any(found.get(id(u), True) for u in inst.users)
    return found


# a leaf source: (node index, leaf index within that node's results)
Source = tuple[int, int]


class _Builder:
    def __init__(self, graph: ShardingGraph, ctx: Context, heavy: dict[int, bool]) -> None:
        self.graph = graph
        self.ctx = ctx
        self.heavy = heavy
        """Entry instruction -> `reaches_heavy` (absent: inside a loop body, taken as heavy)."""
        self.clock = 0
        # instruction -> the sources of its array leaves, in leaf order
        self.leaves: dict[int, list[Source | None]] = {}
        self.warned: set[str] = set()
        self.kind_of: dict[tuple[object, ...], int] = {}
        self.kind_leaves: dict[int, tuple[Shape, ...]] = {}
        """Kind of instruction -> the array shapes of its result leaves."""
        self.read_attrs: dict[str, tuple[tuple[str, str], ...]] = {}
        """Attribute text -> the attributes rules read (`_signature`)."""
        # (kind of u, leaf, kind of v, slot, combined) -> unweighted edge matrix and its
        # combined latencies (`_matrix`); slot is the operand index v reads, or -1 for v's
        # own result layout (carried values, state)
        self.matrices: dict[
            tuple[int, int, int, int, bool], tuple[np.ndarray, dict[GroupKey, np.ndarray]]
        ] = {}
        # (dims, element bytes, u's layouts, the layouts v reads, combined) -> `_matrix`
        self.layout_matrices: dict[
            tuple[object, ...], tuple[np.ndarray, dict[GroupKey, np.ndarray]]
        ] = {}

    def kind(self, key: tuple[object, ...], make) -> int:  # type: ignore[no-untyped-def]
        """The index of the strategy list for `key`, made by `make()` the first time."""
        k = self.kind_of.get(key)
        if k is None:
            k = self.kind_of[key] = len(self.graph.kinds)
            self.graph.kinds.append(make())
        return k

    def add_node(self, node: GraphNode) -> int:
        node.order = node.last_use = self.clock
        self.clock += 1
        self.graph.index[node.name] = len(self.graph.nodes)
        self.graph.nodes.append(node)
        return len(self.graph.nodes) - 1

    def computation(
        self, comp: Computation, weight: float, params: list[Source | None] | None
    ) -> None:
        """Add the instructions of `comp`; `params` are the carried leaves of a while body."""
        for inst in comp.instructions:
            if inst.opcode is Opcode.PARAMETER and params is not None:
                self.leaves[id(inst)] = list(params)
            elif inst.opcode is Opcode.TUPLE:
                self.leaves[id(inst)] = [src for op in inst.operands for src in self.leaves[id(op)]]
            elif inst.opcode is Opcode.GET_TUPLE_ELEMENT:
                self.leaves[id(inst)] = self._element(inst)
            elif inst.opcode is Opcode.WHILE:
                self.while_loop(inst, weight)
            else:
                self.instruction(inst, weight)

    def _element(self, gte: Instruction) -> list[Source | None]:
        tuple_shape = gte.operands[0].shape
        index = gte.attr("index")
        start = sum(len(e.leaves()) for e in tuple_shape.elements[:index])
        count = len(tuple_shape.elements[index].leaves())
        return self.leaves[id(gte.operands[0])][start : start + count]

    def instruction(self, inst: Instruction, weight: float) -> None:
        signature = _signature(inst, self.ctx, self.read_attrs)
        kind = self.kind_of.get(signature)
        if kind is None:
            kind = self.instruction_kind(inst, signature)
        leaves = self.kind_leaves[kind]
        quiet = tail = False
        heavy = self.heavy.get(id(inst))
        if heavy is not None:  # an entry instruction: quiet when no reader reaches heavy,
            # which `reaches_heavy` has said already unless the instruction is heavy itself
            if inst.opcode in HEAVY:
                quiet = not any(self.heavy.get(id(u), True) for u in inst.users)
            else:
                quiet = tail = not heavy
        v = self.add_node(
            GraphNode(
                inst.name,
                inst,
                self.graph.kinds[kind],
                weight,
                leaves,
                quiet=quiet,
                tail=tail,
                kind=kind,
            )
        )
        self.leaves[id(inst)] = [(v, i) for i in range(len(leaves))]
        for j, op in enumerate(inst.operands):
            sources = self.leaves.get(id(op), [])
            if len(sources) != 1:
                continue  # a tuple-typed operand: read as is (rules replicate those)
            if sources[0] is not None:
                self.graph.operand_sources[(v, j)] = sources[0]
            self.edge(sources[0], v, j, weight)

    def instruction_kind(self, inst: Instruction, signature: tuple[object, ...]) -> int:
        """The kind of the first instruction with `signature`: its strategies (raising
        when a pin leaves none), a warning the first time an opcode is not modelled (its
        first instruction is the first of a kind, as the signature holds the opcode)."""
        kind = self.kind(signature, lambda: rule_strategies(inst, self.ctx))
        if not self.graph.kinds[kind]:
            pinned = self.ctx.pinned.get(inst.name)
            raise InfeasibleError(
                f"%{inst.name}: pinned layout {pinned} is not one rhino can give it "
                f"({inst.opcode_text} {inst.shape})"
            )
        if unmodelled(inst) and inst.opcode_text not in self.warned:
            self.warned.add(inst.opcode_text)
            self.graph.warnings.append(
                f"opcode {inst.opcode_text} is not modelled: %{inst.name} and others like it "
                "are planned replicated"
            )
        self.kind_leaves[kind] = tuple(inst.shape.leaves())
        return kind

    def edge(
        self,
        src: Source | None,
        v: int,
        slot: int,
        weight: float,
        backward: bool = False,
        combined: bool | None = None,
    ) -> None:
        """Add the cost of bringing leaf `src` into the layout each strategy of v wants:
        the layout it reads operand `slot` in, or (slot -1) its own result layout.
        `combined`: XLA combines the conversion's collectives with others, so their
        latency goes to `ShardingGraph.combined`, not the edge's cost; by default when v
        is `tail`."""
        if src is None:
            return
        u, leaf = src
        if u == v:
            return  # a loop body passing a carried value through unchanged: no conversion
        nu, nv = self.graph.nodes[u], self.graph.nodes[v]
        if nu.last_use < self.clock:
            nu.last_use = self.clock
        combined = nv.tail if combined is None else combined
        key = (nu.kind, leaf, nv.kind, slot, combined)
        found = self.matrices.get(key)
        if found is None:
            found = self.matrices[key] = self._matrix(nu, leaf, nv, slot, combined)
        edge = (u, v)
        # unweighted edges share the cached (read-only) matrices
        matrix, latencies = found
        if weight != 1.0:
            matrix = matrix * weight
            latencies = {group: m * weight for group, m in latencies.items()}
        edges = self.graph.edges
        edges[edge] = edges[edge] + matrix if edge in edges else matrix
        if combined:
            into = self.graph.combined.setdefault(edge, {})
            for group, m in latencies.items():
                into[group] = into[group] + m if group in into else m
        if backward:
            self.graph.backward.add(edge)

    def _matrix(
        self, nu: GraphNode, leaf: int, nv: GraphNode, slot: int, combined: bool
    ) -> tuple[np.ndarray, dict[GroupKey, np.ndarray]]:
        """Seconds to bring u's result leaf from each of u's layouts into the one each
        strategy of v wants (0 where v does not read it); `combined`: without the latency
        of the collectives XLA combines, which comes second, per group key.

        Kinds that differ elsewhere often agree on these layouts (a dot's and an add's
        strategies both read S0R, S1R, ...): the matrices are made once per layout
        signature and shared by those kinds."""
        shape = nu.leaf_shapes[leaf]
        sources = tuple(su.outs[leaf] for su in nu.strategies)
        targets = tuple(
            sv.outs[0] if slot < 0 else sv.ins[slot] if slot < len(sv.ins) else None
            for sv in nv.strategies
        )
        key = (shape.dims, shape.element_bytes, sources, targets, combined)
        found = self.layout_matrices.get(key)
        if found is None:
            found = self.layout_matrices[key] = self._layout_matrix(
                shape, sources, targets, combined
            )
        return found

    def _layout_matrix(
        self,
        shape: Shape,
        sources: tuple[ShardingSpec, ...],
        targets: tuple[ShardingSpec | None, ...],
        combined: bool,
    ) -> tuple[np.ndarray, dict[GroupKey, np.ndarray]]:
        """`_matrix` for a `shape` tensor from each layout of `sources` into each of
        `targets` (None: not read, 0)."""
        # strategies share layouts: price each distinct (source, destination) pair once
        distinct: dict[ShardingSpec, int] = {}
        src_of = [distinct.setdefault(src, len(distinct)) for src in sources]
        wanted: dict[ShardingSpec, int] = {}
        dst_of = [-1 if dst is None else wanted.setdefault(dst, len(wanted)) for dst in targets]
        prices = np.zeros((len(distinct), len(wanted) + 1))  # the last column: no reading
        latencies: dict[GroupKey, np.ndarray] = {}
        for a, src in enumerate(distinct):
            for b, dst in enumerate(wanted):
                r = reshard(
                    shape.dims, shape.element_bytes, src, dst, self.graph.mesh, self.graph.cluster
                )
                prices[a, b] = r.seconds
                if combined:
                    for group, alpha in latency_by_key(
                        r.steps, self.graph.mesh, self.graph.cluster
                    ).items():
                        latencies.setdefault(group, np.zeros_like(prices))[a, b] = alpha
                        prices[a, b] -= alpha
        pick = np.ix_(src_of, dst_of)
        matrix, by_group = prices[pick], {group: m[pick] for group, m in latencies.items()}
        for m in (matrix, *by_group.values()):
            m.flags.writeable = False  # edges share them
        return matrix, by_group

    def state_edges(self, pairs: list[tuple[int, int]]) -> None:
        """Output leaf -> parameter edges: the next step reads the update in the parameter's
        layout."""
        entry = self.graph.module.entry
        params = {p.parameter_number: p for p in entry.parameters}
        outputs = self.leaves.get(id(entry.root), []) if entry.root is not None else []
        for number, leaf in pairs:
            param = params.get(number)
            if param is None or param.name not in self.graph.index or leaf >= len(outputs):
                continue
            v = self.graph.index[param.name]
            # the step's last conversions, of its outputs only: combined
            self.edge(outputs[leaf], v, -1, 1.0, backward=True, combined=True)
            self.graph.state.append((param.name, leaf))

    def while_loop(self, inst: Instruction, weight: float) -> None:
        """Carried leaves become nodes; init, body parameter, body result and the loop's
        result all use them. The body runs `trip count` times per run of the loop."""
        trips = while_trip_count(inst).count
        if trips is None:
            trips = 1
            self.graph.warnings.append(f"%{inst.name}: trip count unknown, body costs counted once")
        body = next(c for c in inst.called if c.name == inst.attr("body"))
        init = self.leaves[id(inst.operands[0])]
        carried_nodes: list[Source] = []
        for i, shape in enumerate(inst.shape.leaves()):
            specs = (
                candidate_specs(shape.dims, self.ctx.mesh)
                if shape.dtype not in ("token", "opaque")
                else ()
            )
            kind = self.kind(
                ("carried", shape, specs),
                lambda specs=specs: (
                    [Strategy(str(s), (s,), (), 0.0) for s in specs]
                    or [Strategy("-", (candidate_specs((), self.ctx.mesh)[0],), (), 0.0)]
                ),
            )
            name = f"{inst.name}#{i}"
            c = self.add_node(
                GraphNode(
                    name, inst, self.graph.kinds[kind], weight, (shape,), carried=True, kind=kind
                )
            )
            self.graph.nodes[c].last_use = self.clock
            self.edge(init[i] if i < len(init) else None, c, -1, weight)
            carried_nodes.append((c, 0))
        self.computation(body, weight * trips, list(carried_nodes))
        assert body.root is not None
        results = self.leaves[id(body.root)]
        for src, (node, _) in zip(results, carried_nodes, strict=False):
            self.edge(src, node, -1, weight * trips, backward=True)
        for node, _ in carried_nodes:
            self.graph.nodes[node].last_use = self.clock
        self.leaves[id(inst)] = list(carried_nodes)
