"""Sequential tree-reweighted message passing (TRW-S, after Kolmogorov's description) on
a group problem with no usage limit, and the plans it decodes.

Data (`Groups`: unary costs c_a, pair costs C_ab; groups of one strategy folded into
their neighbours' unary costs; +inf replaced by a large finite cost)
    order      the movable groups in index order; n_in(a) / n_out(a) the neighbours
               before / after a
    gamma_a    1 / max(n_in(a), n_out(a), 1)
    m_ab[l]    the message from a to b, per strategy l of b
Pass (forward over the order, then backward)
    h_a[k]     = c_a[k] + sum_{b ~ a} m_ba[k]
    m_ab[l]    = min_k (gamma_a * h_a[k] - m_ba[k] + C_ab[k, l])        b after a
               (normalized: its minimum subtracted)
Decoding (in the pass's order): a takes argmin_k of c_a[k] + sum over the neighbours
already decoded of C_ab[k, y_b] + sum over the others of m_ba[k]; each pass's plan is
kept if it is the cheapest so far.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from rhino.search.iopddl.groups import Groups

FORBIDDEN_SCALE = 1e3
"""+inf becomes this many times the largest finite cost (plus one)."""
MOST_PASSES = 200
"""Passes of one `run` at most (IOPDDL M, warm from nothing: its best plan after 108)."""


class MessagePassing:
    """TRW-S state over the movable groups of `gr` (its usage ignored)."""

    def __init__(self, gr: Groups, y: np.ndarray) -> None:
        self.gr = gr
        self.y = y.copy()
        """The plan the fixed groups (one strategy) hold; also the best plan decoded."""
        movable = [a for a in range(gr.size) if len(gr.cost[a]) > 1]
        self.nodes = movable
        finite = [float(np.max(c[np.isfinite(c)], initial=0.0)) for c in gr.cost]
        finite += [float(np.max(m[np.isfinite(m)], initial=0.0)) for row in gr.adj for m, _ in row]
        self.big = FORBIDDEN_SCALE * (max(finite, default=0.0) + 1.0)
        inside = np.zeros(gr.size, dtype=bool)
        inside[movable] = True
        self.unary: dict[int, np.ndarray] = {}
        self.pairs: dict[int, list[tuple[np.ndarray, int]]] = {
            a: [(self._finite(m), b) for m, b in gr.adj[a] if inside[b]] for a in movable
        }
        self.held = {a: [(m, b) for m, b in gr.adj[a] if not inside[b]] for a in movable}
        self.reprice(gr.cost)
        self.message: dict[tuple[int, int], np.ndarray] = {
            (b, a): np.zeros(len(gr.cost[a])) for a in movable for _, b in self.pairs[a]
        }
        rank = {a: i for i, a in enumerate(movable)}
        self.gamma = {}
        for a in movable:
            before = sum(rank[b] < rank[a] for _, b in self.pairs[a])
            self.gamma[a] = 1.0 / max(before, len(self.pairs[a]) - before, 1)
        self.rank = rank
        self.passes = 0
        self.gained = False
        """Did the last `run` decode a plan cheaper than its start?"""
        self.bound = -math.inf
        """Message passing gives no lower bound here (the Lagrangian rounds read it)."""

    def reprice(self, cost: list[np.ndarray]) -> None:
        """New unary costs c_a (the pair costs stay; the messages too, a warm start);
        the best plan is costed again under them."""
        self.gr = dataclasses.replace(self.gr, cost=cost)
        for a in self.nodes:
            u = cost[a]
            for m, b in self.held[a]:
                u = u + m[:, self.y[b]]
            self.unary[a] = self._finite(u)
        self.cost = self.gr.total(self.y)

    def _finite(self, m: np.ndarray) -> np.ndarray:
        return np.where(np.isfinite(m), m, self.big)

    def sweep(self, forward: bool) -> None:
        """One pass of the module doc, decoding a plan on the way."""
        order = self.nodes if forward else self.nodes[::-1]
        rank = self.rank
        decoded = self.y.copy()
        for a in order:
            h = self.unary[a].copy()
            for _, b in self.pairs[a]:
                h += self.message[(b, a)]
            pick = self.unary[a].copy()
            for m, b in self.pairs[a]:
                later = rank[b] > rank[a] if forward else rank[b] < rank[a]
                pick += self.message[(b, a)] if later else m[:, decoded[b]]
            decoded[a] = int(np.argmin(pick))
            scaled = self.gamma[a] * h
            for m, b in self.pairs[a]:
                later = rank[b] > rank[a] if forward else rank[b] < rank[a]
                if later:
                    out = (scaled - self.message[(b, a)])[:, None] + m
                    msg = out.min(axis=0)
                    self.message[(a, b)] = msg - msg.min()
        self.passes += 1
        cost = self.gr.total(decoded)
        if cost < self.cost or not math.isfinite(self.cost):
            self.y, self.cost = decoded, cost

    def run(self, deadline: float, most: int = MOST_PASSES) -> np.ndarray:
        """Forward and backward passes until `deadline` (or `most` passes); the cheapest
        plan decoded (the start when none is cheaper). `gained` says whether this run
        decoded a plan cheaper than its start."""
        start = self.cost
        for _ in range(most):
            if time.perf_counter() >= deadline:
                break
            self.sweep(forward=self.passes % 2 == 0)
        self.gained = self.cost < start
        return self.y
