"""Tied nodes merged into one decision, and a local search on the merged problem.

An edge whose matrix allows exactly one strategy per row and per column (a one-to-one
map; everything else forbidden) ties its two ends: neither can move alone. On XLA's
problems such ties chain thousands of nodes (IOPDDL A: one group of 6369), so single
moves never leave the first plan. Here every group of tied nodes is one node whose
strategies are those of its root r, each member v following the map F_v from r.

Data (a `local.Graph`, groups G with root r(G), maps F_v: strategies of r -> of v)
    c_G[k]     = sum_{v in G} c[v][F_v(k)] + sum_{(u,v) inside G} C[u,v][F_u(k), F_v(k)]
    C_GH[k,l]  = sum_{(u,v): u in G, v in H} C[u,v][F_u(k), F_v(l)]
    U_G[s, k]  = sum_{v in G live on segment s} m[v][F_v(k)]
A group's segments cut its members' live ranges where one starts or ends, so its usage
is piecewise constant over several intervals (its memory rows carry them all).
A strategy of r that some inside edge forbids is forbidden for G.

The search (`GroupSearch`) keeps the usage level per point within the limit:
    single move   G takes argmin_k c_G[k] + sum_H C_GH[k, x_H] among the k that fit
    pair move     G and a neighbour H take the best (k, l) of
                  local_G[k] - C_GH[k, x_H] + local_H[l] - C_GH[x_G, l] + C_GH[k, l]
    kick          a group (half the time drawn by what it costs now) to a random
                  strategy that fits, a descent around it, undone unless the total went
                  down (iterated local search)
    tree move     the groups of an induced tree (no edge among them but the tree's)
                  jointly at their best, the rest held: dynamic programming, exact
    window move   a few dozen neighbouring groups jointly at their best by the exact
                  solver (`solve_ilp`), the rest held
A tree or window answer that breaks the limit is solved again with a price on the usage
at the overfull points (the price doubled on each try); none that fits is not taken.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rhino.search.iopddl.local import Graph, _threshold
from rhino.search.problem import ProblemEdge, ProblemNode, ShardingProblem, SolveOptions
from rhino.search.spmd.solver import solve_ilp

CHECK_EVERY = 256
"""Moves between two looks at the clock."""
KICK_RADIUS = 64
"""Single moves a kick's descent may make before it is judged."""
FRUITLESS_KICKS = 50
"""Kicks end after this many per group (at least MIN_KICKS) in a row found nothing."""
MIN_KICKS = 2_000
TREE_GROUPS = 400
"""Groups in a tree move."""
WINDOW_GROUPS = 30
"""Groups in a window move."""
WINDOW_TIME_S = 1.0
"""Time limit of one window's solve."""
MIN_WINDOW_S = 0.05
"""A window's solve gets at least this long, even past the deadline."""
WINDOW_PAIRS = 20_000
"""Pairs of strategies (the LP's edge variables) in a window move at most."""
WHOLE_GROUPS = 1_000
WHOLE_PAIRS = 300_000
"""A merged problem of at most WHOLE_GROUPS groups (each within WINDOW_MAX_STRATEGIES)
and this many pairs of strategies on its edges is solved whole once, as one window (a
few seconds a solve at these sizes: `scripts/bench_iopddl.py`)."""
WHOLE_TIME_S = 60.0
"""The whole problem's solve at most (half the time left at most)."""
WINDOW_MAX_STRATEGIES = 128
"""Groups with more strategies stay out of windows (their edges' pair variables would
make one window's LP as large as a whole problem)."""
PAIR_PASSES = 2
"""Pair passes before the rounds of tree moves, windows and kicks (a pass over IOPDDL K's
45k edges takes seconds and the third gains little)."""
REWEIGH_EVERY = 5_000
"""Picks between two updates of the weights `pick` draws by."""
PRICE_TRIES = 6
"""Prices a tree move tries on overfull points before it gives up."""


@dataclass
class Groups:
    """The merged problem: a node per group of tied nodes of `g`."""

    g: Graph
    members: list[np.ndarray]
    """Group -> its nodes of g (the root first)."""
    maps: list[np.ndarray]
    """Node of g -> F_v, an index array over its group root's strategies."""
    group: np.ndarray
    """Node of g -> its group."""
    cost: list[np.ndarray]
    """c_G (+inf: forbidden)."""
    cuts: list[np.ndarray]
    """Group -> the points that bound its segments (ascending; segment s is
    cuts[s] <= p < cuts[s + 1])."""
    usage: list[np.ndarray]
    """U_G, [segments, strategies] (0 on a segment no member is live on)."""
    adj: list[list[tuple[np.ndarray, int]]]
    """Group -> (C_GH [k_G, k_H], H) per neighbour group."""
    limit: float
    points: int

    @property
    def size(self) -> int:
        return len(self.cost)

    def expand(self, y: np.ndarray) -> np.ndarray:
        """The plan of g that group plan y stands for."""
        x = np.zeros(self.g.size, dtype=np.int64)
        for members, k in zip(self.members, y.tolist(), strict=True):
            for v in members.tolist():
                x[v] = self.maps[v][k]
        return x

    def contract(self, x: np.ndarray) -> np.ndarray | None:
        """The group plan that expands to x; None when x breaks a tie."""
        y = np.zeros(self.size, dtype=np.int64)
        for a, members in enumerate(self.members):
            root = int(members[0])
            k = int(x[root])
            if any(self.maps[v][k] != x[v] for v in members.tolist()):
                return None
            y[a] = k
        return y

    def levels(self, y: np.ndarray) -> np.ndarray:
        """Usage at every point under group plan y."""
        delta = np.zeros(self.points + 1)
        for cuts, usage, k in zip(self.cuts, self.usage, y.tolist(), strict=True):
            delta[cuts[:-1]] += np.diff(usage[:, k], prepend=0.0)
            delta[cuts[-1]] -= usage[-1, k]
        return np.cumsum(delta)[: self.points]

    def fits(self, y: np.ndarray) -> bool:
        """Is group plan y's usage within the limit at every point?"""
        return bool((self.levels(y) <= self.limit).all())

    def total(self, y: np.ndarray) -> float:
        total = sum(float(c[k]) for c, k in zip(self.cost, y.tolist(), strict=True))
        for a, row in enumerate(self.adj):
            total += sum(float(m[y[a], y[b]]) for m, b in row if b > a)
        return total

    def lower_bound(self) -> float:
        """A valid lower bound on any plan's cost: each edge between groups counted with
        its lower-numbered end, which takes its cheapest strategy given the edge's best
        partner (the ties inside a group are exact)."""
        total = 0.0
        for a, (c, row) in enumerate(zip(self.cost, self.adj, strict=True)):
            extra = np.zeros(len(c))
            for m, b in row:
                if b > a:
                    extra += m.min(axis=1)
            total += float((c + extra).min())
        return total


def merge(g: Graph) -> Groups:
    """Groups of g's tied nodes (components of its one-to-one edges), each a node."""
    links: list[list[tuple[np.ndarray, int]]] = [[] for _ in range(g.size)]
    for (u, v, m), tie in zip(g.edges, g.ties, strict=True):
        if tie:
            finite = np.isfinite(m)
            links[u].append((np.argmax(finite, axis=1), v))
            links[v].append((np.argmax(finite, axis=0), u))
    group = np.full(g.size, -1, dtype=np.int64)
    maps: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * g.size
    members: list[np.ndarray] = []
    for r in range(g.size):
        if group[r] >= 0:
            continue
        a = len(members)
        group[r], maps[r] = a, np.arange(len(g.cost[r]))
        found, queue = [r], deque([r])
        while queue:
            u = queue.popleft()
            for to, w in links[u]:
                if group[w] < 0:
                    group[w], maps[w] = a, to[maps[u]]
                    found.append(w)
                    queue.append(w)
        members.append(np.array(found, dtype=np.int64))
    alone = np.array([len(found) == 1 for found in members])  # the usual group: maps[v] is 0..k-1
    cost = [
        g.cost[int(found[0])].copy()
        if alone[a]
        else np.sum([g.cost[v][maps[v]] for v in found.tolist()], axis=0)
        for a, found in enumerate(members)
    ]
    between: dict[tuple[int, int], np.ndarray] = {}
    for u, v, m in g.edges:
        a, b = int(group[u]), int(group[v])
        mapped = m if alone[a] and alone[b] else m[np.ix_(maps[u], maps[v])]
        if a == b:
            cost[a] = cost[a] + np.diagonal(mapped)
            continue
        key, mapped = ((a, b), mapped) if a < b else ((b, a), mapped.T)
        between[key] = between[key] + mapped if key in between else mapped
    adj: list[list[tuple[np.ndarray, int]]] = [[] for _ in members]
    for (a, b), m in between.items():
        adj[a].append((m, b))
        adj[b].append((np.ascontiguousarray(m.T), a))
    cuts, usage = zip(*(_segments(g, found, maps) for found in members), strict=True)
    return Groups(g, members, maps, group, cost, list(cuts), list(usage), adj, g.limit, g.points)


def _segments(g: Graph, found: np.ndarray, maps: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A group's cuts and its usage per segment and strategy (see `Groups`)."""
    if len(found) == 1:
        v = int(found[0])
        if g.hi[v] > g.lo[v]:
            return np.array([g.lo[v], g.hi[v]]), g.usage[v][None, :]
    lo, hi = g.lo[found], g.hi[found]
    live = hi > lo
    k = len(maps[int(found[0])])
    if not live.any():
        return np.array([0, 0]), np.zeros((1, k))
    cuts = np.unique(np.concatenate([lo[live], hi[live]]))
    rows = np.array([g.usage[v][maps[v]] for v in found[live].tolist()])
    delta = np.zeros((len(cuts), k))
    np.add.at(delta, np.searchsorted(cuts, lo[live]), rows)
    np.add.at(delta, np.searchsorted(cuts, hi[live]), -rows)
    return cuts, np.cumsum(delta, axis=0)[:-1]


class GroupSearch:
    """A group plan that fits, its usage levels and total, and the moves of the module
    doc (every move keeps the limit)."""

    def __init__(self, groups: Groups, y: np.ndarray, deadline: float, seed: int = 0) -> None:
        self.gr = groups
        self.y = y.copy()
        self.level = groups.levels(y)
        self.cost = groups.total(y)
        self.deadline = deadline
        self.rng = np.random.default_rng(seed)
        self.moves = 0
        self.log: list[tuple[int, int]] | None = None
        """(group, strategy before) per move while a kick may be undone."""
        self.movable = np.flatnonzero([len(c) > 1 for c in groups.cost])
        self.weights = np.zeros(0)
        """Per movable group, its share of the total (`pick`), as of `picks_left` ago."""
        self.picks_left = 0

    def out_of_time(self) -> bool:
        return time.perf_counter() >= self.deadline

    def local(self, a: int, skip: int = -1) -> np.ndarray:
        """Cost of each strategy of group a given its neighbours (`skip` left out)."""
        total = self.gr.cost[a]
        for m, b in self.gr.adj[a]:
            if b != skip:
                total = total + m[:, self.y[b]]
        return total

    def highest(self, a: int) -> np.ndarray:
        """Per segment of a's live points, the highest level in it (a must have some)."""
        cuts = self.gr.cuts[a]
        return np.maximum.reduceat(self.level[cuts[0] : cuts[-1]], cuts[:-1] - cuts[0])

    def fits(self, a: int) -> np.ndarray:
        """Per strategy of a: does the level stay within the limit if a takes it?"""
        cuts, usage = self.gr.cuts[a], self.gr.usage[a]
        if cuts[-1] <= cuts[0]:
            return np.ones(usage.shape[1], dtype=bool)
        grow = usage - usage[:, self.y[a], None]
        return column_all(self.highest(a)[:, None] + grow <= self.gr.limit)

    def apply(self, a: int, k: int, gain: float) -> None:
        """a takes k; `gain` is what the total drops by."""
        cuts, usage = self.gr.cuts[a], self.gr.usage[a]
        cur = int(self.y[a])
        if cuts[-1] > cuts[0]:
            grow = usage[:, k] - usage[:, cur]
            if grow.any():
                self.level[cuts[0] : cuts[-1]] += np.repeat(grow, np.diff(cuts))
        if self.log is not None:
            self.log.append((a, cur))
        self.y[a] = k
        self.moves += 1
        if math.isfinite(gain) and math.isfinite(self.cost):
            self.cost -= gain
        else:  # leaving (or entering) a forbidden choice: counted again
            self.cost = self.gr.total(self.y)

    def single(self, a: int) -> bool:
        """a's best strategy that fits; True when it moved."""
        total = self.local(a)
        cur = int(self.y[a])
        better = total < _threshold(float(total[cur]))
        if not better.any():
            return False
        better &= self.fits(a)
        if not better.any():
            return False
        k = int(np.argmin(np.where(better, total, np.inf)))
        self.apply(a, k, float(total[cur] - total[k]))
        return True

    def pair(self, a: int, b: int, m: np.ndarray) -> bool:
        """a and its neighbour b (m = C_ab) take their best pair of strategies that
        fits; True when they moved."""
        ka, kb = int(self.y[a]), int(self.y[b])
        la, lb = self.local(a, skip=b), self.local(b, skip=a)
        joint = la[:, None] + lb[None, :] + m
        now = float(joint[ka, kb])
        joint = np.where(self.fits(a)[:, None], joint, np.inf)
        k, l = np.unravel_index(int(np.argmin(joint)), joint.shape)
        if not joint[k, l] < _threshold(now) or (k == ka and l == kb):
            return False
        gain_a = float(la[ka] + m[ka, kb] - la[k] - m[k, kb])
        self.apply(a, int(k), gain_a)
        if l != kb:
            if not self.fits(b)[l]:
                self.undo_one(a, ka, gain_a)
                return False
            self.apply(b, int(l), now - float(joint[k, l]) - gain_a)
        return True

    def undo_one(self, a: int, k: int, gain: float) -> None:
        self.apply(a, k, -gain)
        if self.log is not None:
            self.log.pop()
            self.log.pop()
        self.moves -= 2

    def descend(self, queue: deque[int] | None = None, most: int | None = None) -> None:
        """Single moves until none improves (or the deadline, or `most` moves): a queue
        of groups, a group queued again when a neighbour moves."""
        gr = self.gr
        if queue is None:
            queue = deque(a for a in range(gr.size) if len(gr.cost[a]) > 1)
        queued = np.zeros(gr.size, dtype=bool)
        queued[list(queue)] = True
        steps = made = 0
        while queue:
            a = queue.popleft()
            queued[a] = False
            steps += 1
            if steps % CHECK_EVERY == 0 and self.out_of_time():
                return
            if self.single(a):
                made += 1
                if most is not None and made >= most:
                    return
                for _, b in gr.adj[a]:
                    if not queued[b]:
                        queued[b] = True
                        queue.append(b)

    def pairs(self) -> int:
        """One pass of pair moves over every edge between groups, each followed by a
        descent around its ends; the number that moved."""
        moved = 0
        for a in self.rng.permutation(self.gr.size).tolist():
            for m, b in self.gr.adj[a]:
                if b > a and self.pair(a, b, m):
                    moved += 1
                    self.descend(deque([a, b, *(w for _, w in self.gr.adj[a])]))
            if self.out_of_time():
                break
        return moved

    def pick(self) -> int:
        """A movable group (-1: none): half the time drawn by what it costs now (its own
        cost and half of each of its edges; where the plan is dear, a move is likely to
        pay), else uniformly."""
        if not len(self.movable):
            return -1
        if self.rng.random() < 0.5:
            return int(self.rng.choice(self.movable))
        if self.picks_left <= 0:
            self.picks_left = REWEIGH_EVERY
            dear = np.array(
                [
                    self.gr.cost[a][self.y[a]]
                    + 0.5 * sum(float(m[self.y[a], self.y[b]]) for m, b in self.gr.adj[a])
                    for a in self.movable.tolist()
                ]
            )
            dear[~np.isfinite(dear)] = 0.0
            self.weights = (
                dear / dear.sum() if dear.sum() > 0 else np.full(len(dear), 1 / len(dear))
            )
        self.picks_left -= 1
        return int(self.movable[self.rng.choice(len(self.movable), p=self.weights)])

    def kick(self) -> bool:
        """One kick of the module doc; True when it lowered the total."""
        gr = self.gr
        a = self.pick()
        if a < 0:
            return False
        allowed = np.flatnonzero(np.isfinite(self.local(a)) & self.fits(a))
        allowed = allowed[allowed != self.y[a]]
        if not len(allowed):
            return False
        before = self.cost
        self.log = []
        k = int(self.rng.choice(allowed))
        total = self.local(a)
        self.apply(a, k, float(total[self.y[a]] - total[k]))
        self.descend(deque(b for _, b in gr.adj[a]), most=KICK_RADIUS)
        log, self.log = self.log, None
        if self.cost < _threshold(before):
            return True
        for b, k_before in reversed(log):
            total = self.local(b)
            self.apply(b, k_before, float(total[self.y[b]] - total[k_before]))
        self.cost = before
        return False

    def tree(self, size: int) -> list[tuple[int, int]]:
        """An induced tree of about `size` groups (no edge between two of them but the
        tree's), grown breadth first from a random movable group: (group, its parent; -1 for
        the root), parents first."""
        gr, rng = self.gr, self.rng
        if not len(self.movable):
            return []
        root = int(rng.choice(self.movable))
        inside = {root: -1}
        blocked: set[int] = set()  # neighbours of two members: never a member
        frontier = deque([root])
        while frontier and len(inside) < size:
            a = frontier.popleft()
            row = gr.adj[a]
            for i in rng.permutation(len(row)).tolist():
                b = row[i][1]
                if b in inside or b in blocked or len(inside) >= size:
                    continue
                if any(w in inside and w != a for _, w in gr.adj[b]):
                    blocked.add(b)
                    continue
                inside[b] = a
                frontier.append(b)
        return list(inside.items())

    def tree_move(self, size: int = TREE_GROUPS) -> bool:
        """The groups of an induced tree (`tree`) jointly at their best strategies,
        everything outside held (dynamic programming over the tree: exact; see
        `joint_move`). True when the total went down."""
        nodes = self.tree(size)
        if len(nodes) < 2:
            return False
        index = {a: i for i, (a, _) in enumerate(nodes)}
        edges = [
            (index[p], i, next(m for m, b in self.gr.adj[p] if b == a))
            for i, (a, p) in enumerate(nodes)
            if i
        ]
        return self.joint_move(
            [a for a, _ in nodes], edges, lambda unary: _tree_dp(nodes, index, unary, edges)
        )

    def window_move(
        self,
        size: int = WINDOW_GROUPS,
        time_limit: float = WINDOW_TIME_S,
        pairs: int = WINDOW_PAIRS,
    ) -> bool:
        """About `size` groups grown breadth first from a random one (of at most
        WINDOW_MAX_STRATEGIES strategies each, the window's edges at most `pairs` pairs
        of strategies) jointly at their best strategies by the exact solver
        (`solve_ilp` without memory rows; see `joint_move`). True when the total went
        down."""
        gr, rng = self.gr, self.rng
        if not len(self.movable):
            return False
        root = int(rng.choice(self.movable))
        if len(gr.cost[root]) > WINDOW_MAX_STRATEGIES:
            return False
        index, queue, held = {root: 0}, deque([root]), 0
        if size >= gr.size:  # the whole problem
            index = {a: i for i, a in enumerate(self.movable.tolist())}
            queue.clear()
        while queue and len(index) < size:
            row = gr.adj[queue.popleft()]
            for i in rng.permutation(len(row)).tolist():
                b = row[i][1]
                if b in index or len(gr.cost[b]) > WINDOW_MAX_STRATEGIES or len(index) >= size:
                    continue
                more = sum(m.size for m, w in gr.adj[b] if w in index)
                if held + more <= pairs:
                    index[b] = len(index)
                    queue.append(b)
                    held += more
        nodes = list(index)
        edges = [
            (i, index[b], m)
            for i, a in enumerate(nodes)
            for m, b in gr.adj[a]
            if index.get(b, -1) > i
        ]

        def exact(unary: list[np.ndarray]) -> list[int]:
            problem = ShardingProblem(
                tuple(
                    ProblemNode(str(a), tuple(map(str, range(len(u)))), u, np.zeros(len(u)))
                    for a, u in zip(nodes, unary, strict=True)
                ),
                tuple(ProblemEdge(i, j, m) for i, j, m in edges),
            )
            limit = max(MIN_WINDOW_S, min(time_limit, self.deadline - time.perf_counter()))
            options = SolveOptions(time_limit_s=limit, seed=self.moves)
            return list(
                solve_ilp(problem, options, start=tuple(int(self.y[a]) for a in nodes)).choice
            )

        return self.joint_move(nodes, edges, exact)

    def joint_move(
        self,
        nodes: list[int],
        edges: list[tuple[int, int, np.ndarray]],
        solve: Callable[[list[np.ndarray]], list[int]],
    ) -> bool:
        """`nodes` (groups; `edges` every edge among them, (i, j, C) by position) at the
        strategies `solve` picks for their costs `unary` (own cost plus the edges to
        groups outside, held), taken when the total goes down and the level stays within
        the limit; when it does not, solved again with the usage on the overfull points
        priced (the first price trades the move's gain for its excess, then doubled, up
        to PRICE_TRIES times). True when the total went down."""
        gr = self.gr
        inside = set(nodes)
        unary = []
        for a in nodes:
            u = gr.cost[a]
            for m, b in gr.adj[a]:
                if b not in inside:
                    u = u + m[:, self.y[b]]
            unary.append(u)

        def value(choice: list[int]) -> float:
            total = sum(float(u[k]) for u, k in zip(unary, choice, strict=True))
            return total + sum(float(m[choice[i], choice[j]]) for i, j, m in edges)

        before = value([int(self.y[a]) for a in nodes])
        if not math.isfinite(before):
            return False
        price = 0.0
        hot = np.zeros(len(self.level), dtype=bool)
        for _ in range(PRICE_TRIES):
            if price and self.out_of_time():
                return False
            priced = [
                u + price * self._hot_usage(a, hot) if price else u
                for u, a in zip(unary, nodes, strict=True)
            ]
            choice = solve(priced)
            after = value(choice)
            if not after < _threshold(before):
                return False
            old = [(a, int(self.y[a])) for a in nodes]
            for a, k in zip(nodes, choice, strict=True):
                if k != self.y[a]:
                    self.apply(a, k, 0.0)
            over = self.level > gr.limit
            if not over.any():
                self.cost -= before - after
                return True
            excess = float((self.level - gr.limit)[over].sum())
            for a, k in old:
                if k != self.y[a]:
                    self.apply(a, k, 0.0)
            hot |= over
            price = (before - after) / excess if not price else price * 2
        return False

    def _hot_usage(self, a: int, hot: np.ndarray) -> np.ndarray:
        """Per strategy of a, its usage summed over its segments that hold a hot point."""
        cuts, usage = self.gr.cuts[a], self.gr.usage[a]
        if cuts[-1] <= cuts[0]:
            return np.zeros(usage.shape[1])
        held = np.logical_or.reduceat(hot[cuts[0] : cuts[-1]], cuts[:-1] - cuts[0])
        return usage[held].sum(axis=0)

    def run(self) -> None:
        """Descent, up to PAIR_PASSES pair passes while they help, the whole problem as
        one window when it is small enough (WHOLE_PAIRS; half the time left), then
        rounds of a tree move, a window move and kicks until the deadline or until
        FRUITLESS_KICKS per group in a row found nothing."""
        self.descend()
        for _ in range(PAIR_PASSES):
            if self.out_of_time() or not self.pairs():
                break
        gr = self.gr
        whole = sum(m.size for row in gr.adj for m, _ in row) // 2
        if (
            gr.size <= WHOLE_GROUPS
            and whole <= WHOLE_PAIRS
            and all(len(c) <= WINDOW_MAX_STRATEGIES for c in gr.cost)
        ):
            left = self.deadline - time.perf_counter()
            self.window_move(size=gr.size, time_limit=min(left / 2, WHOLE_TIME_S), pairs=whole)
        fruitless, enough = 0, max(MIN_KICKS, FRUITLESS_KICKS * self.gr.size)
        while fruitless < enough and not self.out_of_time():
            fruitless = 0 if self.tree_move() else fruitless + 1
            fruitless = 0 if self.window_move() else fruitless + 1
            for _ in range(CHECK_EVERY // 8):
                fruitless = 0 if self.kick() else fruitless + 1


def _tree_dp(
    nodes: list[tuple[int, int]],
    index: dict[int, int],
    unary: list[np.ndarray],
    edges: list[tuple[int, int, np.ndarray]],
) -> list[int]:
    """Dynamic programming over a tree (nodes parents first; edges[i - 1] = (parent's
    position, i, C[parent, i])):
        f_i[k]     = unary_i[k] + sum_{children c} min_l (C[i, c][k, l] + f_c[l])
    the argmin at the root, then each child's argmin given its parent's choice."""
    f = [u.copy() for u in unary]
    best: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(nodes)
    for i in range(len(nodes) - 1, 0, -1):
        p, _, m = edges[i - 1]
        joint = m + f[i][None, :]
        best[i] = np.argmin(joint, axis=1)
        f[p] = f[p] + joint[np.arange(len(joint)), best[i]]
    choice = [0] * len(nodes)
    choice[0] = int(np.argmin(f[0]))
    for i in range(1, len(nodes)):
        choice[i] = int(best[i][choice[index[nodes[i][1]]]])
    return choice


def column_all(ok: np.ndarray) -> np.ndarray:
    """Column-wise all, as a bool array (mypy: numpy's `all` is typed loosely)."""
    return np.asarray(ok.all(axis=0), dtype=bool)
