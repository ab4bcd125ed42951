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
    kick          a random group to a random strategy that fits, a descent around it,
                  undone unless the total went down (iterated local search)
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from rhino.search.local import Graph, _one_to_one, _threshold

CHECK_EVERY = 256
"""Moves between two looks at the clock."""
KICK_RADIUS = 64
"""Single moves a kick's descent may make before it is judged."""
FRUITLESS_KICKS = 50
"""Kicks end after this many per group (at least MIN_KICKS) in a row found nothing."""
MIN_KICKS = 2_000


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
    for u, v, m in g.edges:
        if _one_to_one(m):
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
    cost = [np.sum([g.cost[v][maps[v]] for v in found.tolist()], axis=0) for found in members]
    between: dict[tuple[int, int], np.ndarray] = {}
    for u, v, m in g.edges:
        a, b = int(group[u]), int(group[v])
        mapped = m[np.ix_(maps[u], maps[v])]
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
    return Groups(g, members, maps, group, cost, list(cuts), list(usage), adj, g.limit,
                  g.points)  # fmt: skip


def _segments(g: Graph, found: np.ndarray, maps: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A group's cuts and its usage per segment and strategy (see `Groups`)."""
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

    def out_of_time(self) -> bool:
        return time.perf_counter() >= self.deadline

    def local(self, a: int, skip: int = -1) -> np.ndarray:
        """Cost of each strategy of group a given its neighbours (`skip` left out)."""
        total = self.gr.cost[a]
        for m, b in self.gr.adj[a]:
            if b != skip:
                total = total + m[:, self.y[b]]
        return total

    def fits(self, a: int) -> np.ndarray:
        """Per strategy of a: does the level stay within the limit if a takes it?"""
        cuts, usage = self.gr.cuts[a], self.gr.usage[a]
        if cuts[-1] <= cuts[0]:
            return np.ones(usage.shape[1], dtype=bool)
        highest = np.maximum.reduceat(self.level[cuts[0] : cuts[-1]], cuts[:-1] - cuts[0])
        grow = usage - usage[:, self.y[a], None]
        return bool_all(highest[:, None] + grow <= self.gr.limit)

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

    def kick(self) -> bool:
        """One kick of the module doc; True when it lowered the total."""
        gr = self.gr
        a = int(self.rng.integers(gr.size))
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

    def run(self) -> None:
        """Descent, pair passes while they help, then kicks until the deadline or until
        FRUITLESS_KICKS per group in a row found nothing."""
        self.descend()
        while not self.out_of_time() and self.pairs():
            pass
        fruitless, enough = 0, max(MIN_KICKS, FRUITLESS_KICKS * self.gr.size)
        while fruitless < enough and not self.out_of_time():
            for _ in range(CHECK_EVERY // 8):
                fruitless = 0 if self.kick() else fruitless + 1


def bool_all(ok: np.ndarray) -> np.ndarray:
    """Column-wise all, as a bool array (mypy: numpy's `all` is typed loosely)."""
    return np.asarray(ok.all(axis=0), dtype=bool)


def fits_limit(groups: Groups, y: np.ndarray) -> bool:
    level = groups.levels(y)
    return not len(level) or float(level.max()) <= groups.limit or math.isinf(groups.limit)
