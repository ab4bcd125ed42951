"""Baseline plans that rhino's O3 plan is compared with (Rhino §6, Alpa §8).

    data_parallel_plan(module, mesh, cluster) -> Plan

Plain data parallelism: every piece of step state (weights, optimizer buffers: the
entry parameters `builder.state_pairs` pairs with an output) is replicated, so each
device holds the whole model and all-reduces the gradients; every other entry parameter
(a data input) is split on its batch dimension, dim 0, over all devices (every mesh axis
of size > 1 splits dim 0, outer axis first: `RS0` on 1x8, `S0S0` on 2x4). A data input
whose dim 0 does not divide, or a scalar, is replicated and noted.

Pinning the parameters alone is not data parallelism: on a small batch the search then
prefers to all-gather the batch and compute replicated (cheaper than the gradient
all-reduce). So, as Alpa's `force_batch_dim_to_mesh_dim`, the batch split is carried
through the graph and every instruction that reads it is held to it:

    layout(v)  for each decision v, in program order:
      parameter      its pinned layout; bound if a split data input, else free
      instruction    M = strategies that read every bound operand u in layout(u); a
                     replicated bound operand may be read in any layout (slicing a
                     replicated tensor is local); free operands: any layout
                     no bound operand          -> all strategies, free
                     M has some without comm   -> of those, the most split result if a
                                                  bound operand is split, else the least
                     else (M contracts the batch) -> the all-reduced result (replicated)
                     M empty                   -> all strategies, free (counted as unmatched)
      loop carry     the layout of its initial value; made free where the body returns
                     it in another layout (repeated until the carries settle)

and a bound decision may choose only the strategies of M with that result. Free
decisions (weight-only computations, constants, what no rule can keep split) are left to
the O3 search with the rest fixed. So the gradient of a replicated weight is the
all-reduce of per-device partial gradients, and the update runs replicated. The
objective is evaluated on the unrestricted problem, so it compares directly with the O3
plan's, which is never worse when both solves are optimal.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from rhino.hlo.errors import ConfigError
from rhino.hlo.ir import Module
from rhino.search.cluster import Cluster
from rhino.search.mesh import DeviceMesh
from rhino.search.problem import ShardingProblem, Solution, SolveOptions
from rhino.search.spmd.builder import ShardingGraph, build_graph, state_pairs
from rhino.search.spmd.lp import WarmStart
from rhino.search.spmd.plan import Plan
from rhino.search.spmd.planner import PlanRequest, lifted, plan_combined, restrict
from rhino.search.spmd.solver import solve_ilp
from rhino.search.spmd.spec import Replicate, ShardingSpec, Split
from rhino.search.spmd.strategy import Strategy

LEVEL = "DP"
"""The `level` a data-parallel plan carries (its free decisions are searched as in O3)."""

Layout = tuple[ShardingSpec, ...]
"""The result layout of a bound decision, one spec per result leaf."""


@dataclass(frozen=True)
class DataParallelInputs:
    """The pinned layouts of the entry parameters, and why any input is not split."""

    pins: tuple[tuple[str, ShardingSpec], ...]
    """(entry parameter name, layout) for every entry parameter, in parameter order."""
    state: tuple[str, ...]
    """Parameters that are step state (replicated)."""
    data: tuple[str, ...]
    """Parameters that are data inputs (split on dim 0 where it divides)."""
    notes: tuple[str, ...] = ()
    """Data inputs left replicated, with the reason."""

    @property
    def split(self) -> tuple[str, ...]:
        """Data inputs that are split."""
        return tuple(name for name, spec in self.pins if not spec.is_replicated())


@dataclass(frozen=True)
class DataParallelChoices:
    """Which strategies each decision of a graph may take in the data-parallel plan."""

    allowed: dict[int, list[int]]
    """Node -> strategy indices it may choose (nodes not listed are free)."""
    bound: int
    """Decisions held to the batch split (or to the all-reduced result)."""
    free: int
    """Decisions left to the search (no bound operand)."""
    unmatched: tuple[str, ...]
    """Decisions with a bound operand but no strategy that reads it as it is (free)."""
    rounds: int
    """Propagation rounds until the loop carries settled."""


def batch_split(mesh: DeviceMesh) -> ShardingSpec:
    """Dim 0 split over every mesh axis of size > 1 (outer axis first); axes of size 1
    replicate."""
    return ShardingSpec(tuple(Split(0) if n > 1 else Replicate() for n in mesh.shape))


def data_parallel_inputs(
    module: Module, mesh: DeviceMesh, data_inputs: Collection[str] | None = None
) -> DataParallelInputs:
    """The data-parallel layout of every entry parameter of `module` (see module doc).

    `data_inputs` names the data inputs explicitly; by default they are the entry
    parameters that are not step state. Raises ConfigError when the module returns no
    state (nothing tells weights from data then) and no `data_inputs` are given, or when
    `data_inputs` names a parameter the entry does not have.
    """
    params = module.entry.parameters
    if data_inputs is None:
        state_numbers = {number for number, _ in state_pairs(module)}
        if not state_numbers:
            raise ConfigError(
                f"{module.name}: the step returns no updated state, so weights cannot be told "
                f"from data inputs; name the data inputs (data_inputs=...)"
            )
        is_data = [p.parameter_number not in state_numbers for p in params]
    else:
        unknown = set(data_inputs) - {p.name for p in params}
        if unknown:
            raise ConfigError(
                f"{module.name}: data inputs {', '.join(sorted(unknown))} are not entry "
                f"parameters (parameters: {', '.join(p.name for p in params)})"
            )
        is_data = [p.name in data_inputs for p in params]
    split = batch_split(mesh)
    replicated = ShardingSpec.replicated(mesh.ndim)
    pins: list[tuple[str, ShardingSpec]] = []
    notes: list[str] = []
    for p, data in zip(params, is_data, strict=True):
        spec = replicated
        if data:
            dims = () if p.shape.is_tuple else p.shape.dims
            if not dims:
                notes.append(f"%{p.name}: data input {p.shape} has no batch dim: replicated")
            elif dims[0] % mesh.size:
                notes.append(
                    f"%{p.name}: batch dim {dims[0]} of {p.shape} does not divide "
                    f"over {mesh.size} devices: replicated"
                )
            else:
                spec = split
        pins.append((p.name, spec))
    return DataParallelInputs(
        pins=tuple(pins),
        state=tuple(p.name for p, d in zip(params, is_data, strict=True) if not d),
        data=tuple(p.name for p, d in zip(params, is_data, strict=True) if d),
        notes=tuple(notes),
    )


def _split_devices(spec: ShardingSpec, mesh: DeviceMesh) -> int:
    """Devices a spec divides a tensor over (1 when replicated)."""
    return math.prod(n for n, a in zip(mesh.shape, spec.axes, strict=True) if isinstance(a, Split))


def _pick(matched: Sequence[Strategy], split_in: bool, mesh: DeviceMesh) -> Layout:
    """The result layout a bound decision keeps, from the strategies that read its bound
    operands as they are (cheapest first): see the module doc's table."""
    quiet = [s for s in matched if not s.comm]
    if quiet:
        spread = [sum(_split_devices(o, mesh) for o in s.outs) for s in quiet]
        best = max(spread) if split_in else min(spread)
        return next(s.outs for s, n in zip(quiet, spread, strict=True) if n == best)
    reduced = [s for s in matched if all(c.kind == "all-reduce" for c in s.comm)]
    return (reduced or list(matched))[0].outs


def data_parallel_choices(
    graph: ShardingGraph, split_inputs: Collection[str], max_rounds: int = 8
) -> DataParallelChoices:
    """Carry the batch split of `split_inputs` (entry parameters, pinned in `graph`)
    through `graph` and restrict every decision that reads it (see module doc)."""
    carried = [v for v, n in enumerate(graph.nodes) if n.carried]
    # loop carry -> its (init, body result) sources; an edge tells only the node, so only
    # single-result sources are followed
    carry_sources: dict[int, list[int | None]] = {c: [None, None] for c in carried}
    for u, v in graph.edges:
        if v in carry_sources and len(graph.nodes[u].leaf_shapes) == 1:
            carry_sources[v][0 if u < v else 1] = u
    unbound: set[int] = set()  # carries whose body returns them in another layout
    rounds = 0
    while rounds < max_rounds:
        rounds += 1
        layouts, allowed, unmatched = _propagate(graph, split_inputs, carry_sources, unbound)
        changed = False
        for c in carried:
            body = carry_sources[c][1]
            if c in unbound or c not in layouts or body is None:
                continue
            if layouts.get(body) != layouts[c]:
                unbound.add(c)
                changed = True
        if not changed:
            break
    free = sum(1 for v in range(len(graph.nodes)) if v not in allowed)
    names = tuple(graph.nodes[v].name for v in unmatched)
    return DataParallelChoices(allowed, len(allowed), free, names, rounds)


def _propagate(
    graph: ShardingGraph,
    split_inputs: Collection[str],
    carry_sources: dict[int, list[int | None]],
    unbound: set[int],
) -> tuple[dict[int, Layout], dict[int, list[int]], list[int]]:
    """One pass in program order: the layout of every bound decision, the strategies it
    may take, and the decisions left free for want of a matching strategy."""
    mesh = graph.mesh
    layouts: dict[int, Layout] = {}
    allowed: dict[int, list[int]] = {}
    unmatched: list[int] = []
    split_inputs = set(split_inputs)
    reads: dict[int, list[tuple[int, int, int]]] = {}  # v -> (operand, source node, leaf)
    for (w, j), (u, leaf) in graph.operand_sources.items():
        reads.setdefault(w, []).append((j, u, leaf))
    for v, node in enumerate(graph.nodes):
        if node.carried:
            init = carry_sources[v][0]
            if v in unbound or init is None or init not in layouts:
                continue
            want = layouts[init]
            ks = [k for k, s in enumerate(node.strategies) if s.outs == want]
            if ks:
                layouts[v], allowed[v] = want, ks
            continue
        if node.inst.opcode.value == "parameter":
            if node.name in split_inputs:
                layouts[v] = node.strategies[0].outs  # pinned: its only strategy
                allowed[v] = [0]
            continue
        bound = {j: layouts[u][leaf] for j, u, leaf in reads.get(v, ()) if u in layouts}
        if not bound:
            continue
        matched = [
            (k, s)
            for k, s in enumerate(node.strategies)
            if all(
                want.is_replicated() or j >= len(s.ins) or s.ins[j] in (None, want)
                for j, want in bound.items()
            )
        ]
        if not matched:
            unmatched.append(v)
            continue
        split_in = any(not spec.is_replicated() for spec in bound.values())
        keep = _pick([s for _, s in matched], split_in, mesh)
        layouts[v] = keep
        allowed[v] = [k for k, s in matched if s.outs == keep]
    return layouts, allowed, unmatched


def data_parallel_plan(
    module: Module,
    mesh: DeviceMesh,
    cluster: Cluster,
    *,
    budget_bytes: float | None = None,
    solve: SolveOptions | None = None,
    data_inputs: Collection[str] | None = None,
    max_strategies: int = 64,
    progress: Callable[[str], None] | None = None,
) -> Plan:
    """The plain data-parallel plan of `module` on `mesh` (see module doc).

    The plan's `level` is "DP"; its warnings say which data inputs stay replicated and
    how many decisions the batch split left to the search. Raises ConfigError (see
    `data_parallel_inputs`), InfeasibleError when the replicated state does not fit
    `budget_bytes`.
    """
    say = progress or (lambda _msg: None)
    solve = solve or SolveOptions()
    start = time.perf_counter()
    inputs = data_parallel_inputs(module, mesh, data_inputs)
    request = PlanRequest(
        mesh,
        cluster,
        LEVEL,
        budget_bytes,
        pins=inputs.pins,
        solve=solve,
        max_strategies=max_strategies,
    )
    say("building strategies")
    graph = build_graph(
        module,
        mesh,
        cluster,
        pins=dict(inputs.pins),
        max_strategies=max_strategies,
        state=request.state,
        strides=request.strides,
    )
    choices = data_parallel_choices(graph, inputs.split)
    say(f"solving: {choices.free} of {len(graph.nodes)} decisions free")

    def solve_restricted(
        problem: ShardingProblem, warm: WarmStart, options: SolveOptions
    ) -> Solution:
        sub, back = restrict(problem, choices.allowed)  # the same nodes for every plan
        return lifted(solve_ilp(sub, options, warm=warm), problem, back)

    plan = plan_combined(graph, request, solve_restricted, solve.started(), say, {})
    plan = dataclasses.replace(plan, search_time_s=time.perf_counter() - start)
    notes = [
        *inputs.notes,
        f"{choices.bound} of {len(graph.nodes)} decisions held to the batch "
        f"split, {choices.free} left to the search",
    ]
    if choices.unmatched:
        shown = ", ".join(f"%{n}" for n in choices.unmatched[:5])
        more = f" and {len(choices.unmatched) - 5} more" if len(choices.unmatched) > 5 else ""
        notes.append(
            f"no strategy reads the batch split as it is at {shown}{more}: searched freely"
        )
    return dataclasses.replace(
        plan, warnings=(*plan.warnings, *(f"data parallel: {n}" for n in notes))
    )
