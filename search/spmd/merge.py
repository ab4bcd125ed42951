"""O2: Rhino §4.3's three-level subgraph merging, on top of the exact reductions.

Level 1, cones (§4.3.2). A cone root is a node without exactly one forward user (read
by several, or by none); every other node joins its single user's cone, so a cone is an
in-tree hanging off its root. Rhino merges each cone into its root with a table, built
by dynamic programming, of the members' best strategies for every root strategy. The
exact reductions of `rhino.search.spmd.reduce` are that dynamic programming where it loses
nothing: a leaf folds into its neighbour with c_u[k] += min_l C[k, l] + c_v[l] for every
k, a chain link into an edge. A member that also talks to nodes outside its cone (a
value read again in the backward pass) is not merged blindly: it stays in the core.
(Merging every cone by its own tree alone was measured well behind O3 on the scanned GPT
and DNABERT examples: the members' outside edges decide their layouts.)

Level 2, the ILP between the merged nodes: when the core is small
(`Tuning.whole_core_pairs`, and an LP the simplex solves, below
`Tuning.lp_first_order_variables`), one ILP over all of it (`solve_ilp`), and O2 is O3 when
that ILP proves its plan optimal within WHOLE_SHARE of the time and WHOLE_WORK of CP-SAT's
work; otherwise level 3 goes on from its plan.

Level 3, segments (§4.3.3). The critical path of the forward program (unit cost per
node, backward edges left out) gives each node an earliest and a latest time; the
backbone is the nodes whose two times are equal and the critical nodes are its heavy
ones (`ProblemNode.heavy`: dots, convolutions, large compute). A core node belongs to
the segment between the critical nodes around its time: its earliest time, or its
latest for a node with no inputs (a parameter belongs where it is first read, its
optimizer state where it is updated). Segments are then merged or split to
`Tuning.segment_nodes` core nodes.

First plans. The segments are solved one by one along the backbone, each by the ILP,
with the edges into segments already solved charged at the strategies those took and
the edges into segments not yet solved left out (TePDist's conditioning on the prefix):
once in program order, once in reverse; and, a third first plan, every node in its
largest (replicated) layout. (Charging the unsolved side at its best case instead was
measured several times worse than O3 on the examples: every neighbour's best case at
once is not a plan.)

Refinement. Windows are solved again by the ILP with every strategy outside them fixed:
each segment joined with the segment (then, wider, the two) its edges weigh most on (a
layer's forward, its backward and its optimizer update lie far apart in program order
but make one decision: greedy in program order, data parallelism is chosen in the
forward pass before the backward pass can object), each segment alone, and windows
straddling two segments' halves. A window's answer (its optimum, or CP-SAT's best within
SEGMENT_WORK where its LP is fractional) replaces the window's strategies only when
cheaper, so a pass never makes the plan worse; passes over the narrow windows stop when
one gains nothing, then `Tuning.wide_passes` over the wide ones. Every start within
START_SLACK of the best first plan gets one pass; the best after it gets the passes to
convergence (first plans rank their refined outcomes poorly: on the 12-layer GPT on 2x8
the second-best first plan ends best). Repeated layers give identical windows: a
window's answer is remembered by a fingerprint of its costs and the strategies around
it (its nodes in a canonical order, see `_window`), so each distinct window is solved
once. Where the first plans solved many windows, a worker process solves the pass's
next windows while this one solves the current one, and this one solves the windows
after those while it waits for the worker (`rhino.search.spmd.ahead`): an answer found
ahead is taken only where the window has the very strategies around it it was found
with, so the plan is the one solved in order. Last, the whole core gets the
node-by-node local search of `rhino.search.spmd.solver.improve`.

What this is not: Rhino stitches its segments by dynamic programming over the strategies
of the critical nodes between them. Here the stitching is by the refinement's
overlapping windows. scripts/bench_o2.py measures O2 against O3 where O3 proves
optimality, by the plans' estimated step times: on the GPTs and the examples O2 comes
within a fraction of a percent of O3 (sometimes below it, as the plan shares
conversions the ILP charges per reader), or reaches level 2 and equals it.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from rhino.search.problem import (
    ShardingProblem,
    Sizes,
    Solution,
    SolveOptions,
    SolveStatus,
)
from rhino.search.spmd.ahead import Ahead, window_answer
from rhino.search.spmd.identity import ByArray
from rhino.search.spmd.lp import MIN_CPSAT_S, TIE_BREAK_S_PER_BYTE, WarmStart, lp_variables
from rhino.search.spmd.reduce import Matrices, Reduced, reduce_further, reduce_problem
from rhino.search.spmd.replay import Recording, recorded, replayed
from rhino.search.spmd.solver import (
    core_choice,
    core_problem,
    improve,
    solve_ilp,
    tie_broken,
)

T = TypeVar("T")

WHOLE_SHARE = 0.4
"""The whole-core ILP's share of the time: proven optimal within it, its plan is O2's."""
WHOLE_WORK = 1.0
"""CP-SAT's deterministic work limit on the whole-core ILP where its LP is fractional
(besides WHOLE_SHARE of the time), as the combined search's trials have
(`rhino.search.spmd.planner.TRIAL_WORK`): stopped by the clock alone, it ran for 40% of
the time limit and made a plan that could depend on the machine's load. The tiny Wide
ResNet on 1x8 and 8x1 (cpu cluster, the default time limit of 60 s): 15.3-15.6 s ->
1.7-1.8 s in CP-SAT, the same objective; `rhino plan` 20.9 -> 10.3 s
(scripts/bench_revisions.py). No other zoo model's plan changed (`plan_record.py`)."""
PASS_GAIN = 1e-12
"""A refinement pass that lowers the core's cost by no more than this share of it is
the last."""
MAX_PASSES = 6
"""Refinement passes over the segments at most."""
STARTS = ("forward", "backward", "replicated")
"""First plans the refinement starts from, the best result kept: the segments solved in
program order, or in reverse (each seeing only the segments solved before it), or every
node in its largest (replicated) layout (and the whole-core ILP's plan when it ran out
of time)."""
START_SLACK = 3.0
"""A start is refined only if its first plan costs at most this times the best first
plan (above it by at most START_SLACK - 1 times its size: a core's costs are relative to
what the reductions folded away, and may be negative)."""
SEGMENT_TIME_S = 5.0
"""Wall time limit of one window's ILP (it usually needs milliseconds), a guard: the
limit that acts is SEGMENT_WORK."""
AHEAD_DEPTH = 2
"""Windows the worker has at once (`_SegmentSearch._give_ahead`): the one it solves and
the next, so that it does not wait while this process takes an answer (one: T5-large's
refinement 16.7 s, two: 14.8 s, three: 15.1 s)."""
AHEAD_SCAN = 8
"""How far ahead in a pass `_SegmentSearch._give_ahead` looks for the worker's next
window."""
SEGMENT_WORK = 0.2
"""CP-SAT's deterministic time for one window whose LP optimum is fractional: the same
on any machine, so the plan does not depend on its speed. Longer finds no better plans
on the GPTs, in several times the time (scripts/bench_o2.py)."""


@dataclass(frozen=True)
class Critical:
    """The critical path of a problem's forward program (§4.3.1)."""

    earliest: np.ndarray
    latest: np.ndarray
    backbone: np.ndarray
    """Nodes with earliest == latest, in program order."""
    critical: np.ndarray
    """Heavy backbone nodes, in program order."""
    inputs: np.ndarray
    """Node -> how many forward edges read into it."""


def critical_nodes(problem: ShardingProblem) -> Critical:
    """Earliest and latest times with unit cost per node over the forward edges (program
    order is a topological order of them), the backbone and its critical nodes."""
    n = len(problem.nodes)
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for e in problem.edges:
        if e.backward or e.u == e.v:
            continue
        if e.u > e.v:
            raise ValueError(
                f"forward edge ({problem.nodes[e.u].name}, {problem.nodes[e.v].name}) does not "
                "follow program order; mark it backward"
            )
        preds[e.v].append(e.u)
        succs[e.u].append(e.v)
    first = [0] * n  # lists, not arrays: the loops read them an element at a time
    for v in range(n):
        if preds[v]:
            first[v] = max([first[u] for u in preds[v]]) + 1
    tail = [0] * n
    for v in range(n - 1, -1, -1):
        if succs[v]:
            tail[v] = max([tail[w] for w in succs[v]]) + 1
    earliest = np.array(first, dtype=np.int64)
    span = int(earliest.max(initial=0))
    latest = span - np.array(tail, dtype=np.int64)
    backbone = np.flatnonzero(earliest == latest)
    heavy = np.array([problem.nodes[v].heavy for v in backbone], dtype=bool)
    inputs = np.array([len(p) for p in preds], dtype=np.int64)
    return Critical(earliest, latest, backbone, backbone[heavy], inputs)


def count_cones(problem: ShardingProblem) -> int:
    """Cones of level 1: nodes without exactly one forward user are their roots."""
    users = np.zeros(len(problem.nodes), dtype=np.int64)
    seen: set[tuple[int, int]] = set()
    for e in problem.edges:
        if not e.backward and (e.u, e.v) not in seen:
            seen.add((e.u, e.v))
            users[e.u] += 1
    return int((users != 1).sum())


def structure(problem: ShardingProblem) -> tuple[Critical, Sizes]:
    """The critical path, and the sizes every level reports: nodes, backbone, critical
    nodes, cones."""
    crit = critical_nodes(problem)
    return crit, Sizes(
        nodes=len(problem.nodes),
        backbone=len(crit.backbone),
        critical=len(crit.critical),
        cones=count_cones(problem),
    )


@dataclass
class Report:
    """What O2 did, gathered as it goes (for `Solution.stats`)."""

    level: int = 2
    sizes: Sizes = Sizes()
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds per phase, in the order they ran."""
    plan_costs: dict[str, float] = field(default_factory=dict)
    """As `SolveStats.plan_costs`."""

    def measured(self, **sizes: int) -> None:
        self.sizes = dataclasses.replace(self.sizes, **sizes)


def solve_merged(
    problem: ShardingProblem,
    options: SolveOptions | None = None,
    start: tuple[int, ...] | None = None,
    memo: SearchMemo | None = None,
    warm: WarmStart | None = None,
) -> Solution:
    """O2 (see module doc): a plan for a problem without a memory budget. `start`, a plan
    of the problem (e.g. of the same graph at other costs), replaces the first plans of
    level 3 and is the whole-core ILP's start: refining it is all that is done. `memo`
    keeps the windows' answers for the next call (on the same graph at other costs: the
    windows whose costs did not change are not solved again), `warm` the whole-core LP's
    basis (`rhino.search.spmd.lp.WarmStart`) and, for level 3 only, the plan of the same
    graph at other costs to refine as `start` is (the combined-collectives search's plans
    after the first)."""
    if problem.budget is not None:
        raise ValueError(
            "O2 plans without a memory constraint (the planner meets a budget by §4.4)"
        )
    options = (options or SolveOptions()).started()
    begin = time.perf_counter()
    report = Report()
    clock = time.perf_counter()
    memo = SearchMemo() if memo is None else memo
    crit, report.sizes = memo.structure(problem)
    report.phases["critical"] = time.perf_counter() - clock
    clock = time.perf_counter()
    # dominated strategies stay: the refinement's windows settle them themselves, and
    # finding them on a 40k-node graph takes as long as the rest of the reductions
    reduced = memo.reduced(problem)
    pairs = sum(m.size for m in reduced.edges.values())
    whole_core_pairs = options.tuning.whole_core_pairs
    if pairs <= 2 * whole_core_pairs:  # the whole-core ILP's: as small a core as can be
        reduce_further(reduced)
        pairs = sum(m.size for m in reduced.edges.values())
    report.phases["merge"] = time.perf_counter() - clock
    core_ids = sorted(reduced.alive)
    report.measured(
        core_nodes=len(core_ids),
        merged=reduced.counts["leaf"] + reduced.counts["series"],
        core_pairs=int(pairs),
    )
    clock = time.perf_counter()
    whole = None
    if pairs <= whole_core_pairs and _on_the_simplex(reduced, core_ids, pairs, options):
        share = dataclasses.replace(
            options, deadline=time.perf_counter() + options.left() * WHOLE_SHARE
        )
        share = share.working_at_most(WHOLE_WORK)
        whole = solve_ilp(problem, share, start=start, reduced=reduced, warm=warm)
        report.phases["ilp"] = time.perf_counter() - clock
        if whole.status is SolveStatus.OPTIMAL:
            report.level = 2 if core_ids else 1
            report.phases["total"] = time.perf_counter() - begin
            return _with_stats(whole, report)
        clock = time.perf_counter()
    report.level = 3
    segments = _segments(reduced, core_ids, crit, options.tuning.segment_nodes)
    report.measured(segments=len(segments))
    search = _SegmentSearch(problem, reduced, options, memo.windows)
    given = start if start is not None else warm.plan if warm is not None else None
    try:
        report.measured(passes=_refined(search, segments, given, whole, report))
    finally:
        if search.ahead is not None:
            search.ahead.close()
    clock = time.perf_counter()
    choice: tuple[int, ...] = reduced.expand(search.polish())
    report.phases["polish"] = time.perf_counter() - clock
    report.measured(windows_solved=search.solved, windows_reused=search.reused)
    evaluation = problem.evaluate(choice)
    report.phases["total"] = time.perf_counter() - begin
    return _with_stats(
        Solution(
            choice=choice,
            objective=evaluation.objective,
            bound=0.0,  # segments prove nothing about the whole
            status=SolveStatus.FEASIBLE,
            solve_time_s=time.perf_counter() - begin,
            peak_memory=evaluation.peak_memory,
        ),
        report,
    )


def _refined(
    search: _SegmentSearch,
    segments: list[list[int]],
    given: tuple[int, ...] | None,
    whole: Solution | None,
    report: Report,
) -> int:
    """Level 3's first plans (or `given`, and the whole-core ILP's unproven plan), then
    their refinement (see module doc), into `search.choice`: how many passes ran."""
    reduced, options = search.r, search.options
    report.phases["segments"] = report.phases["refine"] = 0.0
    passes = 0
    starts = []
    clock = time.perf_counter()
    firsts = [("given", core_choice(reduced, given, nearest=True))] if given is not None else []
    for name in STARTS if given is None else ():
        search.start(name, segments)
        starts.append((search.core_cost(), name, dict(search.choice)))
        report.plan_costs[f"start_{name}"] = starts[-1][0]
    if whole is not None:  # the whole-core ILP's unproven plan is a start too
        firsts.append(("ilp", core_choice(reduced, whole.choice)))
    for name, picks in firsts:
        if picks is not None:
            search.restart(picks)
            starts.append((search.core_cost(), name, dict(search.choice)))
            report.plan_costs[f"start_{name}"] = starts[-1][0]
    report.phases["segments"] += time.perf_counter() - clock
    clock = time.perf_counter()
    if Ahead.wanted(options, search.solved):  # (the same plan without it)
        search.ahead = Ahead(reduced)
    narrow = search.coupled(segments, 1)
    # successive halving: one refinement pass for every start not far behind the best,
    # then the passes to convergence for the best after it
    lowest = min(cost for cost, _, _ in starts)
    tried: list[tuple[float, str, dict[int, int]]] = []
    for cost, name, first in sorted(starts, key=lambda t: (t[0], t[1])):
        if cost > lowest + (START_SLACK - 1) * abs(lowest) or (tried and options.left() <= 0):
            continue
        search.restart(first)
        passes += search.refine(segments, narrow, 1, 1)
        tried.append((search.core_cost(), name, dict(search.choice)))
        report.plan_costs[f"first_pass_{name}"] = tried[-1][0]
    _, name, refined = min(tried, key=lambda t: (t[0], t[1]))
    search.restart(refined)
    passes += search.refine(segments, narrow, 2, MAX_PASSES)
    if options.tuning.wide_passes > 0:
        passes += search.refine(
            segments, search.coupled(segments, 2), 1, options.tuning.wide_passes
        )
    report.plan_costs[f"refined_{name}"] = search.core_cost()
    report.phases["refine"] = time.perf_counter() - clock
    return passes


def _on_the_simplex(
    reduced: Reduced, core_ids: list[int], pairs: int, options: SolveOptions
) -> bool:
    """Would the whole-core ILP's LP (`pairs` strategy pairs on its edges) run on the
    simplex? One too large for it runs on the first-order method, whose point is not
    exact and whose plan is a rounding: its time went to a start no better than level
    3's own (the tiny UNet on 2x4: 21 s of PDLP on 472k columns, then level 3 found the
    plan it finds alone)."""
    strategies = sum(len(reduced.keep[v]) for v in core_ids)
    limit = options.tuning.lp_first_order_variables
    if strategies + pairs < limit:  # at most a variable per pair: no need to group them
        return True
    return lp_variables(strategies, reduced.edges.values()) < limit


def _with_stats(solution: Solution, report: Report) -> Solution:
    stats = solution.stats
    return dataclasses.replace(
        solution,
        solve_time_s=report.phases["total"],
        stats=dataclasses.replace(
            stats,
            level=report.level,
            sizes=stats.sizes.updated(report.sizes),
            phases_s={**stats.phases_s, **report.phases},
            plan_costs={**stats.plan_costs, **report.plan_costs},
        ),
    )


def _segments(
    reduced: Reduced, core_ids: list[int], crit: Critical, segment_nodes: int
) -> list[list[int]]:
    """Core nodes grouped between consecutive critical nodes, merged or split to about
    `segment_nodes` (see module doc)."""
    cuts = sorted(int(crit.earliest[v]) for v in crit.critical)

    def time_of(v: int) -> int:
        return int(crit.earliest[v] if crit.inputs[v] else crit.latest[v])

    ordered = sorted(core_ids, key=lambda v: (time_of(v), v))
    groups: list[list[int]] = []
    last = -1
    for v in ordered:
        g = bisect.bisect_right(cuts, time_of(v))
        if g != last:
            groups.append([])
            last = g
        groups[-1].append(v)
    segments: list[list[int]] = []
    for group in groups:  # merge small groups, split large ones
        if segments and len(segments[-1]) + len(group) <= segment_nodes:
            segments[-1].extend(group)
            continue
        for i in range(0, len(group), segment_nodes):
            segments.append(group[i : i + segment_nodes])
    return segments


@dataclass
class SearchMemo:
    """What O2 keeps from one problem to the next of the same graph at other costs (the
    plans of the combined-collectives search, the budget's relaxations)."""

    windows: dict[tuple[bytes, tuple[int, ...]], tuple[int, ...]] = field(default_factory=dict)
    """(window digest, strategies of the nodes outside it) -> the window's answer. The
    digest covers every cost the window's answer depends on (its nodes', its edges', those
    to the nodes outside it), so the answer is valid across problems."""
    structures: dict[bytes, tuple[Critical, Sizes]] = field(default_factory=dict)
    """Digest of a problem's shape (nodes, edges, which are backward, which nodes are
    heavy: what `structure` reads) -> its `structure`."""
    record: bool = False
    """Record the first problem's whole-graph reductions, for later ones to replay
    (`rhino.search.spmd.replay`): where this process solves later problems of the graph
    (what is recorded is about as large as the problem)."""
    recording: Recording | None = None

    def reduced(self, problem: ShardingProblem) -> Reduced:
        """`reduce_problem(tie_broken(problem), dominance=False)`: with `record`, the first
        problem's run recorded and a later one's replayed from it where it can be."""
        if self.recording is not None:
            found = replayed(self.recording, problem)
            if found is not None:
                return found
        elif self.record:
            reduced, self.recording = recorded(problem)
            return reduced
        return reduce_problem(tie_broken(problem), dominance=False)

    def structure(self, problem: ShardingProblem) -> tuple[Critical, Sizes]:
        """`structure(problem)`, computed once per shape."""
        edges = np.array([(e.u, e.v, e.backward) for e in problem.edges], dtype=np.int64)
        heavy = np.array([n.heavy for n in problem.nodes], dtype=bool)
        key = hashlib.blake2b(
            np.int64(len(problem.nodes)).tobytes() + edges.tobytes() + heavy.tobytes(),
            digest_size=16,
        ).digest()
        found = self.structures.get(key)
        if found is None:
            found = self.structures[key] = structure(problem)
        return found


class _SegmentSearch:
    """Segments of the core solved in order, then refined (see module doc)."""

    def __init__(
        self,
        problem: ShardingProblem,
        reduced: Reduced,
        options: SolveOptions,
        memo: dict[tuple[bytes, tuple[int, ...]], tuple[int, ...]],
    ) -> None:
        self.problem = problem
        self.r = reduced
        self.options = options
        self.choice: dict[int, int] = {}
        self.memo = memo
        self.solved = 0
        self.reused = 0
        self.tick = 0
        self.changed: dict[int, int] = {}
        """Node -> tick of its last change."""
        self.seen: dict[tuple[int, ...], int] = {}
        """Window -> tick it was last solved at."""
        self.windows: dict[tuple[int, ...], _Window] = {}
        self.ahead: Ahead | None = None
        """The worker solving windows ahead of the refinement, where it has one."""
        self.far: Matrices = ByArray()
        """Which of the core's matrices the windows' reductions found far from separable,
        and their largest values (`rhino.search.spmd.identity`)."""
        self.upcoming: list[list[int]] = []
        """The pass's next windows (AHEAD_SCAN of them) after the one being solved."""
        self.early: dict[tuple[int, ...], tuple[tuple[int, ...], tuple[int, ...] | None]] = {}
        """Window -> (the picks around it, its answer) solved here ahead of the pass, while
        waiting for the worker."""
        self._table: _CoreTable | None = None
        """The core's costs as flat arrays (`core_cost`), made at its first call."""
        self._core: _CoreDigests | None = None
        """The core's digests (the core does not change during the search), made with
        the first window."""

    def start(self, how: str, segments: list[list[int]]) -> None:
        """A first plan of the core (see STARTS)."""
        self.restart({})
        if how == "replicated":
            for v in self.r.alive:
                memory = self.problem.nodes[v].memory[self.r.keep[v]]
                self.choice[v] = int(np.argmax(memory))
            return
        for segment in segments if how == "forward" else segments[::-1]:
            self._solve(segment)

    def coupled(self, segments: list[list[int]], partners: int) -> list[list[int]]:
        """Each segment with the `partners` segments its edges weigh most on (a layer's
        forward with its backward and its optimizer update: far apart in time, but one
        decision)."""
        where = {v: i for i, seg in enumerate(segments) for v in seg}
        weight: list[dict[int, float]] = [{} for _ in segments]
        for (a, b), m in self.r.edges.items():
            sa, sb = where[a], where[b]
            if sa != sb:
                stake = float(m.max() - m.min())
                weight[sa][sb] = weight[sa].get(sb, 0.0) + stake
                weight[sb][sa] = weight[sb].get(sa, 0.0) + stake
        windows = []
        for i, seg in enumerate(segments):
            best = sorted(weight[i], key=lambda j: (-weight[i][j], j))[:partners]
            windows.append(seg + [v for j in sorted(best) for v in segments[j]])
        return windows

    def restart(self, choice: dict[int, int]) -> None:
        """Go on from `choice`. Where it is the plan the search holds already (the best
        start was the last refined, or the only one), what the search knows stays: a
        window solved since none of its nodes and neighbours changed would get the very
        same answer again (`_unchanged`)."""
        if choice == self.choice:
            return
        self.choice = dict(choice)
        self.seen = {}
        self.early = {}

    def refine(
        self, segments: list[list[int]], coupled: list[list[int]], first: int, last: int
    ) -> int:
        """Passes `first`..`last` (odd ones solve the coupled windows and the windows
        straddling two segments, even ones the coupled windows and the segments) until
        one gains nothing or the deadline; how many ran."""
        halves = [(s[: len(s) // 2], s[len(s) // 2 :]) for s in segments]
        straddling = [halves[i][1] + halves[i + 1][0] for i in range(len(halves) - 1)]
        passes = 0
        before = self.core_cost()
        for number in range(first, last + 1):
            if self.options.left() <= 0:
                break
            passes += 1
            listing = coupled + straddling if number % 2 else coupled + segments
            for at, window in enumerate(listing):
                if self.options.left() <= 0:
                    break
                self.upcoming = listing[at + 1 : at + 1 + AHEAD_SCAN]
                self._give_ahead(self._window(window))
                self._solve(window)
            self.upcoming = []
            after = self.core_cost()
            if after >= before - PASS_GAIN * abs(before):
                break
            before = after
        return passes

    def polish(self) -> dict[int, int]:
        """The node-by-node local search over the whole core; the core choice."""
        ids = sorted(self.r.alive)
        position = {v: i for i, v in enumerate(ids)}
        core = core_problem(self.problem, self.r)
        node_cost = [n.cost + TIE_BREAK_S_PER_BYTE * n.memory for n in core.nodes]
        start = [self.choice[v] for v in ids]
        best = improve(core, node_cost, start)
        return {v: best[position[v]] for v in ids}

    def core_cost(self) -> float:
        if self._table is None:
            self._table = _CoreTable(self.r)
        return self._table.cost(self.choice)

    def _solve(self, nodes: list[int]) -> None:
        """The window's optimum given the strategies outside it: placed neighbours at
        their strategy, unplaced ones left out (not yet decided)."""
        window = self._window(nodes)
        # nothing it sees changed since it was last solved: the same answer again
        if self._unchanged(window):
            self.reused += 1
            return
        self.tick += 1
        self.seen[window.nodes] = self.tick
        picks = self._picks(window)
        key = (window.digest, picks)
        found = self.memo.get(key)
        if found is None:
            found = self._answered(window, picks)
            if found is None:
                found = self._answer(window, picks)
            # optimal, or the best CP-SAT finds within SEGMENT_WORK (the same again)
            self.memo[key] = found
            self.solved += 1
        else:
            self.reused += 1
        old = tuple(self.choice.get(v, -1) for v in window.nodes)
        if old == found:
            return
        if -1 not in old and self._window_cost(window, old) <= self._window_cost(window, found):
            return  # keep the old choice unless the new one is better
        for v, k in zip(window.nodes, found, strict=True):
            if self.choice.get(v) != k:
                self.choice[v] = int(k)
                self.changed[v] = self.tick

    def _answer(self, window: _Window, picks: tuple[int, ...]) -> tuple[int, ...]:
        """The window's optimum with `picks` around it, solved here."""
        names = [self.problem.nodes[v].name for v in window.nodes]
        costs = [self.r.cost[v] for v in window.nodes]
        options = self._window_options()
        inside, outside = window.inside, window.outside
        return window_answer(names, costs, inside, outside, picks, options, self.far)

    def _answered(self, window: _Window, picks: tuple[int, ...]) -> tuple[int, ...] | None:
        """The window's answer with `picks` around it where it was found ahead: by the
        worker (waited for, solving the next windows here meanwhile), or here while
        waiting for the worker before; None where it was not."""
        early = self.early.pop(window.nodes, None)
        if early is not None and early[0] == picks and early[1] is not None:
            return early[1]
        ahead = self.ahead
        if ahead is None or not ahead.has(window.nodes, picks):
            return None
        while not ahead.back(window.nodes, picks) and self._solve_early():
            pass
        return ahead.take(window.nodes, picks)

    def _solve_early(self) -> bool:
        """Solve here the next upcoming window whose answer is not known (`_next_unknown`;
        its answer is taken only if the strategies around it are the same when the pass
        reaches it), the worker given the one after it where it is free; False where
        there is none."""
        found = self._next_unknown()
        if found is None:
            return False
        window, picks = found
        self.early[window.nodes] = (picks, None)  # claimed: the worker gets another
        self._give_ahead(None)
        self.early[window.nodes] = (picks, self._answer(window, picks))
        return True

    def _unchanged(self, window: _Window) -> bool:
        """Did nothing the window sees change since it was last solved?"""
        last = self.seen.get(window.nodes, -1)
        return last >= 0 and all(self.changed.get(v, -1) < last for v in window.reach)

    def _picks(self, window: _Window) -> tuple[int, ...]:
        """The strategies of the nodes around the window (-1: not placed yet)."""
        return tuple(map(self.choice.get, window.around, itertools.repeat(-1)))

    def _window_options(self) -> SolveOptions:
        return SolveOptions(
            time_limit_s=max(MIN_CPSAT_S, min(SEGMENT_TIME_S, self.options.left())),
            threads=self.options.threads,
            seed=self.options.seed,
            work_limit=SEGMENT_WORK,
            tuning=self.options.tuning,
        )

    def _give_ahead(self, current: _Window | None) -> None:
        """Where the worker (`self.ahead`) is free, give it the first upcoming window of
        the pass (after `current`, the one this process is at) whose answer is not known
        for the strategies around it now, nor asked for."""
        ahead = self.ahead
        if ahead is None:
            return
        ahead.poll()
        if ahead.working >= AHEAD_DEPTH:
            return
        if current is not None and ahead.has(current.nodes, self._picks(current)):
            return  # this process takes the worker's answer next
        found = self._next_unknown()
        if found is not None:
            window, picks = found
            ahead.give(window.nodes, window.inside, window.outside, picks, self._window_options())

    def _next_unknown(self) -> tuple[_Window, tuple[int, ...]] | None:
        """The first upcoming window of the pass whose answer is not known for the
        strategies around it now (remembered, found ahead here, or asked of the worker),
        and those strategies."""
        for nodes in self.upcoming:
            window = self._window(nodes)
            picks = self._picks(window)
            if (window.digest, picks) in self.memo:
                continue
            if self.ahead is not None and self.ahead.has(window.nodes, picks):
                continue
            early = self.early.get(window.nodes)
            if early is not None and early[0] == picks:
                continue
            return window, picks
        return None

    def _window_cost(self, window: _Window, choice: tuple[int, ...]) -> float:
        """Cost of the terms `choice` of the window's nodes decides (placed neighbours
        outside it at their strategy)."""
        cost = self.r.cost
        total = sum(cost[v].item(k) for v, k in zip(window.nodes, choice, strict=True))
        total += sum(m.item(choice[i], choice[j]) for i, j, m in window.inside)
        for i, w, m in window.outside:
            k = self.choice.get(w, -1)
            if k >= 0:
                total += m.item(choice[i], k)
        return total

    def _window(self, nodes: list[int]) -> _Window:
        key = tuple(nodes)
        window = self.windows.get(key)
        if window is not None:
            return window
        if self._core is None:
            self._core = _CoreDigests(self.r)
        core = self._core
        members = set(key)
        # the nodes in a canonical order, so that windows that are the same problem up to
        # node names (repeated layers, whose nodes interleave differently in program
        # order) get the same digest: each node labelled by its costs and all its edges'
        # matrices, then by its neighbours' labels inside (one Weisfeiler-Lehman round);
        # ties keep the given order
        labels = [core.label(v, members) for v in key]
        order = tuple(key[i] for _, i in sorted(zip(labels, itertools.count())))
        position = {v: i for i, v in enumerate(order)}
        inside: list[tuple[int, int, np.ndarray]] = []
        outside: list[tuple[int, int, np.ndarray]] = []
        around: list[int] = []
        parts = [core.costs[v] for v in order]  # then inside edges, then outside ones
        outside_parts: list[bytes] = []  # per node: its position and count, their digests
        for i, v in enumerate(order):
            out: list[bytes] = []  # 16 bytes each
            for d, w, m in core.nears[v]:
                j = position.get(w)
                if j is None:
                    outside.append((i, w, m))
                    around.append(w)
                    out.append(d)
                elif i < j:
                    inside.append((i, j, m))
                    parts += [b"i%d,%d:" % (i, j), d]
            if out:
                outside_parts += [b"o%d,%d:" % (i, len(out)), *out]
        digest = _blake(b"".join(parts + outside_parts))
        reach = tuple(sorted(members.union(around)))
        window = _Window(order, tuple(inside), tuple(outside), digest, reach, tuple(around))
        self.windows[key] = window
        return window


class _PerContent(Generic[T]):
    """`make(content, array)` once per distinct `content(array)`, looked up by the array's
    id first: the reductions share arrays between nodes and edges, and repeated layers
    repeat their values (the 72-layer GPT's core: 35k edges, 9.6k arrays, 115 distinct
    matrices). Only for arrays held elsewhere while this is used (a core's, in the
    constructors that make one and drop it): an id is not an array's once it is gone
    (`ByArray` knows that, at 0.4 s more for the 72-layer GPT's core table)."""

    def __init__(
        self, content: Callable[[np.ndarray], bytes], make: Callable[[bytes, np.ndarray], T]
    ) -> None:
        self.content, self.make = content, make
        self.by_id: dict[int, T] = {}
        self.by_content: dict[bytes, T] = {}

    def __call__(self, array: np.ndarray) -> T:
        found = self.by_id.get(id(array))
        if found is None:
            content = self.content(array)
            found = self.by_content.get(content)
            if found is None:
                found = self.by_content[content] = self.make(content, array)
            self.by_id[id(array)] = found
        return found


class _CoreTable:
    """A core's costs, each distinct array once in one flat array (`_PerContent`), to sum
    the cost of a choice in a few numpy calls: the same float additions, in the same
    order, as a loop over the choice's nodes and then the core's edges."""

    def __init__(self, r: Reduced) -> None:
        parts: list[np.ndarray] = []
        size = 0

        def placed(content: bytes, array: np.ndarray) -> int:
            nonlocal size
            parts.append(np.ravel(array))
            size += array.size
            return size - array.size

        offset = _PerContent(lambda a: a.tobytes() + bytes(str(a.shape), "ascii"), placed)
        count = len(r.problem.nodes)
        self.node_at = np.zeros(count, dtype=np.int64)
        for v in r.alive:
            self.node_at[v] = offset(r.cost[v])
        ends = np.array(list(r.edges), dtype=np.int64).reshape(-1, 2)
        self.a, self.b = ends[:, 0], ends[:, 1]
        self.edge_at = np.array([offset(m) for m in r.edges.values()], dtype=np.int64)
        self.columns = np.array([m.shape[1] for m in r.edges.values()], dtype=np.int64)
        self.values = np.concatenate(parts) if parts else np.zeros(0)

    def cost(self, choice: dict[int, int]) -> float:
        nodes = np.fromiter(choice.keys(), dtype=np.int64, count=len(choice))
        picks = np.fromiter(choice.values(), dtype=np.int64, count=len(choice))
        total = sum(self.values[self.node_at[nodes] + picks].tolist())
        picked = np.full(len(self.node_at), -1, dtype=np.int64)  # -1: not placed
        picked[nodes] = picks
        ka, kb = picked[self.a], picked[self.b]
        placed = (ka >= 0) & (kb >= 0)
        at = self.edge_at + ka * self.columns + kb
        return sum(self.values[at[placed]].tolist(), total)


class _CoreDigests:
    """Digests of a core's costs and edges, all made at once (the windows cover the whole
    core): what `_SegmentSearch._window` labels and fingerprints windows by."""

    def __init__(self, r: Reduced) -> None:
        self.costs: dict[int, bytes] = {}
        """v -> digest of its costs (and their count)."""
        digests: dict[tuple[int, int], bytes] = {}  # (v, w): the matrix oriented v x w
        # each array rounded once, each distinct content digested once (`_PerContent`)
        cost_digest = _PerContent(
            lambda c: np.array([len(c)]).tobytes() + np.round(c, 15).tobytes(),
            lambda content, _: _blake(content),
        )
        for v in sorted(r.alive):
            self.costs[v] = cost_digest(r.cost[v])
        edge_digests = _PerContent(  # (as it is, transposed)
            lambda m: np.round(m, 15).tobytes() + bytes(str(m.shape), "ascii"),
            lambda content, m: (
                _blake(content),
                _blake(np.round(m, 15).T.tobytes() + bytes(str(m.shape[::-1]), "ascii")),
            ),
        )
        for (a, b), m in r.edges.items():
            digests[(a, b)], digests[(b, a)] = edge_digests(m)
        self.nears: dict[int, list[tuple[bytes, int, np.ndarray]]] = {}
        """v -> its neighbours w: (digest of edge (v, w), w, its matrix oriented v x w), by
        digest (then w)."""
        self.labels: dict[int, bytes] = {}
        """v -> digest of its costs and the matrices of all its edges."""
        self.neighbours = r.neighbours
        """v -> its neighbours (the core's own sets: it does not change during the search)."""
        self.whole: dict[int, bytes] = {}
        """v -> its `label` in the windows that hold all its neighbours, once made."""
        for v in r.alive:
            # (digest, w) pairs are distinct: the matrices are never compared
            near = sorted([(digests[(v, w)], w, r.matrix(v, w)) for w in r.neighbours[v]])
            self.nears[v] = near
            self.labels[v] = _blake(b"".join([self.costs[v], *(d for d, _, _ in near)]))

    def label(self, v: int, members: set[int]) -> bytes:
        """v's label in a window of `members`: its own, then each edge to a neighbour in
        the window with that neighbour's (one Weisfeiler-Lehman round, see `_window`).
        Most nodes of a window have all their neighbours in it: their label is the same
        in every such window, made once."""
        whole = members.issuperset(self.neighbours[v])
        if whole and v in self.whole:
            return self.whole[v]
        labels = self.labels
        inner = sorted([d + labels[w] for d, w, _ in self.nears[v] if w in members])
        found = _blake(b"".join([labels[v], *inner]))
        if whole:
            self.whole[v] = found
        return found


def _blake(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


@dataclass(frozen=True)
class _Window:
    """A set of core nodes solved together, with what it sees of the rest."""

    nodes: tuple[int, ...]
    inside: tuple[tuple[int, int, np.ndarray], ...]
    """Edges between its nodes: (position, position, matrix)."""
    outside: tuple[tuple[int, int, np.ndarray], ...]
    """Edges to nodes outside it: (position, outside node, matrix rows x its strategies)."""
    digest: bytes
    """The same for windows alike in everything but node names (repeated layers)."""
    reach: tuple[int, ...]
    """Its nodes and their neighbours."""
    around: tuple[int, ...]
    """The outside node of each outside edge."""
