"""The sharding problem as plain data, and an evaluation of any answer to it.

A `ShardingProblem` is what every solver (the whole-graph ILP of O3, the cone/segment
search of O2, brute force in tests) works on: nodes with per-strategy costs and memory,
edges with cost matrices, optionally a per-device memory budget with liveness. Nothing
here knows about HLO. `evaluate(choice)` recomputes cost and peak memory from scratch
and raises InfeasibleError for an answer over budget, so no solver is trusted blindly.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rhino.hlo.collector import collector_paused
from rhino.hlo.errors import InfeasibleError
from rhino.search.packing import Packed, distinct, pack, unpack
from rhino.search.units import format_bytes

FEASIBILITY = 1e-9
"""Relative slack of every feasibility test against a limit (a memory budget, a stage's
capacity or floor): sums of floats that equal the limit on paper pass."""


@dataclass(frozen=True, eq=False)
class ProblemNode:
    """One decision."""

    name: str
    """Unique name (an instruction name)."""
    labels: tuple[str, ...]
    """A label per strategy, for reports."""
    cost: np.ndarray
    """Seconds per strategy (compute and the node's own collectives)."""
    memory: np.ndarray
    """Bytes per device per strategy (the node's results)."""
    live: tuple[int, int] = (0, 0)
    """First and last program step at which the results are held."""
    heavy: bool = False
    """Is it compute-heavy (a dot, a convolution, a large share of the FLOPs)? O2 cuts
    the program into segments at the heavy nodes of its critical path."""

    def __post_init__(self) -> None:
        n = len(self.labels)
        if n == 0:
            raise ValueError(f"node {self.name}: no strategies")
        if self.cost.shape != (n,) or self.memory.shape != (n,):
            raise ValueError(
                f"node {self.name}: {n} strategies but cost {self.cost.shape}, "
                f"memory {self.memory.shape}"
            )


@dataclass(frozen=True, eq=False)
class ProblemEdge:
    """Cost of every pair of strategies of two nodes (resharding between them)."""

    u: int
    v: int
    cost: np.ndarray
    """[len(u strategies), len(v strategies)] seconds."""
    backward: bool = False
    """Does the edge point backwards in program order (u after v): a loop body's
    result into the carried value it updates, a step's updated state into its
    parameter? Coarsening keeps the forward edges' graph acyclic by leaving these out."""


@dataclass(frozen=True, eq=False)
class ShardingProblem:
    """Choose one strategy per node; minimize node plus edge costs; fit the budget."""

    nodes: tuple[ProblemNode, ...]
    edges: tuple[ProblemEdge, ...] = ()
    budget: float | None = None
    """Bytes per device; None for no limit."""
    constant_memory: float = 0.0
    """Bytes held on every device whatever the choice (outside the nodes)."""

    def __post_init__(self) -> None:
        for e in self.edges:
            nu, nv = len(self.nodes[e.u].labels), len(self.nodes[e.v].labels)
            if e.cost.shape != (nu, nv):
                raise ValueError(
                    f"edge ({self.nodes[e.u].name}, {self.nodes[e.v].name}): cost matrix is "
                    f"{e.cost.shape[0]}x{e.cost.shape[1]}, expected {nu}x{nv}"
                )

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as a few flat arrays (`rhino.search.packing`), not object by object: the
        combined-collectives search sends its first problem to each worker (the 48-layer
        GPT-2's, 57k nodes and 84k edges, took 1.15 s to pickle and as long to read)."""
        nodes, edges = self.nodes, self.edges
        distinct_labels, labels = distinct(n.labels for n in nodes)  # shared by kind
        arrays, at = pack(
            [n.cost for n in nodes] + [n.memory for n in nodes] + [e.cost for e in edges]
        )
        node_fields = (
            [n.name for n in nodes],
            distinct_labels,
            labels,
            np.array([(*n.live, n.heavy) for n in nodes], dtype=np.int64).reshape(-1, 3),
        )
        edge_fields = np.array([(e.u, e.v, e.backward) for e in edges], dtype=np.int64)
        edge_fields = edge_fields.reshape(-1, 3)  # (an empty list's array is 1-D)
        fields = (node_fields, edge_fields, arrays, at, self.budget, self.constant_memory)
        return _unpickled_problem, fields

    @property
    def size(self) -> tuple[int, int, int]:
        """(nodes, edges, strategy pairs over all edges)."""
        return len(self.nodes), len(self.edges), int(sum(e.cost.size for e in self.edges))

    def evaluate(self, choice: tuple[int, ...] | list[int]) -> Evaluation:
        """Cost and peak memory of `choice`, computed independently of any solver."""
        if len(choice) != len(self.nodes):
            raise ValueError(f"choice has {len(choice)} entries for {len(self.nodes)} nodes")
        for n, k in zip(self.nodes, choice, strict=True):
            if not 0 <= k < len(n.labels):
                raise ValueError(
                    f"node {n.name}: strategy {k} of {len(n.labels)} (0 to {len(n.labels) - 1})"
                )
        node_cost = float(sum(n.cost[k] for n, k in zip(self.nodes, choice, strict=True)))
        edge_cost = float(sum(e.cost[choice[e.u], choice[e.v]] for e in self.edges))
        peak, step, top = self.peak_memory(choice)
        if self.budget is not None and peak > self.budget * (1 + FEASIBILITY):
            name, size = top
            raise InfeasibleError(
                f"peak {format_bytes(peak)} > budget {format_bytes(self.budget)} at step "
                f"{step} (largest: %{name} {format_bytes(size)})"
            )
        return Evaluation(node_cost + edge_cost, node_cost, edge_cost, peak)

    def peak_memory(
        self, choice: tuple[int, ...] | list[int]
    ) -> tuple[float, int, tuple[str, float]]:
        """(peak bytes per device, the step where it occurs, the largest node live then)."""
        events: dict[int, float] = {}
        for n, k in zip(self.nodes, choice, strict=True):
            m = float(n.memory[k])
            events[n.live[0]] = events.get(n.live[0], 0.0) + m
            events[n.live[1] + 1] = events.get(n.live[1] + 1, 0.0) - m
        level, peak, at = self.constant_memory, self.constant_memory, 0
        for step in sorted(events):
            level += events[step]
            if level > peak:
                peak, at = level, step
        live = [
            (n.name, float(n.memory[k]))
            for n, k in zip(self.nodes, choice, strict=True)
            if n.live[0] <= at <= n.live[1]
        ]
        return peak, at, max(live, key=lambda t: t[1], default=("-", 0.0))


@collector_paused()  # 71k-141k objects: collections on the way would walk them (0.4 s)
def _unpickled_problem(
    node_fields: tuple[list[str], list[tuple[str, ...]], np.ndarray, np.ndarray],
    edge_fields: np.ndarray,
    arrays: Packed,
    at: np.ndarray,
    budget: float | None,
    constant_memory: float,
) -> ShardingProblem:
    """The problem `ShardingProblem.__reduce__` describes. Its objects are made by their
    classes (filling an object's __dict__ directly would give each its own dict: 30 MiB
    more in each worker of the 48-layer GPT-2's search)."""
    names, distinct_labels, labels, steps = node_fields
    unpacked = unpack(arrays)
    count = len(names)
    cost = [unpacked[i] for i in at[:count].tolist()]
    memory = [unpacked[i] for i in at[count : 2 * count].tolist()]
    matrices = [unpacked[i] for i in at[2 * count :].tolist()]
    nodes = [
        ProblemNode(name, distinct_labels[k], c, m, (first, last), bool(heavy))
        for name, k, (first, last, heavy), c, m in zip(
            names, labels.tolist(), steps.tolist(), cost, memory, strict=True
        )
    ]
    edges = [
        ProblemEdge(u, v, matrix, bool(backward))
        for (u, v, backward), matrix in zip(edge_fields.tolist(), matrices, strict=True)
    ]
    return ShardingProblem(tuple(nodes), tuple(edges), budget, constant_memory)


class Usage:
    """Bytes per device at every program step of a problem, under a choice, kept up to
    date as nodes change strategy. Steps are compressed to the points where some node's
    interval starts or ends."""

    def __init__(self, problem: ShardingProblem, choice: tuple[int, ...] | list[int]):
        nodes = problem.nodes
        first = np.array([n.live[0] for n in nodes], dtype=np.int64)
        after = np.array([n.live[1] + 1 for n in nodes], dtype=np.int64)
        self.steps = np.unique(np.concatenate([first, after]))
        self.lo = np.searchsorted(self.steps, first)
        self.hi = np.searchsorted(self.steps, after)
        held = np.array([n.memory[k] for n, k in zip(nodes, choice, strict=True)], dtype=float)
        delta = np.zeros(len(self.steps) + 1)
        np.add.at(delta, self.lo, held)
        np.add.at(delta, self.hi, -held)
        self.level = problem.constant_memory + np.cumsum(delta)[:-1]

    def peak(self) -> float:
        return float(self.level.max(initial=0.0))

    def over(self, budget: float) -> np.ndarray:
        """Steps (program steps, not compressed) where the level exceeds `budget`."""
        return self.steps[np.flatnonzero(self.level > budget * (1 + FEASIBILITY))]

    def highest(self, v: int) -> float:
        """The highest level while node v is live."""
        return float(self.level[self.lo[v] : self.hi[v]].max(initial=0.0))

    def move(self, v: int, change: float) -> None:
        self.level[self.lo[v] : self.hi[v]] += change


@dataclass(frozen=True)
class Evaluation:
    objective: float
    """Total seconds."""
    node_cost: float
    edge_cost: float
    peak_memory: float
    """Bytes per device."""


class SolveStatus(enum.Enum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    """A plan, not proven optimal (time limit)."""


@dataclass(frozen=True)
class Tuning:
    """The searches' tuning knobs, at the values they were measured best with (the
    figures: scripts/bench_search.py, bench_o2.py, bench_iopddl.py, bench_pipeline.py).
    Tests set them to reach paths a small problem does not take."""

    whole_core_pairs: int = 1_000_000
    """O2 (`rhino.search.spmd.merge`): a core with at most this many strategy pairs on
    its edges is first tried as one ILP (level 2, seconds); a larger one, or one whose
    ILP is not proven optimal in its share of the time, goes by segments (level 3), the
    ILP's plan among the starts."""
    segment_nodes: int = 80
    """O2: core nodes per segment, roughly: segments between critical nodes are merged up
    to this size, and larger ones split."""
    wide_passes: int = 1
    """O2's level 3: passes over the wide windows (a segment and its two most coupled)
    after the narrow ones (a segment and its most coupled) have converged. One gains what
    more would on the GPTs (scripts/bench_o2.py), in less time. The combined-collectives
    search's trials make none (`rhino.search.spmd.planner.plan_combined`)."""
    cpsat_max_variables: int = 400_000
    """`rhino.search.spmd.solver`: above this many LP variables, CP-SAT is not tried when
    the LP gives no integral optimum (the start is the plan)."""
    lp_first_order_variables: int = 400_000
    """`rhino.search.spmd.solver`: an LP with at least this many variables runs on HiGHS'
    first-order method (PDLP, "hipdlp") instead of the simplex: on the largest models the
    simplex and the interior point did not finish in minutes where PDLP converged. Its
    point is not exact, so its value is never taken as the optimum: the bound comes from
    its prices, the plan from rounding its point."""
    ahead_windows: int = 100
    """O2's level 3: where its first plans solved at least this many windows, a worker
    process solves the refinement's next windows while this one solves the current one
    (`rhino.search.spmd.ahead`; the plan is the same with or without). Its refinement
    then solves many more: T5-large's first plans solve 177 windows and its refinement
    1127 (75% of its time); the 72-layer GPT's 26 and 102, where the worker's start
    would cost more than it gains."""
    small_nodes: int = 5_000
    """`rhino.search.iopddl`: up to this many nodes, the exact solver (reductions, LP,
    CP-SAT) runs on the whole problem after the group search (its LP gives the lower
    bound), then the windows of `rhino.search.iopddl.window` until the deadline; above,
    the group search has all the time."""
    light_share: float = 0.1
    """`rhino.search.pipeline.receipts`: the lightest candidates of a stage, whose compute
    together stays under this share of the floor, are not flowed (taken as cut off by
    sep(s, F(s)) alone). On the zoo models (18 problems: UNets, encoder-decoders, GPTs
    at 2, 4 and 8 stages) the bounds equal those of flowing every candidate but on one
    (the DDPM UNet at 4 stages: 40.03 MiB against 44.02), in less time
    (scripts/bench_pipeline.py times it)."""


@dataclass(frozen=True)
class SolveOptions:
    time_limit_s: float = 60.0
    """Wall time for the whole search, every phase (LP, CP-SAT, segments) included."""
    threads: int = 2
    seed: int = 0
    relative_gap: float = 0.0
    deadline: float | None = None
    """`time.perf_counter()` by which the search ends; `started()` sets it from
    `time_limit_s`, and every phase after that shares it."""
    work_limit: float | None = None
    """CP-SAT also stops after this much of its deterministic time (its own measure of
    work, the same on any machine): a limit that does not make the plan depend on how
    fast or busy the machine is."""
    tuning: Tuning = Tuning()
    """The searches' knobs."""

    def started(self) -> SolveOptions:
        """These options with the deadline set (kept if already set)."""
        if self.deadline is not None:
            return self
        return dataclasses.replace(self, deadline=time.perf_counter() + self.time_limit_s)

    def working_at_most(self, work: float) -> SolveOptions:
        """These options with CP-SAT's deterministic work limited to `work` (or less, where
        it already was)."""
        limit = work if self.work_limit is None else min(self.work_limit, work)
        return dataclasses.replace(self, work_limit=limit)

    def left(self) -> float:
        """Seconds until the deadline (the whole time limit when not started)."""
        if self.deadline is None:
            return self.time_limit_s
        return max(0.0, self.deadline - time.perf_counter())


@dataclass(frozen=True)
class Sizes:
    """Sizes of the graphs a search worked on; None where it did not measure one."""

    nodes: int | None = None
    backbone: int | None = None
    """Nodes on the critical path of the forward program."""
    critical: int | None = None
    """Heavy backbone nodes (O2's segment boundaries)."""
    cones: int | None = None
    core_nodes: int | None = None
    """Nodes left after the exact reductions."""
    core_edges: int | None = None
    memory_rows: int | None = None
    """Memory rows the core's ILP kept."""
    segments: int | None = None
    passes: int | None = None
    """O2's refinement passes."""
    windows_solved: int | None = None
    windows_reused: int | None = None
    merged: int | None = None
    """Nodes the reductions folded into others (leaves and chain links)."""
    core_pairs: int | None = None
    """Strategy pairs on the core's edges."""

    def measured(self) -> dict[str, int]:
        """The sizes measured, by name, in field order."""
        found = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in found.items() if v is not None}

    def updated(self, other: Sizes) -> Sizes:
        """These sizes with those `other` measured instead."""
        return dataclasses.replace(self, **other.measured())


@dataclass(frozen=True)
class BudgetStats:
    """How O2 met a memory budget (`rhino.search.spmd.budget`)."""

    free_peak: float
    """Peak bytes per device of the plan without the budget."""
    solves: int
    """O2 solves, the one without the budget included (1: the budget did not bind)."""
    lam: float | None = None
    """The smallest multiplier whose plan fit (0.0 if none did); None where the budget
    did not bind."""
    fallback: bool | None = None
    """Did no relaxed plan fit (the smallest layouts, improved, are the plan)? None where
    the budget did not bind."""


@dataclass(frozen=True)
class SolveStats:
    """What the solvers on a solution's way measured."""

    level: int | None = None
    """The merging level O2 reached (1 cones only, 2 one ILP over the merged graph, 3
    segments), 0 for O3's whole-graph ILP; None where neither set it."""
    sizes: Sizes = Sizes()
    phases_s: dict[str, float] = field(default_factory=dict)
    """Seconds per phase, in the order they ran ("total": the whole of O2)."""
    lp_integral: bool = False
    """The LP relaxation's optimum was integral: the plan, proven optimal by the LP."""
    cpsat_skipped: bool = False
    """The model was too large for CP-SAT, or the LP left no time: the start (or the LP's
    rounding) is the plan."""
    plan_costs: dict[str, float] = field(default_factory=dict)
    """O2's core cost of its plans along the way: `start_<name>` each first plan,
    `first_pass_<name>` after one refinement pass, `refined_<name>` the best refined."""
    budget: BudgetStats | None = None
    warm_start_cost: float | None = None
    """O3: the objective of the plan it started from (O2's)."""
    unbudgeted_bound: float | None = None
    """O3 under a budget that binds: the lower bound of the problem without it."""

    def to_json(self) -> dict[str, object]:
        """The fields set, as JSON (for benchmark rows)."""
        out: dict[str, object] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                value = {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
            if value is not None:
                out[f.name] = value
        return out


@dataclass(frozen=True)
class Solution:
    """A choice per node, with how it was found."""

    choice: tuple[int, ...]
    objective: float
    """Seconds, recomputed by `evaluate`."""
    bound: float
    """Best lower bound the solver proved (seconds)."""
    status: SolveStatus
    solve_time_s: float
    peak_memory: float
    variables: int = 0
    constraints: int = 0
    stats: SolveStats = SolveStats()

    @property
    def gap(self) -> float:
        if self.objective <= 0:
            return 0.0
        return max(0.0, (self.objective - self.bound) / self.objective)
