"""The IOPDDL format (rhino.search.iopddl), the local search and windows that solve it,
and `rhino solve`: small instances against brute force, the checker against a second
evaluation, bad files."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from rhino.hlo.errors import InfeasibleError
from rhino.search import iopddl
from rhino.search.iopddl import local, window
from rhino.search.problem import SolveOptions, Tuning
from tests.hlo.corpus import ROOT

EXAMPLE = ROOT.parent / "shared" / "iopddl" / "example.json"
LONG = SolveOptions(time_limit_s=3600)
"""Far beyond what these instances need: the searches end by proving their plan optimal."""


def example_doc() -> dict:
    """The format's own example (as in google/iopddl's README), so the tests do not need
    the shared folder."""
    return {
        "problem": {
            "name": "example",
            "nodes": {
                "intervals": [[30, 70], [40, 70], [50, 120], [110, 140], [110, 150]],
                "costs": [[15], [55, 65], [25, 45, 35], [85, 75], [95]],
                "usages": [[10], [25, 25], [15, 20, 15], [10, 10], [15]],
            },
            "edges": {
                "nodes": [[0, 1], [0, 2], [1, 3], [2, 4], [3, 4]],
                "costs": [[30, 40], [50, 10, 40], [90, 10, 20, 80], [60, 20, 30], [70, 60]],
            },
            "usage_limit": 50,
        }
    }


def random_doc(seed: int, n: int = 6) -> dict:
    """A small random instance with forbidden costs, repeated and reversed edges, empty
    intervals, and a limit between the smallest and the largest possible peak."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 4, n).tolist()
    starts = rng.integers(0, 10, n)
    intervals = [[int(s), int(s + rng.integers(0, 6))] for s in starts]
    costs = [[int(c) for c in rng.integers(0, 100, k)] for k in sizes]
    usages = [[int(u) for u in rng.integers(1, 20, k)] for k in sizes]
    pairs = [[int(a), int(b)] for a, b in rng.integers(0, n, (n + 3, 2)) if a != b]
    pairs += [pairs[0][::-1], pairs[0]]
    edge_costs = []
    for u, v in pairs:
        c = rng.integers(0, 100, sizes[u] * sizes[v])
        c[rng.random(len(c)) < 0.1] = iopddl.FORBIDDEN
        edge_costs.append([int(x) for x in c])
    costs[0][0] = iopddl.FORBIDDEN
    small = _peak(intervals, [min(u) for u in usages])
    large = _peak(intervals, [max(u) for u in usages])
    limit = int(small + (large - small) * (0.3 + 0.7 * rng.random()))
    return {
        "problem": {
            "name": f"random{seed}",
            "nodes": {"intervals": intervals, "costs": costs, "usages": usages},
            "edges": {"nodes": pairs, "costs": edge_costs},
            "usage_limit": limit,
        }
    }


def _peak(intervals: list[list[int]], used: list[int]) -> int:
    return max(
        sum(u for (s, e), u in zip(intervals, used, strict=True) if s <= t < e) for t in range(20)
    )


def brute_force(instance: iopddl.Instance) -> int | None:
    """The cheapest feasible cost over every choice (None: no feasible plan)."""
    best = None
    for choice in itertools.product(*(range(len(c)) for c in instance.costs)):
        judged = iopddl.check(instance, choice)
        if judged.feasible and (best is None or judged.cost < best):
            best = judged.cost
    return best


def test_example_solved_to_its_optimum() -> None:
    instance = iopddl.parse(example_doc())
    solved = iopddl.solve(instance, LONG)
    assert solved.check.feasible
    assert solved.check.cost == brute_force(instance)
    assert solved.bound <= solved.check.cost


def test_the_shared_example_reads_as_the_inline_one() -> None:
    if not EXAMPLE.exists():
        pytest.skip("no shared IOPDDL folder")
    a, b = iopddl.load(EXAMPLE), iopddl.parse(example_doc())
    assert a.limit == b.limit and np.array_equal(a.intervals, b.intervals)
    assert all(np.array_equal(x, y) for x, y in zip(a.edge_costs, b.edge_costs, strict=True))


@pytest.mark.parametrize("seed", range(12))
def test_random_instances_against_brute_force(seed: int) -> None:
    instance = iopddl.parse(random_doc(seed))
    best = brute_force(instance)
    if best is None:
        with pytest.raises(InfeasibleError):
            iopddl.solve(instance, LONG)
        return
    solved = iopddl.solve(instance, LONG)
    assert solved.check.feasible
    assert solved.check.cost == best
    assert solved.bound <= best + 1e-6


@pytest.mark.parametrize("seed", range(12))
def test_check_agrees_with_the_problem_evaluation(seed: int) -> None:
    """Two independent evaluations: the checker (exact integers, the file's own rules)
    and ShardingProblem.evaluate (floats, +inf for forbidden, inclusive live steps)."""
    instance = iopddl.parse(random_doc(seed))
    problem = iopddl.to_problem(instance)
    rng = np.random.default_rng(seed)
    for _ in range(30):
        choice = [int(rng.integers(len(c))) for c in instance.costs]
        judged = iopddl.check(instance, choice)
        assert judged.peak == problem.peak_memory(choice)[0]
        if judged.peak > instance.limit:
            assert not judged.feasible
            with pytest.raises(InfeasibleError):
                problem.evaluate(choice)
        else:
            value = problem.evaluate(choice).objective
            assert judged.feasible == np.isfinite(value)
            if judged.feasible:
                assert value == judged.cost


def test_check_names_what_is_wrong() -> None:
    instance = iopddl.parse(example_doc())
    assert "strategy 2 of 2" in iopddl.check(instance, [0, 2, 0, 0, 0]).reason
    assert "3 strategies for 5 nodes" in iopddl.check(instance, [0, 0, 0]).reason
    tight = iopddl.parse({"problem": {**example_doc()["problem"], "usage_limit": 44}})
    assert "usage 55 > limit 44 at time 50" in iopddl.check(tight, [0, 0, 1, 0, 0]).reason
    doc = example_doc()
    doc["problem"]["edges"]["costs"][0][1] = 10**18
    assert "forbidden" in iopddl.check(iopddl.parse(doc), [0, 1, 0, 0, 0]).reason


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.pop("usage_limit"), 'no "usage_limit"'),
        (lambda p: p["nodes"]["usages"].pop(), "5 cost lists, 4 usage lists"),
        (lambda p: p["edges"]["costs"][1].pop(), "edge 1 (0, 2): 2 costs, expected 1 x 3 = 3"),
        (lambda p: p["edges"]["nodes"].__setitem__(0, [0, 9]), "node index outside 0..4"),
        (lambda p: p["nodes"]["costs"].__setitem__(1, [-5, 3]), "negative cost"),
        (lambda p: p["nodes"]["intervals"].__setitem__(0, "x"), "not a number"),
    ],
)
def test_bad_problems_are_named(change, message: str) -> None:
    doc = example_doc()
    change(doc["problem"])
    with pytest.raises(
        iopddl.IopddlFormatError, match=message.replace("(", r"\(").replace(")", r"\)")
    ):
        iopddl.parse(doc)


def test_load_reads_gzip_and_names_a_broken_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(example_doc(), f)
    assert iopddl.load(path).size == (5, 5)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(iopddl.IopddlFormatError, match="not readable as JSON"):
        iopddl.load(broken)


@pytest.mark.parametrize("seed", range(6))
def test_descent_and_windows_keep_the_limit_and_never_lose(seed: int) -> None:
    instance = iopddl.parse(random_doc(seed + 100, n=14))
    try:
        g = local.build(iopddl.to_problem(instance))
        x = local.fitting_start(g)
    except InfeasibleError:
        pytest.skip("no plan fits this draw")
    s = local.Search(g, x, deadline=float("inf"))
    before = local.true_cost(g, x)
    s.descend()
    assert local.true_cost(g, s.x) <= before
    assert np.allclose(s.level, local.levels(g, s.x))
    assert iopddl.check(instance, s.x.tolist()).peak <= instance.limit
    found = window.lns(
        g, s.x, deadline=float("inf"), size=4, most=40
    )  # windows smaller than the problem
    assert found.cost <= local.true_cost(g, s.x)
    judged = iopddl.check(instance, found.choice.tolist())
    assert judged.feasible or not np.isfinite(found.cost)
    assert local.lower_bound(g) <= brute_force(instance)


def optimum(instance: iopddl.Instance) -> tuple[int, ...]:
    """The cheapest feasible choice (brute force; the draw must have one)."""
    feasible = (
        c
        for c in itertools.product(*(range(len(c)) for c in instance.costs))
        if iopddl.check(instance, c).feasible
    )
    return min(feasible, key=lambda c: iopddl.check(instance, c).cost)


FORK_UNDER_JAX = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
"""Other tests load JAX into this process, and JAX warns at every fork; the helper never
calls JAX, and `rhino solve` does not load it."""


@FORK_UNDER_JAX
@pytest.mark.parametrize("seed", [1, 3])
def test_the_helper_runs_beside_the_search_and_ends(seed: int) -> None:
    """A large problem with two threads: the rounds with toulbar2 run in a helper process
    beside the search; the answer fits and costs no more than the start, the bound (the
    helper's Lagrangian bounds among it) is below the optimum, and the helper is gone.
    The large path is a search under a deadline: it need not reach the optimum (seed 3
    on a loaded machine: 1069 against 1040)."""
    import multiprocessing

    instance = iopddl.parse(random_doc(seed, n=8))
    start = local.legal_start(local.build(iopddl.to_problem(instance)))
    large = Tuning(small_nodes=0)
    solved = iopddl.solve(instance, SolveOptions(time_limit_s=4, threads=2, tuning=large))
    assert solved.check.feasible
    assert solved.check.cost <= iopddl.check(instance, start.tolist()).cost
    assert solved.bound <= iopddl.check(instance, optimum(instance)).cost
    assert multiprocessing.active_children() == []


@FORK_UNDER_JAX
def test_the_helpers_plan_is_taken_where_it_is_cheaper(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the searches of this process held at their start, the answer is the plan the
    helper sends (the optimum), checked and marked as the helper's."""
    from rhino.search.iopddl import groups, lagrange

    instance = iopddl.parse(random_doc(1, n=8))
    best = np.array(optimum(instance))
    start = local.legal_start(local.build(iopddl.to_problem(instance)))
    assert iopddl.check(instance, start.tolist()).cost > iopddl.check(instance, best).cost

    def helper(merged, y, deadline, seed, slot):
        slot.put(merged.contract(best), 7.0)

    def held(gr, y, deadline, **_):
        return lagrange.Best(y.copy(), gr.total(y))

    monkeypatch.setattr(iopddl, "_help", helper)
    monkeypatch.setattr(groups.GroupSearch, "run", lambda self: None)
    monkeypatch.setattr(lagrange, "rounds", held)
    monkeypatch.setattr(window, "lns", lambda g, x, *a, **k: window.LnsResult(x, 0.0, 0, 0, []))
    large = Tuning(small_nodes=0)
    solved = iopddl.solve(instance, SolveOptions(time_limit_s=3, threads=2, tuning=large))
    assert solved.choice == tuple(best.tolist()) and solved.helped
    assert solved.bound >= 7.0  # the helper's bound is taken too
    # one thread: no helper
    one = iopddl.solve(instance, SolveOptions(time_limit_s=3, threads=1, tuning=large))
    assert one.choice == tuple(start.tolist()) and not one.helped
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    # no fork: no helper either
    nofork = iopddl.solve(instance, SolveOptions(time_limit_s=3, threads=2, tuning=large))
    assert nofork.choice == tuple(start.tolist()) and not nofork.helped


def test_solve_command(tmp_path: Path) -> None:
    path = tmp_path / "example.json"
    path.write_text(json.dumps(example_doc()))
    runner = CliRunner()
    done = runner.invoke(cli, ["solve", str(path), "--time-limit", "60"])
    assert done.exit_code == 0, done.output
    last = done.output.strip().splitlines()[-1]
    choice = json.loads(last)
    assert iopddl.check(iopddl.parse(example_doc()), choice).feasible
    done = runner.invoke(cli, ["solve", str(path), "--json"])
    doc = json.loads(done.output)
    assert doc["choice"] == choice and doc["cost"] == brute_force(iopddl.parse(example_doc()))
    assert doc["bound"] <= doc["cost"] and doc["feasible"]


def test_solve_command_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"problem": {"nodes": {}}}))
    done = CliRunner().invoke(cli, ["solve", str(path)])
    assert done.exit_code == 2
    assert "error:" in done.output and "edges" in done.output


def test_solve_command_refuses_an_interval_that_ends_before_it_starts(tmp_path: Path) -> None:
    doc = example_doc()
    doc["problem"]["nodes"]["intervals"][2] = [70, 30]
    path = tmp_path / "backwards.json"
    path.write_text(json.dumps(doc))
    done = CliRunner().invoke(cli, ["solve", str(path)])
    assert done.exit_code == 2
    assert "node 2: interval [70, 30] ends before it starts" in done.output
