"""XLA's collective combiners: which collectives a plan's XLA merges, what the merged ops
cost, and how the search accounts for a cost that is not a sum over nodes and edges.

XLA merges collectives of one kind over the same devices that do not depend on each
other (AllReduceCombiner, ReduceScatterCombiner, AllGatherCombiner) into one op, which
pays one latency (`rhino.search.spmd.comm.COMBINE_THRESHOLD_BYTES`). rhino takes as
combinable the collectives whose result nothing heavy reads, even through other
instructions: those of `quiet` nodes (a gradient's all-reduce on its way into the
optimizer update, the loss), and the conversions into `tail` nodes and of the step's
updated state into its parameters' layouts (`ShardingGraph.combined`).

The plan's cost: a group of combinable collectives with one key (kind, mesh axes) and
one level (how many of that key precede it on any path, so members are independent)
becomes `combined_ops` ops and pays their latency once; the members pay bandwidth only.

The search: a fixed charge per group is not a sum over nodes and edges, so it is not in
the ILP directly. The problem is built with every combinable collective's latency left
out (`open` keys: their group's latency is taken as paid), except for a set of `closed`
keys whose members are each charged their whole latency (as if they ran alone). For the
best plan P* with used keys K*, the problem with no key closed prices P* at its cost
minus its groups' latency, so:

    cost(P*) >= ILP(closed = {}) >= ILP optimum        (a lower bound for any plan)
    cost(P)  =  ILP value of P (closed = {}) + group latency of P     (what is reported)

and cost(P) of the best plan found exceeds the optimum by at most P's group latency.
`search_groups` closes keys greedily: from the plan with no key closed, for each key
its groups use, plan again with that key closed too (its members then prefer another
kind, or none), keep the cheapest reported plan, and repeat while it improves. It
stops when what is left to gain, the best plan's group latency, is within
`GROUP_SEARCH_SHARE` of its cost, after `MAX_GROUP_PLANS` plans, or when time is out.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import numpy as np

from rhino.search.spmd.builder import ShardingGraph
from rhino.search.spmd.comm import GroupKey, combined_ops, latency, latency_by_key
from rhino.search.spmd.plan import Plan, PlannedCollective

GROUP_SEARCH_SHARE = 0.005
"""Close keys only while the best plan's group latency is above this share of its cost
(each try is a whole solve, for little left to gain; scripts/bench_search.py times the
search)."""
MAX_GROUP_PLANS = 8
"""At most this many plans besides the first."""


def node_latencies(graph: ShardingGraph) -> list[dict[GroupKey, np.ndarray]]:
    """Per node, the latency of its own combinable collectives per key and strategy
    (unweighted; empty for a node that is not `quiet`)."""
    per_kind: dict[int, dict[GroupKey, np.ndarray]] = {}
    found: list[dict[GroupKey, np.ndarray]] = []
    for n in graph.nodes:
        if not n.quiet:
            found.append({})
            continue
        if n.kind in per_kind and n.kind >= 0:
            found.append(per_kind[n.kind])
            continue
        table: dict[GroupKey, np.ndarray] = {}
        for k, s in enumerate(n.strategies):
            for key, alpha in latency_by_key(s.comm, graph.mesh, graph.cluster).items():
                table.setdefault(key, np.zeros(len(n.strategies)))[k] = alpha
        per_kind[n.kind] = table
        found.append(table)
    return found


def used_keys(plan: Plan) -> list[GroupKey]:
    """The keys of the plan's combined groups, in the order they first appear."""
    return list(dict.fromkeys((c.kind, tuple(c.axes)) for c in plan.collectives if c.group >= 0))


def search_groups(
    first: Plan,
    plan_with: Callable[[frozenset[GroupKey], frozenset[GroupKey]], Plan],
    time_left: Callable[[], float],
    workers: int = 1,
    speculate: bool = False,
    finish: bool = False,
) -> tuple[Plan, frozenset[GroupKey], int]:
    """From `first` (planned with no key closed), close keys greedily (see module doc):
    `plan_with(closed, parent)` plans with those keys' members charged their whole
    latency, `parent` the closed keys of the plan it varies. The plans of one round
    (one more key closed each) are made `workers` at a time (threads: the solvers
    release the GIL) and weighed in the order they would be made one by one, so the
    answer does not depend on `workers`. With `speculate`, a worker left idle at the end
    of a round starts the next round's plans as they would be if the best plan the round
    has finished were its best (a wrong guess is dropped: its worker would have waited
    anyway, though the search waits for it to end); `plan_with` must then give the same
    plan for the same (closed, parent) whenever it is called. With `finish`, the plan
    chosen, where it is not `first`, is made once more as `plan_with(closed, closed)`
    and kept where no worse (O2's level 3: its trials leave out the wide passes, which
    this plan makes); with `speculate`, a worker idle at a round's end may start it for
    the round's best so far where the search would end with that plan. Returns the
    cheapest plan found by `objective_s`, its closed keys, and how many plans were made
    (of those the search weighed)."""
    best, closed, made = first, frozenset[GroupKey](), 0
    tried = {closed}

    def make(trial: frozenset[GroupKey], parent: frozenset[GroupKey]) -> Plan | None:
        return plan_with(trial, parent) if time_left() > 0 else None

    # one by one on this thread where there is one worker or one plan: a worker thread
    # gets its own malloc arena, ~70 MiB more peak memory on the README demo
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        started: dict[tuple[frozenset[GroupKey], frozenset[GroupKey]], Future[Plan | None]] = {}

        def start(trial: frozenset[GroupKey], parent: frozenset[GroupKey]) -> Future[Plan | None]:
            if (trial, parent) not in started:
                started[(trial, parent)] = pool.submit(make, trial, parent)
            return started[(trial, parent)]

        while trials := _next_trials(best, closed, made, tried):
            tried.update(trials)
            plans: Iterable[Plan | None]
            if workers > 1 and (len(trials) > 1 or (trials[0], closed) in started):
                futures = [start(t, closed) for t in trials]
                if speculate:
                    guess = _Guess(best, closed, made + len(trials), tried, finish)
                    _speculate(futures, trials, guess, workers, start, started)
                plans = [f.result() for f in futures]
            else:
                plans = map(make, trials, [closed] * len(trials))
            improved: tuple[Plan, frozenset[GroupKey]] | None = None
            for plan, trial in zip(plans, trials, strict=True):
                if plan is None:
                    continue
                made += 1
                if plan.objective_s < (improved[0] if improved else best).objective_s:
                    improved = (plan, trial)
            if improved is None:
                break
            best, closed = improved
        if finish and closed:
            known = started.get((closed, closed))
            finished = known.result() if known is not None else make(closed, closed)
            if finished is not None:
                made += 1
                if finished.objective_s <= best.objective_s:
                    best = finished
    return best, closed, made


def _next_trials(
    best: Plan, closed: frozenset[GroupKey], made: int, tried: set[frozenset[GroupKey]]
) -> list[frozenset[GroupKey]]:
    """The next round's trials from the best plan so far (`closed` its keys), with `made`
    plans made and the sets `tried`: none once what is left to gain is small or the
    plans are all made."""
    if best.combined_latency_s <= GROUP_SEARCH_SHARE * best.objective_s:
        return []
    trials = [closed | {key} for key in used_keys(best)]
    return [t for t in dict.fromkeys(trials) if t not in tried][: MAX_GROUP_PLANS - made]


@dataclasses.dataclass(frozen=True)
class _Guess:
    """What `_speculate` guesses the next plans from: the best plan before the round and
    its closed keys, the plans made by the round's end, the sets tried, and whether the
    chosen plan is finished (`search_groups`)."""

    best: Plan
    closed: frozenset[GroupKey]
    made: int
    tried: set[frozenset[GroupKey]]
    finish: bool


def _speculate(
    futures: list[Future[Plan | None]],
    trials: list[frozenset[GroupKey]],
    guess: _Guess,
    workers: int,
    start: Callable[[frozenset[GroupKey], frozenset[GroupKey]], Future[Plan | None]],
    started: dict[tuple[frozenset[GroupKey], frozenset[GroupKey]], Future[Plan | None]],
) -> None:
    """Until the round's `futures` are all done: while fewer than `workers` of the plans
    `started` are being made, start the plans that come next if the best of the round's
    plans done so far (in trial order, as the round weighs them) were its best: the next
    round's trials, or, where there would be none, the finished plan (`search_groups`),
    also where no plan of the round has bettered the best so far."""
    pending = set(futures)
    while pending:
        pending = wait(pending, return_when=FIRST_COMPLETED).not_done
        leader: tuple[Plan, frozenset[GroupKey]] | None = None
        for future, trial in zip(futures, trials, strict=True):
            plan = future.result() if future.done() else None
            if plan is not None and plan.objective_s < (leader or (guess.best,))[0].objective_s:
                leader = (plan, trial)
        if not pending:
            continue
        if leader is None:  # the round has bettered nothing yet: the search would end
            ahead, after = guess.closed, []
        else:
            ahead, after = leader[1], _next_trials(*leader, guess.made, guess.tried)
        wanted = [(t, ahead) for t in after]
        if guess.finish and not after and ahead:  # the search would end with that plan
            wanted.append((ahead, ahead))
        running = sum(not f.done() for f in started.values())
        for trial, parent in [w for w in wanted if w not in started][: workers - running]:
            start(trial, parent)


def combine(
    graph: ShardingGraph,
    collectives: list[PlannedCollective],
    combinable: list[tuple[int, int, int | None]],
) -> tuple[list[PlannedCollective], float]:
    """Group the `combinable` collectives (index in `collectives`, node it happens at,
    the edge's producer or None) by (kind, axes, level), the level being how many
    collectives of that kind and axes precede one on any path of the graph (so a
    group's members are independent); a group becomes `combined_ops` ops and pays their
    latency once, charged to its first member, the others their bandwidth time only.
    Returns the collectives (with `group` set) and the latency charged to groups."""
    if not combinable:
        return collectives, 0.0
    level = _levels(graph, collectives, combinable)
    groups: dict[tuple[str, tuple[int, ...], int], list[int]] = defaultdict(list)
    for i, _, _ in combinable:
        groups[(collectives[i].kind, tuple(collectives[i].axes), level[i])].append(i)
    out = list(collectives)
    charged = 0.0
    for number, ((kind, axes, _), members) in enumerate(
        sorted(groups.items(), key=lambda g: min(g[1]))
    ):
        members.sort()
        alpha = latency(kind, graph.mesh, axes, graph.cluster)
        ops = combined_ops(kind, sum(collectives[i].nbytes for i in members), len(members))
        for i in members:
            share = ops * alpha if i == members[0] else 0.0
            out[i] = dataclasses.replace(
                collectives[i], seconds=collectives[i].seconds - alpha + share, group=number
            )
        charged += ops * alpha
    return out, charged


Depth = dict[tuple[str, tuple[int, ...]], int]


def _levels(
    graph: ShardingGraph,
    collectives: list[PlannedCollective],
    combinable: list[tuple[int, int, int | None]],
) -> dict[int, int]:
    """Index of each combinable collective -> its level (see `combine`)."""
    at_edge: dict[tuple[int, int], list[int]] = defaultdict(list)
    at_node: dict[int, list[int]] = defaultdict(list)
    for i, v, u in combinable:
        (at_node[v] if u is None else at_edge[(u, v)]).append(i)
    into: dict[int, list[int]] = defaultdict(list)
    for u, v in graph.edges:
        if (u, v) not in graph.backward:
            into[v].append(u)
    level: dict[int, int] = {}

    def count(indices: list[int], start: Depth) -> Depth:
        seen = dict(start)
        for i in indices:
            key = (collectives[i].kind, tuple(collectives[i].axes))
            level[i] = seen.get(key, 0)
            seen[key] = level[i] + 1
        return seen

    depth: list[Depth] = [{} for _ in graph.nodes]
    for v in range(len(graph.nodes)):
        here: Depth = {}
        for u in into.get(v, ()):
            for key, d in count(at_edge.get((u, v), []), depth[u]).items():
                here[key] = max(here.get(key, 0), d)
        depth[v] = count(at_node[v], here) if v in at_node else here
    for (u, v), indices in at_edge.items():  # state edges (backward): the step's last
        if (u, v) in graph.backward:
            count(indices, depth[u])
    return level
