"""The relaxed group problem (no usage limit) solved by a weighted-CSP solver, toulbar2
(`pytoulbar2`): soft arc consistency bounds, then limited discrepancy search.

Data (`Groups`: unary costs c_a, possibly priced; pair costs C_ab; +inf: forbidden)
    scale      a power of two that brings the start plan's cost under TOTAL_COST
Model (a cost function network, integer costs)
    variable a       domain: a's strategies
    unary a          round(c_a[k] / scale)            (+inf: toulbar2's top, forbidden)
    binary (a, b)    round(C_ab[k, l] / scale)
    minimize         the sum

On the large IOPDDL problems whose plans without the limit hold many times the limit it
reaches cheaper relaxed plans than the group search (`scripts/bench_iopddl.py`). Its
preprocessing alone takes seconds there, so a solve is worth its time only in long
rounds: `rhino.search.iopddl.lagrange` runs it in rounds of `ROUND_S`, on the second
core (`rhino.search.iopddl`).

`Wcsp` has `MessagePassing`'s interface (`y`, `reprice`, `run`, `gained`), so the
Lagrangian rounds take either. toulbar2 writes to the process's stdout; it runs in a
helper process whose output goes nowhere.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from rhino.search.iopddl.groups import Groups

TOTAL_COST = 2.0**50
"""Costs are scaled so that the start plan costs at most this (toulbar2's costs are 64-bit
integers, and its bounds add them up)."""
LDS = 4
"""Discrepancies of toulbar2's limited discrepancy search (the contest's winner ran 4)."""
ROUND_S = 24.0
"""A Lagrangian round with this solver takes this long at least."""
SHARE = 0.85
"""Of a relaxed search's time, the share of this solver (the group search has the rest)."""
LEAST_S = 2.0
"""A run with less time than this does not start (the solver's clock counts whole seconds)."""


class Wcsp:
    """toulbar2 on the group problem `gr` (its usage ignored), run again at every price."""

    def __init__(self, gr: Groups, y: np.ndarray, seed: int = 0) -> None:
        self.gr = gr
        self.y = y.copy()
        """The best plan found under the current costs (the start until one is cheaper)."""
        self.cost = gr.total(self.y)
        self.seed = seed
        self.pairs = pairs(gr)
        self.gained = False
        """Did the last `run` find a plan cheaper than its start?"""
        self.bound = -math.inf
        self.runs = 0

    def reprice(self, cost: list[np.ndarray]) -> None:
        """New unary costs c_a; the best plan is costed again under them."""
        self.gr = dataclasses.replace(self.gr, cost=cost)
        self.cost = self.gr.total(self.y)

    def run(self, deadline: float) -> np.ndarray:
        """One solve until `deadline`; the cheaper of its plan and the last best.
        `bound` is then the solve's lower bound on the problem under the current costs
        (-inf when it did not run)."""
        start = self.cost
        self.gained = False
        self.bound = -math.inf
        left = deadline - time.perf_counter()
        if left < LEAST_S or not math.isfinite(start):
            return self.y
        found = solve(self.gr, deadline, self.seed + self.runs, start, self.pairs)
        self.runs += 1
        self.bound = found.bound
        if found.y is not None:
            cost = self.gr.total(found.y)
            if cost < self.cost:
                self.y, self.cost = found.y, cost
        self.gained = self.cost < start
        return self.y


@dataclasses.dataclass(frozen=True)
class WcspSolution:
    y: np.ndarray | None
    """The best plan found (None: none by the deadline)."""
    bound: float
    """A lower bound on every plan's cost (toulbar2's dual bound, back in the problem's
    units: scaled up, less half a unit per rounded function, plus the constant costs of
    the groups of one strategy); -inf when it has none."""


def solve(
    gr: Groups,
    deadline: float,
    seed: int = 0,
    reference: float = 0.0,
    between: list[tuple[int, int, np.ndarray]] | None = None,
) -> WcspSolution:
    """toulbar2 on the group problem `gr` (usage ignored) until `deadline`: its best plan
    and its lower bound. `reference`: a plan's cost, to scale the costs by; `between`:
    `pairs(gr)`, where the caller has it."""
    import pytoulbar2  # type: ignore[import-untyped]  # (16 MB of solver, loaded where it runs)

    scale = 2.0 ** max(0, math.ceil(math.log2(max(reference, 1.0) / TOTAL_COST)))
    cfn = pytoulbar2.CFN(ubinit=None, resolution=0, vac=0, seed=seed, verbose=-1)
    cfn.Option.lds = LDS
    for a, c in enumerate(gr.cost):
        cfn.AddVariable(f"g{a}", range(len(c)))
    constant, rounded = 0.0, 0
    for a, c in enumerate(gr.cost):
        if len(c) > 1:
            costs, exact = _integral(c, scale)
            cfn.AddFunction([a], costs)
            rounded += not exact
        else:
            constant += float(c[0])
    for a, b, m in pairs(gr) if between is None else between:
        costs, exact = _integral(m.ravel(), scale)
        cfn.AddFunction([a, b], costs)
        rounded += not exact
    seconds = 0  # no limit
    if math.isfinite(deadline):
        seconds = int(deadline - time.perf_counter())
        if seconds < 1:
            return WcspSolution(None, -math.inf)
    try:
        found = cfn.Solve(showSolutions=0, timeLimit=seconds)
    except cfn.Contradiction:  # every plan forbidden: never so for a problem with a plan
        return WcspSolution(None, -math.inf)
    bound = (float(cfn.GetDDualBound()) - 0.5 * rounded) * scale + constant
    return WcspSolution(np.array(found[0], dtype=np.int64) if found else None, bound)


def pairs(gr: Groups) -> list[tuple[int, int, np.ndarray]]:
    """Each pair cost C_ab once (a < b)."""
    return [(a, b, m) for a, row in enumerate(gr.adj) for m, b in row if b > a]


def _integral(costs: np.ndarray, scale: float) -> tuple[list[float], bool]:
    """Costs / scale, rounded (+inf kept: toulbar2's forbidden), and whether that was
    exact."""
    scaled = costs / scale
    rounded = np.rint(scaled)
    return rounded.tolist(), bool(np.array_equal(rounded, scaled))
