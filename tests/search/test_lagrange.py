"""Lagrangian rounds on the group problem (rhino.search.iopddl.lagrange): the priced costs are
the costs plus the priced usage the nodes hold, a repaired plan keeps the limit, and the
rounds hand back a plan that fits and costs no more than their start, on seeded random
instances with chains of ties."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rhino.search import iopddl
from rhino.search.iopddl import lagrange
from rhino.search.problem import SolveOptions
from tests.search.test_groups import merged_and_start


@pytest.mark.parametrize("seed", range(8))
def test_priced_costs_add_the_priced_usage(seed: int) -> None:
    _, merged, _ = merged_and_start(seed + 300)
    rng = np.random.default_rng(seed)
    price = rng.random(merged.points) * (rng.random(merged.points) < 0.5)
    priced = lagrange._priced(merged, price)
    for _ in range(10):
        y = np.array([rng.integers(len(c)) for c in merged.cost])
        own = sum(float(c[k]) for c, k in zip(merged.cost, y.tolist(), strict=True))
        with_prices = sum(float(c[k]) for c, k in zip(priced, y.tolist(), strict=True))
        if np.isfinite(own):
            assert with_prices == pytest.approx(own + float(price @ merged.levels(y)))


@pytest.mark.parametrize("seed", range(8))
def test_repair_keeps_the_limit(seed: int) -> None:
    instance, merged, start = merged_and_start(seed + 400)
    merged = dataclasses.replace(merged, limit=float(merged.levels(start).max()))  # tight
    rng = np.random.default_rng(seed)
    tried = 0
    for _ in range(20):
        y = np.array([rng.integers(len(c)) for c in merged.cost])
        if (merged.levels(y) <= merged.limit).all():
            continue
        tried += 1
        fixed = lagrange.repair(merged, y, float("inf"))
        if fixed is not None:
            assert (merged.levels(fixed) <= merged.limit).all()
            assert iopddl.check(instance, merged.expand(fixed).tolist()).peak <= instance.limit
    if not tried:
        pytest.skip("every drawn plan fits")


@pytest.mark.parametrize("relax", ["search", "passing", "wcsp"])
@pytest.mark.parametrize("seed", range(8))
def test_rounds_keep_the_limit_and_never_lose(seed: int, relax: lagrange.Relax) -> None:
    instance, merged, y = merged_and_start(seed + 500)
    before = merged.total(y)
    reported: list[tuple[np.ndarray, float]] = []
    best = lagrange.rounds(
        merged,
        y,
        float("inf"),
        seed=seed,
        most=4,
        relax=relax,
        report=lambda y, bound: reported.append((y.copy(), bound)),
    )
    assert best.cost == merged.total(best.y)
    assert best.cost <= before
    costs = [merged.total(r) for r, _ in reported]
    assert costs == sorted(costs, reverse=True)
    assert (best.cost == before) == (not costs or costs[-1] == before)
    if reported:
        assert (reported[-1][0] == best.y).all() and reported[-1][1] == best.bound
    if relax == "wcsp":  # toulbar2's bounds, less the prices: below every plan that fits
        optimum = iopddl.solve(instance, SolveOptions(time_limit_s=3600)).check.cost  # proven
        assert -np.inf < best.bound <= optimum + 1e-6
    else:
        assert best.bound == -np.inf
    judged = iopddl.check(instance, merged.expand(best.y).tolist())
    assert judged.peak <= instance.limit
    assert judged.feasible or not np.isfinite(before)


@pytest.mark.parametrize("gains", [False, True])
def test_rounds_with_message_passing_end_where_it_gains_nothing(
    gains: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Message passing that decodes no plan cheaper than its start on the first relaxed
    problem adds nothing to the group search after it: the rounds with it end there (the
    rounds without it have the time); where it gains, they go on."""
    from rhino.search.iopddl import trws

    def run(self: trws.MessagePassing, deadline: float, most: int = 0) -> np.ndarray:
        self.gained = gains
        return self.y

    monkeypatch.setattr(trws.MessagePassing, "run", run)
    for seed in range(8):
        _, merged, y = merged_and_start(seed + 400)
        merged = dataclasses.replace(merged, limit=float(merged.levels(y).max()))  # tight
        free = dataclasses.replace(merged, limit=float("inf"))
        if (
            merged.levels(lagrange._relaxed(free, y, None, float("inf"), seed).y) <= merged.limit
        ).all():
            continue  # no limit binds: no rounds either way
        best = lagrange.rounds(merged, y, float("inf"), seed=seed, most=2, relax="passing")
        assert best.rounds == (2 if gains else 0)
        return
    pytest.fail("no drawn instance where the limit binds")
