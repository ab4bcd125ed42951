"""toulbar2 on the relaxed group problem (rhino.search.iopddl.wcsp): exact against brute force
on seeded random graphs with cycles and forbidden pairs, at any cost scale, silent, and
as a relaxer of the Lagrangian rounds (its plan costed as the groups cost it)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rhino.search.iopddl import wcsp
from tests.search.test_trws import brute_force, merged


def random_graph(seed: int, scale: float = 1.0, fixed: bool = False):
    """Six nodes of 2-3 strategies (node 0 of one where `fixed`), nine random edges, one
    forbidden pair; costs below 50 x scale."""
    rng = np.random.default_rng(seed)
    n = 6
    sizes = rng.integers(2, 4, n)
    if fixed:
        sizes[0] = 1
    costs = [(rng.integers(0, 50, k) * scale).tolist() for k in sizes]
    pairs = {(int(u), int(v)) for u, v in rng.integers(0, n, (9, 2)) if u < v}
    edges = [(u, v, rng.integers(0, 50, (sizes[u], sizes[v])) * scale) for u, v in sorted(pairs)]
    edges[0][2][0, 0] = np.inf  # a forbidden pair
    return merged(costs, edges)


@pytest.mark.parametrize("seed", range(8))
def test_solve_is_exact(seed: int) -> None:
    gr = random_graph(seed)
    found = wcsp.solve(gr, float("inf"))
    assert found.y is not None
    assert gr.total(found.y) == brute_force(gr) == found.bound  # proven: its bound is tight


@pytest.mark.parametrize("scale", [2.0**40, 2.0**62])
def test_solve_scales_costs_too_large_for_its_integers(scale: float) -> None:
    """Costs near 2^62 each would overflow toulbar2's 64-bit sums unscaled."""
    gr = random_graph(3, scale)
    found = wcsp.solve(gr, float("inf"), reference=scale * 1000)  # above any plan's cost
    assert found.y is not None
    assert gr.total(found.y) == brute_force(gr)
    assert found.bound <= brute_force(gr)


@pytest.mark.parametrize("seed", range(4))
def test_bound_holds_with_fractional_costs_and_fixed_groups(seed: int) -> None:
    """Priced costs are fractional (rounded for toulbar2: the bound gives half a unit per
    function back), and a group of one strategy is a constant the bound adds."""
    gr = random_graph(seed, fixed=True)
    rng = np.random.default_rng(seed)
    gr = dataclasses.replace(gr, cost=[c + rng.random(len(c)) for c in gr.cost])
    assert any(len(c) == 1 for c in gr.cost)
    found = wcsp.solve(gr, float("inf"))
    assert found.y is not None
    best = brute_force(gr)
    assert gr.total(found.y) == pytest.approx(best)
    assert best - 0.5 * (len(gr.cost) + len(wcsp.pairs(gr))) <= found.bound <= best + 1e-9


def test_solve_writes_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    wcsp.solve(random_graph(0), float("inf"))
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_run_keeps_the_cheaper_plan_and_reprices() -> None:
    gr = random_graph(1)
    start = np.array([0, 1, 1, 0, 1, 0], dtype=np.int64)[: gr.size]
    solver = wcsp.Wcsp(gr, start)
    y = solver.run(float("inf"))
    assert solver.cost == gr.total(y) == brute_force(gr)
    assert solver.gained == (gr.total(start) > solver.cost)
    solver.run(float("inf"))
    assert not solver.gained  # nothing cheaper than the optimum
    priced = [c + 100.0 * (np.arange(len(c)) == y[a]) for a, c in enumerate(gr.cost)]
    solver.reprice(priced)
    assert solver.cost == dataclasses.replace(gr, cost=priced).total(y)
    again = solver.run(float("inf"))
    assert solver.cost == brute_force(dataclasses.replace(gr, cost=priced))
    assert solver.gained and (again != y).any()


def test_run_without_time_does_not_start() -> None:
    gr = random_graph(2)
    start = np.zeros(gr.size, dtype=np.int64)
    solver = wcsp.Wcsp(gr, start)
    assert (solver.run(0.0) == start).all()
    assert not solver.gained and solver.runs == 0
