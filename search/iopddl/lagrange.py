"""Lagrangian rounds on the group problem: the memory rows priced instead of kept, the
priced problem searched with no limit, its plan repaired into the limit and polished.

On IOPDDL's large instances the limit is what costs: with no limit the group search
reaches 8.5e8 on K, 5.7e8 on U, 5.1e8 on S, while the best plans that fit cost 2.3e9,
2.6e9 and 1.5e9, and a search that never leaves the limit stops far above those (3.8e9,
4.2e9, 2.0e9). A search under prices crosses the infeasible region the limit walls off.

Data (`Groups`: c_G, C_GH, U_G per segment; the limit B per point p)
    hot        the points some priced plan put over B (grown each round)
    lambda_p   the price of a byte at point p (0 off the hot points)
Model (relaxed)
    minimize   sum_G c_G[y_G] + sum_GH C_GH[y_G, y_H] + sum_p lambda_p * L_p(y)
    no limit   L_p(y) <= B is not kept
The first search has no prices; the points it puts over B are hot, each priced at its
gap to the plan that fits over the total excess. A round searches the priced problem
from where the last one stopped (`GroupSearch`, every move, limit +inf), multiplies each
hot point's price by exp(RATE * (L_p / B - 1)) (clipped; a new hot point takes the
median price), then `repair`s the plan (greedy: at the fullest point over B, a group
back to its strategy in the best plan, else the move that frees bytes at the least cost
per byte) and searches under the limit from there: the rounds walk along the limit's
edge. They end at the deadline or after FRUITLESS_ROUNDS in a row found nothing.

Bound. For any prices lambda >= 0, min_y [cost(y) + sum_p lambda_p (L_p(y) - B)] is at
most the cost of every plan that fits (the Lagrangian dual): a lower bound on the priced
problem less B * sum_p lambda_p is a lower bound on the problem. The group search and
message passing give no such bound; toulbar2 (`relax="wcsp"`) does (`Best.bound`).

With `relax="passing"`, each relaxed problem (the first, unpriced, too) is first solved by
message passing (`rhino.search.iopddl.trws`, its messages kept from round to round) and the
group search starts from its plan: on some problems the local search alone stops far
from the relaxed optimum and message passing's plan is the better start, on others (where
the unlimited plans hold several times the limit) the rounds from the local search's
plans do better, so `rhino.search.iopddl` runs both, one after the other. Where message
passing decodes no plan cheaper than its start on the first relaxed problem, the rounds
with it end there: on a problem without tied nodes it may never gain, and its rounds
would only take time from the rounds without it. `scripts/bench_iopddl.py` measures
each on the IOPDDL problems. With `relax="wcsp"`, toulbar2
(`rhino.search.iopddl.wcsp`) solves each relaxed problem in its place, in rounds of
`wcsp.ROUND_S` and more (`rhino.search.iopddl` runs them in a helper process beside the
others).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Literal

import numpy as np

from rhino.search.iopddl import wcsp
from rhino.search.iopddl.groups import Groups, GroupSearch, column_all
from rhino.search.iopddl.trws import MessagePassing
from rhino.search.iopddl.wcsp import Wcsp

ROUND_SHARE = 0.1
"""A round's time, as a share of the time the rounds have (at least MIN_ROUND_S)."""
MIN_ROUND_S = 1.0
POLISH_SHARE = 0.5
"""Of a round's time, the share of the search under the limit after the repair."""
FRUITLESS_ROUNDS = 5
"""The rounds end after this many in a row found no cheaper plan (K finds one every
round or two)."""
PASSING_SHARE = 0.6
"""Of a relaxed search's time, the share of message passing."""
RATE = 30.0
STEP = 1.0
"""After a round, a hot point's price is multiplied by exp(RATE * (L_p / B - 1)), the
exponent clipped to [-STEP, STEP]: 1 % over the limit, x1.35; 1 % under, x0.74."""


Relax = Literal["search", "passing", "wcsp"]
Relaxer = MessagePassing | Wcsp
"""What solves a relaxed problem before the group search (they share an interface)."""


@dataclasses.dataclass
class Best:
    """The cheapest plan that fits found so far."""

    y: np.ndarray
    cost: float
    rounds: int = 0
    repaired: int = 0
    """Rounds whose priced plan broke the limit and was repaired."""
    bound: float = -math.inf
    """The best Lagrangian lower bound on the cost of a plan that fits: a relaxed
    problem's lower bound (where its solver gives one, `Wcsp`), less the limit times the
    sum of its prices."""
    report: Callable[[np.ndarray, float], None] | None = None
    """Handed (plan, bound) each time a cheaper plan is kept or the bound rises."""


@dataclasses.dataclass
class _Chain:
    """The walk of rounds: its last relaxed plan, its prices and hot points, and its
    message passing (None: the relaxed search is the group search from the last plan)."""

    current: np.ndarray
    price: np.ndarray
    hot: np.ndarray
    passing: Relaxer | None


def rounds(
    gr: Groups,
    y: np.ndarray,
    deadline: float,
    seed: int = 0,
    most: int | None = None,
    relax: Relax = "search",
    report: Callable[[np.ndarray, float], None] | None = None,
) -> Best:
    """Lagrangian rounds (module doc) from `y`, a plan that fits, until `deadline` (or
    `most` rounds); the cheapest plan that fits (y itself if none beats it). `relax`
    names what solves each relaxed problem (the first one too) before the group search
    (see `_relaxed`): nothing ("search"), message passing ("passing") or toulbar2
    ("wcsp", rounds of `wcsp.ROUND_S` at least). `report` is handed (the best plan that fits, the
    best bound) as either improves."""
    best = Best(y.copy(), gr.total(y), report=report)
    free = dataclasses.replace(gr, limit=math.inf)
    messages: Relaxer | None = None
    least = MIN_ROUND_S
    if relax == "passing":
        messages = MessagePassing(free, y)
    elif relax == "wcsp":
        messages, least = Wcsp(free, y, seed), wcsp.ROUND_S
    first = _relaxed(free, y, messages, _slice(deadline, least), seed)
    _bound(best, messages, 0.0)
    if messages is not None and not messages.gained:  # it adds nothing to the group search
        _keep(best, gr, first.y)
        return best
    level = gr.levels(first.y)
    excess = float(np.maximum(level - gr.limit, 0.0).sum())
    if excess <= 0 or not math.isfinite(best.cost - first.cost):  # no limit binds, or no price
        _keep(best, gr, first.y)
        return best
    hot = level > gr.limit
    price = np.where(hot, max(best.cost - first.cost, 1.0) / excess, 0.0)
    chain = _Chain(first.y, price, hot, messages)
    found = 0  # the round that last found a cheaper plan
    while (
        time.perf_counter() < deadline - MIN_ROUND_S
        and best.rounds != most
        and best.rounds - found < FRUITLESS_ROUNDS
    ):
        best.rounds += 1
        if _round(gr, chain, best, deadline, seed + best.rounds, least):
            found = best.rounds
    return best


def _round(
    gr: Groups, chain: _Chain, best: Best, deadline: float, seed: int, least: float = MIN_ROUND_S
) -> bool:
    """One round of `chain` (`least` seconds at least): its priced problem searched, its
    prices moved, its plan repaired and polished; True when that gave a cheaper plan that
    fits."""
    begin, end = time.perf_counter(), _slice(deadline, least)
    priced = dataclasses.replace(gr, limit=math.inf, cost=_priced(gr, chain.price))
    search = _relaxed(
        priced,
        chain.current,
        chain.passing,
        time.perf_counter() + (end - time.perf_counter()) * (1 - POLISH_SHARE),
        seed,
    )
    chain.current = search.y
    _bound(best, chain.passing, float(chain.price.sum()) * gr.limit)
    level = gr.levels(search.y)
    over = level > gr.limit
    price, hot = chain.price, chain.hot
    price[hot] *= np.exp(np.clip(RATE * (level[hot] / gr.limit - 1), -STEP, STEP))
    price[over & ~hot] = np.median(price[hot])
    hot |= over
    fixed = search.y
    if over.any():
        best.repaired += 1
        more = min(deadline, 2 * end - begin)  # a round more at most
        repaired = repair(gr, search.y, more, best.y)
        if repaired is None:
            return False
        fixed = repaired
    polished = GroupSearch(gr, fixed, end, seed=seed)
    polished.run()
    return _keep(best, gr, polished.y)


def _relaxed(
    gr: Groups, y: np.ndarray, passing: Relaxer | None, deadline: float, seed: int
) -> GroupSearch:
    """The relaxed problem `gr` (limit +inf) searched from y; with `passing`, first its
    share of the time (PASSING_SHARE for message passing, `rhino.search.iopddl.trws`, warm from
    its last round's messages; `wcsp.SHARE` for toulbar2) on it, and the group search from
    the cheaper of y and its plan."""
    if passing is not None:
        share = wcsp.SHARE if isinstance(passing, Wcsp) else PASSING_SHARE
        passing.y = y.copy()
        passing.reprice(gr.cost)
        passing.run(time.perf_counter() + (deadline - time.perf_counter()) * share)
        y = passing.y
    found = GroupSearch(gr, y, deadline, seed=seed)
    found.run()
    return found


def _slice(deadline: float, least: float = MIN_ROUND_S) -> float:
    left = deadline - time.perf_counter()
    return time.perf_counter() + min(left, max(least, left * ROUND_SHARE))


def _keep(best: Best, gr: Groups, y: np.ndarray) -> bool:
    """y as the best plan if it fits and costs less (reported); True when it does."""
    cost = gr.total(y)
    if cost < best.cost and gr.fits(y):
        best.y, best.cost = y.copy(), cost
        if best.report is not None:
            best.report(best.y, best.bound)
        return True
    return False


def _bound(best: Best, solver: Relaxer | None, priced: float) -> None:
    """The bound of the relaxed problem `solver` last solved (its prices add `priced`
    = limit x sum of prices to every plan's cost) as best's bound if higher (reported)."""
    bound = (-math.inf if solver is None else solver.bound) - priced
    if bound > best.bound:
        best.bound = bound
        if best.report is not None:
            best.report(best.y, best.bound)


def _priced(gr: Groups, price: np.ndarray) -> list[np.ndarray]:
    """c_G[k] + sum_p price_p * (G's usage at p under k)."""
    out = []
    counts = np.concatenate([[0.0], np.cumsum(price)])
    for c, cuts, usage in zip(gr.cost, gr.cuts, gr.usage, strict=True):
        if cuts[-1] <= cuts[0]:
            out.append(c)
            continue
        per_segment = np.diff(counts[cuts]).astype(np.float64)
        out.append(c + per_segment @ usage)
    return out


def repair(
    gr: Groups, y: np.ndarray, deadline: float, anchor: np.ndarray | None = None
) -> np.ndarray | None:
    """y moved into the limit greedily: while some point is over, the moves that free
    bytes at the fullest point p and lift no point above the limit and p's level, the
    cheapest per byte freed (up to the excess) first, until p's excess is freed; a
    group back to its strategy in `anchor` (a plan that fits) before any other move.
    None when no move frees any, or at the deadline."""
    s = GroupSearch(gr, y, deadline)
    first = np.array([c[0] for c in gr.cuts])
    last = np.array([c[-1] for c in gr.cuts])
    while True:
        over = s.level - gr.limit
        p = int(np.argmax(over))
        if over[p] <= 0:
            return s.y
        if s.out_of_time():
            return None
        live = s.movable[(first[s.movable] <= p) & (last[s.movable] > p)].tolist()
        home = s.y if anchor is None else anchor
        rated = sorted((_freeing(s, a, p, int(home[a])), a) for a in live if home[a] != s.y[a])
        if not rated or not math.isfinite(rated[0][0][0]):
            rated = sorted((_freeing(s, a, p), a) for a in live)
        if not rated or not math.isfinite(rated[0][0][0]):
            return None
        for (rate, k), a in rated:
            if not math.isfinite(rate) or s.level[p] <= gr.limit:
                break
            again, k = _freeing(s, a, p, k)  # the moves before may have changed it
            if math.isfinite(again):
                total = s.local(a)
                s.apply(a, k, float(total[s.y[a]] - total[k]))


def _freeing(s: GroupSearch, a: int, p: int, only: int = -1) -> tuple[float, int]:
    """(cost per byte freed at p, strategy) of group a's best move (to `only` if that is
    not -1) that frees bytes at p and lifts no point above both the limit and p's level;
    (inf, -1) when none does."""
    gr = s.gr
    cuts, usage = gr.cuts[a], gr.usage[a]
    cur = int(s.y[a])
    segment = int(np.searchsorted(cuts, p, "right")) - 1
    freed = usage[segment, cur] - usage[segment]
    ok = freed > 0
    if only >= 0:
        ok &= np.arange(len(ok)) == only
    if not ok.any():
        return math.inf, -1
    grow = usage - usage[:, cur, None]
    ceiling = max(gr.limit, float(s.level[p]) - 1.0)
    ok &= column_all((s.highest(a)[:, None] + grow <= ceiling) | (grow <= 0))
    total = s.local(a)
    ok &= np.isfinite(total)
    if not ok.any():
        return math.inf, -1
    per_byte = np.full(len(total), np.inf)
    excess = float(s.level[p]) - gr.limit
    per_byte[ok] = (total[ok] - total[cur]) / np.minimum(freed[ok], excess)
    k = int(np.argmin(per_byte))
    return float(per_byte[k]), k
