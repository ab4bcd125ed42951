"""The ILP against brute force on tiny random problems; evaluate() checks every answer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rhino.hlo.errors import InfeasibleError
from rhino.search.problem import ProblemEdge, ProblemNode, ShardingProblem, SolveOptions, Tuning
from rhino.search.spmd.lp import CoreRows, LpResult, groups
from rhino.search.spmd.solver import (
    _add_memory,
    _cpsat_model,
    min_peak_memory,
    solve_brute_force,
    solve_ilp,
)
from tests.solving import TO_THE_END


def random_problem(seed: int, budget: bool = False) -> ShardingProblem:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 7))
    nodes = []
    for v in range(n):
        k = int(rng.integers(1, 5))
        start = int(rng.integers(0, n))
        nodes.append(
            ProblemNode(
                f"n{v}",
                tuple(f"s{i}" for i in range(k)),
                rng.random(k).round(3),
                rng.integers(1, 100, size=k).astype(float),
                (start, start + int(rng.integers(0, 3))),
            )
        )
    edges = []
    for u in range(n):
        for v in range(u + 1, n):
            if rng.random() < 0.5:
                cost = rng.random((len(nodes[u].labels), len(nodes[v].labels))).round(3)
                cost[rng.random(cost.shape) < 0.3] = 0.0
                edges.append(ProblemEdge(u, v, cost))
    problem = ShardingProblem(tuple(nodes), tuple(edges))
    if budget:
        low = min_peak_memory(problem)[0]
        problem = ShardingProblem(
            tuple(nodes), tuple(edges), budget=low * float(rng.uniform(1.0, 1.6))
        )
    return problem


@pytest.mark.parametrize("seed", range(40))
def test_ilp_equals_brute_force(seed: int) -> None:
    problem = random_problem(seed, budget=seed % 2 == 1)
    ilp = solve_ilp(problem, TO_THE_END)
    brute = solve_brute_force(problem)
    assert ilp.objective == pytest.approx(brute.objective, rel=1e-9, abs=1e-12)
    assert problem.evaluate(ilp.choice).objective == ilp.objective
    if problem.budget is not None:
        assert ilp.peak_memory <= problem.budget * (1 + 1e-9)


def test_same_answer_twice() -> None:
    problem = random_problem(7)
    assert solve_ilp(problem).choice == solve_ilp(problem).choice


def test_infeasible_budget_names_the_smallest_that_works() -> None:
    problem = random_problem(3)
    low, _, name = min_peak_memory(problem)
    tight = ShardingProblem(problem.nodes, problem.edges, budget=low * 0.9)
    with pytest.raises(InfeasibleError) as info:
        solve_ilp(tight)
    message = str(info.value)
    assert "smallest possible peak" in message and f"%{name}" in message
    solve_ilp(ShardingProblem(problem.nodes, problem.edges, budget=low))  # exactly enough works


def test_evaluate_rejects_an_answer_over_budget() -> None:
    node = ProblemNode("big", ("R", "S"), np.array([0.0, 1.0]), np.array([100.0, 25.0]), (0, 1))
    problem = ShardingProblem((node,), (), budget=50.0)
    assert solve_ilp(problem).choice == (1,)
    with pytest.raises(InfeasibleError, match=r"peak .* > budget .* \(largest: %big"):
        problem.evaluate((0,))


def test_bad_matrix_shape_is_rejected() -> None:
    a = ProblemNode("a", ("x", "y"), np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match=r"edge \(a, a\): cost matrix is 3x2, expected 2x2"):
        ShardingProblem((a,), (ProblemEdge(0, 0, np.zeros((3, 2))),))


@pytest.mark.parametrize("budget", [False, True])
def test_a_search_out_of_time_still_returns_a_plan(
    budget: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When neither the LP nor CP-SAT gets anywhere in time, the plan is the fallback:
    each node's cheapest, improved node by node (no budget), or the smallest layouts
    (a budget, which they fit); FEASIBLE with its true cost, never an error."""
    from ortools.sat.python import cp_model

    import rhino.search.spmd.solver as solver

    no_point = LpResult(choice=None, bound=0.0, rounded=None, variables=0, constraints=0)
    monkeypatch.setattr(solver, "solve_lp", lambda *_args: no_point)
    monkeypatch.setattr(cp_model.CpSolver, "solve", lambda *_args, **_kw: cp_model.UNKNOWN)
    problem = _dense(5, 3, budget)
    found = solve_ilp(problem, SolveOptions(time_limit_s=1))
    assert found.status.value == "feasible"
    assert problem.evaluate(found.choice).objective == found.objective
    if budget:
        assert found.peak_memory <= problem.budget
    else:
        assert found.objective >= solve_brute_force(problem).objective


def _dense(n: int, k: int, budget: bool = False) -> ShardingProblem:
    """Every pair of n nodes joined: nothing for the exact reductions to remove. With a
    budget, the nodes' memory varies, all are live at once, and the budget is a little
    above the smallest peak (a row that binds)."""
    from rhino.search.spmd.reduce import reduce_problem

    rng = np.random.default_rng(5)
    nodes = tuple(
        ProblemNode(
            f"n{v}",
            tuple(f"s{i}" for i in range(k)),
            rng.random(k),
            rng.integers(1, 100, size=k).astype(float) if budget else np.ones(k),
        )
        for v in range(n)
    )
    edges = tuple(ProblemEdge(u, v, rng.random((k, k))) for u in range(n) for v in range(u + 1, n))
    problem = ShardingProblem(nodes, edges)
    if budget:
        problem = ShardingProblem(nodes, edges, budget=min_peak_memory(problem)[0] * 1.2)
    assert reduce_problem(problem).alive
    return problem


def test_with_a_budget_the_reductions_apply_and_only_rows_that_can_bind_are_kept() -> None:
    """A chain of 30 nodes, each live at its own step; node 7's largest layout alone
    breaks the budget. Everything else folds away exactly; one row stays."""
    rng = np.random.default_rng(3)
    k = 3
    nodes = []
    for v in range(30):
        memory = np.array([10.0, 20.0, 30.0]) * (10 if v == 7 else 1)
        nodes.append(
            ProblemNode(f"n{v}", tuple(f"s{i}" for i in range(k)), rng.random(k), memory, (v, v))
        )
    edges = tuple(ProblemEdge(v, v + 1, rng.random((k, k))) for v in range(29))
    problem = ShardingProblem(tuple(nodes), edges, budget=250.0)
    found = solve_ilp(problem)
    assert found.stats.sizes.core_nodes is not None and found.stats.sizes.core_nodes <= 1
    assert (found.stats.sizes.memory_rows or 0) <= 1
    assert found.peak_memory <= 250.0
    assert found.objective == pytest.approx(solve_brute_force_chain(problem), rel=1e-9)


def solve_brute_force_chain(problem: ShardingProblem) -> float:
    """Dynamic programming over a chain, with each node's allowed strategies filtered by
    the budget (every node is live alone)."""
    best = None
    for v, n in enumerate(problem.nodes):
        ok = n.memory <= problem.budget
        cost = np.where(ok, n.cost, np.inf)
        if best is None:
            best = cost
        else:
            edge = problem.edges[v - 1].cost
            best = (best[:, None] + edge).min(axis=0) + cost
    assert best is not None
    return float(best.min())


@pytest.mark.parametrize(
    "options",
    [
        SolveOptions(tuning=Tuning(cpsat_max_variables=0)),  # a model too large for CP-SAT
        SolveOptions(time_limit_s=0.0),  # no time left after the LP
    ],
    ids=["too large", "no time left"],
)
def test_where_cpsat_is_skipped_the_start_is_the_answer(
    options: SolveOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above `Tuning.cpsat_max_variables`, or where the LP leaves no time, when the LP
    gives no integral optimum, the answer is the better of the LP's rounding and the
    given start, improved node by node; the CP-SAT model is not built (on a corpus step,
    building it took three times the whole `--time-limit 2`)."""
    import rhino.search.spmd.solver as solver

    def no_model(*_args, **_kw):
        raise AssertionError("the CP-SAT model was built")

    no_point = LpResult(choice=None, bound=0.0, rounded=None, variables=10, constraints=10)
    monkeypatch.setattr(solver, "solve_lp", lambda *_args: no_point)
    monkeypatch.setattr(solver, "_cpsat_model", no_model)
    problem = _dense(5, 3)
    best = solve_brute_force(problem)
    found = solve_ilp(problem, options, start=best.choice)
    assert found.status.value == "feasible"
    assert found.objective == pytest.approx(best.objective)
    assert found.stats.cpsat_skipped
    # a model of this size, with time left: CP-SAT is built as before
    with pytest.raises(AssertionError, match="CP-SAT model was built"):
        solve_ilp(problem, SolveOptions(time_limit_s=60.0), start=best.choice)


@pytest.mark.parametrize("bad", [-1, 99])
def test_evaluate_refuses_a_strategy_the_node_does_not_have(bad: int) -> None:
    problem = random_problem(0)
    choice = [0] * len(problem.nodes)
    choice[-1] = bad
    with pytest.raises(ValueError, match="strategy"):
        problem.evaluate(choice)


@pytest.mark.parametrize("seed", range(4))
def test_the_basis_an_lp_ends_with_is_highs_own_and_travels_to_another_process(
    seed: int,
) -> None:
    """The basis read from HiGHS' basic variables (`_read_basis`) has HiGHS' own status
    for every column that is not fixed (basic, at its lower or upper bound), the same
    basic columns among the fixed ones (at 0: either bound is the same) and rows; a
    basis pickled (as for a worker process) and read back gives the next LP the same
    starting statuses."""
    import pickle

    import highspy

    import rhino.search.spmd.lp as lp

    rng = np.random.default_rng(seed)
    m, n = 6, 14
    dense = rng.integers(-2, 3, size=(m, n)).astype(float)
    x0 = rng.integers(0, 2, size=n).astype(float)
    bounds = dense @ x0
    cost = rng.normal(size=n)
    upper = np.where(rng.random(n) < 0.2, 0.0, 1.0)
    upper[x0 == 1] = 1.0  # x0 stays feasible
    matrix = lp.columns(*np.nonzero(dense), dense[np.nonzero(dense)], (m, n))
    warm = lp.WarmStart()
    columns, rows = np.arange(n, dtype=np.int64) * 7, np.arange(m, dtype=np.int64) * 5
    run = lp._run_highs(cost, matrix, bounds, bounds, upper, 10, False, warm=(warm, columns, rows))
    assert run is not None and warm.found is not None
    highs = highspy.Highs()
    highs.setOptionValue("output_flag", False)
    highs.setOptionValue("presolve", "off")
    highs.passModel(
        n, m, len(matrix.data), int(highspy.MatrixFormat.kColwise),
        int(highspy.ObjSense.kMinimize), 0.0, cost, np.zeros(n), upper, bounds, bounds,
        matrix.indptr.astype(np.int32), matrix.indices.astype(np.int32), matrix.data,
        np.zeros(n, dtype=np.int32),
    )  # fmt: skip
    highs.run()
    own = highs.getBasis()
    basic = highspy.HighsBasisStatus.kBasic.value
    own_columns = np.array([s.value for s in own.col_status])
    free = upper > 0
    assert (warm.found.column_status[free] == own_columns[free]).all()
    assert ((warm.found.column_status == basic) == (own_columns == basic)).all()
    own_rows = [s.value == basic for s in own.row_status]
    assert (warm.found.row_status == basic).tolist() == own_rows
    assert (warm.found.column_status == basic).any()
    sent = pickle.loads(pickle.dumps(warm.found))
    fewer = columns[::2]  # an LP with some of these columns and rows, and new ones
    more = np.concatenate([rows, [999]])
    here, there = warm.found.statuses(fewer, more), sent.statuses(fewer, more)
    assert here.col_status == there.col_status and here.row_status == there.row_status


@pytest.mark.parametrize("seed", range(8))
def test_the_lp_matrix_by_columns_is_scipys_to_the_bit(seed: int) -> None:
    """`columns` lays a matrix out as scipy's coo_array(...).tocsc() does (the same
    arrays, so HiGHS gets the same LP): rows ascending in each column, empty rows and
    columns kept; entries given twice are summed (scipy's order of adding them is its
    sort's, so there the sums agree to rounding)."""
    from scipy.sparse import coo_array

    import rhino.search.spmd.lp as lp

    rng = np.random.default_rng(seed)
    shape = (int(rng.integers(1, 30)), int(rng.integers(1, 30)))
    count = int(rng.integers(0, 200))
    at = rng.choice(shape[0] * shape[1], size=min(count, shape[0] * shape[1]), replace=False)
    rows, cols = np.divmod(at, shape[1])
    values = rng.normal(size=len(at))
    mine = lp.columns(rows, cols, values, shape)
    theirs = coo_array((values, (rows, cols)), shape=shape).tocsc()
    assert mine.shape == theirs.shape
    for name in ("indptr", "indices", "data"):
        assert np.array_equal(getattr(mine, name), getattr(theirs, name)), name
    twice = np.concatenate([np.arange(len(at)), rng.integers(0, max(len(at), 1), size=len(at))])
    mine = lp.columns(rows[twice], cols[twice], values[twice], shape)
    theirs = coo_array((values[twice], (rows[twice], cols[twice])), shape=shape).tocsc()
    assert np.array_equal(mine.indptr, theirs.indptr)
    assert np.array_equal(mine.indices, theirs.indices)
    assert np.allclose(mine.data, theirs.data, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_lagrangian_bound_is_below_the_lp_optimum_for_any_prices(seed: int) -> None:
    """`_lagrangian_bound` is a lower bound for any row prices (equality and one-sided
    rows, boxes of 0 or 1), and the LP's own optimal prices make it tight."""
    import rhino.search.spmd.lp as lp

    rng = np.random.default_rng(seed)
    m, n = 6, 12
    dense = rng.integers(-2, 3, size=(m, n)).astype(float)
    matrix = lp.columns(*np.nonzero(dense), dense[np.nonzero(dense)], (m, n))
    x0 = rng.integers(0, 2, size=n).astype(float)  # a feasible point: rows around it
    lower, upper = dense @ x0, dense @ x0
    lower[:2] = -np.inf  # one-sided rows: <= and >=
    upper[2:4] = np.inf
    upper[:2] += rng.random(2)
    lower[2:4] -= rng.random(2)
    col_upper = np.where(rng.random(n) < 0.2, 0.0, 1.0)
    col_upper[x0 > 0] = 1.0
    cost = rng.normal(size=n)
    run = lp._run_highs(cost, matrix, lower, upper, col_upper, time_limit=10, presolve=False)
    assert run is not None and run[1] is not None and run[2] is not None
    _, prices, optimum = run
    assert lp._lagrangian_bound(cost, matrix, lower, upper, col_upper, prices) == pytest.approx(
        optimum, abs=1e-7
    )
    for _ in range(20):
        any_prices = rng.normal(scale=3.0, size=m)
        bound = lp._lagrangian_bound(cost, matrix, lower, upper, col_upper, any_prices)
        assert bound <= optimum + 1e-9


@pytest.mark.parametrize("budget", [False, True])
@pytest.mark.parametrize(("n", "k"), [(4, 3), (5, 3), (6, 2), (5, 4)])
def test_the_first_order_lp_bounds_the_optimum_and_proves_a_start(
    n: int, k: int, budget: bool
) -> None:
    """Large LPs run on PDLP (here every LP): its prices give a bound that is never above
    the optimum, and a start at the optimum is reported optimal when the bound meets it."""
    problem = _dense(n, k, budget)
    best = solve_brute_force(problem)
    tuning = Tuning(cpsat_max_variables=0, lp_first_order_variables=0)
    found = solve_ilp(problem, SolveOptions(time_limit_s=20, tuning=tuning), start=best.choice)
    assert found.stats.cpsat_skipped
    assert found.objective == pytest.approx(best.objective)
    assert found.bound <= best.objective + 1e-9
    if found.status.value == "optimal":
        assert found.objective - found.bound <= 1e-7 * abs(found.objective) + 1e-12


@pytest.mark.parametrize("seed", range(6))
def test_the_lps_running_usage_is_each_memory_rows_usage(seed: int) -> None:
    """The LP holds the memory rows as a running sum (`_running_usage`): whatever the
    (fractional) choice, its L column for row r comes out as row r's usage, for members
    in consecutive rows (as `memory_rows` makes them) and for any others."""
    from scipy.sparse import coo_array

    import rhino.search.spmd.lp as lp

    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 4, size=8)
    first = np.concatenate(([0], np.cumsum(sizes)))
    n_vars = int(first[-1])
    terms = {v: rng.integers(0, 1000, size=int(sizes[v])) for v in range(8) if v != 3}
    rows = [
        (
            np.array(
                sorted(rng.choice(8, size=int(rng.integers(0, 9)), replace=False)), dtype=np.int64
            ),
            int(rng.integers(1000, 3000)),
        )
        for _ in range(5)
    ]
    memory = lp.CoreRows(terms, rows)
    at, cols, vals, limits = lp._running_usage(memory, first, 0, n_vars)
    matrix = coo_array(
        (np.concatenate(vals), (np.concatenate(at), np.concatenate(cols))),
        shape=(len(rows), n_vars + len(rows)),
    ).toarray()
    s = rng.random(n_vars)
    usage = np.linalg.solve(matrix[:, n_vars:], -matrix[:, :n_vars] @ s)
    unit = lp._memory_unit(memory)
    expected = [
        sum(terms[v] @ s[first[v] : first[v + 1]] for v in m if v in terms) / unit for m, _ in rows
    ]
    assert usage == pytest.approx(expected)
    assert limits == pytest.approx([rhs / unit for _, rhs in rows])


@pytest.mark.parametrize("seed", range(6))
def test_a_warm_started_lp_finds_the_cold_optimum(seed: int) -> None:
    """The LP started from the basis of the same graph at other costs, one strategy
    fewer (the reductions of the combined-collectives search leave nearly, not exactly,
    the same core each time), finds what it finds cold, and hands its own basis on."""
    from rhino.search.spmd.lp import WarmStart

    problem = _dense(7, 5, budget=seed % 2 == 1)
    first = WarmStart()
    solve_ilp(problem, TO_THE_END, warm=first)
    assert first.found is not None
    rng = np.random.default_rng(seed)
    nodes = tuple(
        dataclasses.replace(n, cost=n.cost + rng.random(len(n.cost)) * (rng.random() < 0.5))
        for n in problem.nodes
    )
    edges = tuple(
        dataclasses.replace(e, cost=e.cost + rng.random(e.cost.shape) * (rng.random() < 0.3))
        for e in problem.edges
    )
    gone = np.where(np.arange(5) == seed % 5, np.inf, nodes[seed % 7].cost)
    nodes = tuple(
        dataclasses.replace(n, cost=gone) if v == seed % 7 else n for v, n in enumerate(nodes)
    )
    other = ShardingProblem(nodes, edges, problem.budget)
    cold = solve_ilp(other, TO_THE_END)
    warm = WarmStart(start=first.found)
    warmed = solve_ilp(other, TO_THE_END, warm=warm)
    assert warmed.objective == pytest.approx(cold.objective, rel=1e-9)
    assert warm.found is not None


def test_stdout_comes_back_after_overlapping_quiet_spans(capfd: pytest.CaptureFixture[str]) -> None:
    """HiGHS runs on two threads at once (the combined-collectives search): stdout is
    silenced while either is inside and comes back when both are out, whatever the
    order (a plan printed with --json once came out empty)."""
    import os
    import threading

    from rhino.search.spmd.lp import _quiet_stdout

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with _quiet_stdout():
            first_in.set()
            second_in.wait()
            os.write(1, b"lost\n")
        first_out.set()

    def second() -> None:
        first_in.wait()
        with _quiet_stdout():
            second_in.set()
            first_out.wait()
            os.write(1, b"lost too\n")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.write(1, b"kept\n")
    assert capfd.readouterr().out == "kept\n"


def _improve_weighing_every_node(
    problem: ShardingProblem, node_cost: list[np.ndarray], choice: list[int], sweeps: int = 20
) -> list[int]:
    """The local search as it was, every node weighed in every sweep (the reference)."""
    from rhino.search.spmd.solver import MIN_GAIN_S

    choice = list(choice)
    for _ in range(sweeps):
        changed = False
        for v in range(len(problem.nodes)):
            total = node_cost[v].copy()
            for e in problem.edges:
                if e.u == v:
                    total += e.cost[:, choice[e.v]]
                elif e.v == v:
                    total += e.cost[choice[e.u], :]
            best = int(np.argmin(total))
            if total[best] < total[choice[v]] - MIN_GAIN_S:
                choice[v], changed = best, True
        if not changed:
            break
    return choice


@pytest.mark.parametrize("seed", range(40))
def test_the_local_search_weighs_only_nodes_whose_neighbours_moved_and_ends_the_same(
    seed: int,
) -> None:
    from rhino.search.spmd.solver import improve

    rng = np.random.default_rng(seed)
    n = 60
    nodes = tuple(
        ProblemNode(f"n{v}", ("a", "b", "c"), rng.random(3).round(2), np.ones(3)) for v in range(n)
    )
    edges = tuple(
        ProblemEdge(u, int(v), rng.random((3, 3)).round(2))
        for u in range(n)
        for v in rng.choice(np.arange(u + 1, n), size=min(3, n - u - 1), replace=False)
    )
    problem = ShardingProblem(nodes, edges)
    cost = [node.cost for node in nodes]
    start = [int(k) for k in rng.integers(0, 3, size=n)]
    for sweeps in (1, 2, 20):
        assert improve(problem, cost, start, sweeps) == _improve_weighing_every_node(
            problem, cost, start, sweeps
        )


@pytest.mark.parametrize("seed", range(6))
def test_rows_are_grouped_by_their_bits(seed: int) -> None:
    """`_grouped` puts rows alike bit for bit in one group, the groups in the order of
    their first rows, whether the rows all differ (the quick test of `_distinct`) or not:
    repeated rows, infinities, -0.0 beside 0.0, transposed views."""
    import rhino.search.spmd.lp as lp

    rng = np.random.default_rng(seed)
    for _ in range(200):
        n, k = int(rng.integers(1, 12)), int(rng.integers(1, 9))
        matrix = rng.integers(0, 3, size=(n, k)).astype(float)
        if rng.random() < 0.3:
            matrix[rng.integers(0, n), rng.integers(0, k)] = np.inf
        if rng.random() < 0.3:
            matrix[matrix == 0.0] = -0.0 if rng.random() < 0.5 else 0.0
            matrix[rng.integers(0, n), rng.integers(0, k)] = -0.0
        if rng.random() < 0.5:
            matrix = matrix.T
        first_of: dict[bytes, int] = {}
        expected = [first_of.setdefault(row.tobytes(), len(first_of)) for row in matrix]
        firsts, row_group = lp._grouped(matrix)
        assert row_group.tolist() == expected
        assert firsts.tolist() == [expected.index(g) for g in range(len(first_of))]


@pytest.mark.parametrize("seed", range(6))
def test_the_lp_holds_every_plan_at_its_cost(seed: int) -> None:
    """The LP `solve_lp` lays out (strategies node by node, then each edge's pairs of
    strategy groups, row-major): every plan, as that point, meets every row, and its cost
    there is the plan's."""
    import rhino.search.spmd.lp as lp
    from rhino.search.spmd.solver import fold_single_edges

    problem = random_problem(seed + 100)
    node_cost = [n.cost.astype(float) for n in problem.nodes]
    pair_edges = fold_single_edges(problem, node_cost)
    laid: list[tuple[np.ndarray, lp.Columns, np.ndarray]] = []

    def keep(cost: np.ndarray, matrix: lp.Columns, lower: np.ndarray, *_: object, **__: object):
        laid.append((cost, matrix, lower))
        return None

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lp, "_run_highs", keep)
        lp.solve_lp(problem, node_cost, pair_edges, SolveOptions())
    ((cost, matrix, rhs),) = laid
    dense = np.zeros(matrix.shape)
    for j in range(matrix.shape[1]):
        span = slice(matrix.indptr[j], matrix.indptr[j + 1])
        dense[matrix.indices[span], j] = matrix.data[span]
    sizes = [len(n.labels) for n in problem.nodes]
    first = np.concatenate(([0], np.cumsum(sizes)))
    rng = np.random.default_rng(seed)
    for _ in range(20):
        choice = [int(rng.integers(0, s)) for s in sizes]
        x = np.zeros(matrix.shape[1])
        x[first[:-1] + choice] = 1.0
        at = int(first[-1])
        for e in pair_edges:
            _, group_u = lp._grouped(e.cost)
            firsts_v, group_v = lp._grouped(e.cost.T)
            x[at + group_u[choice[e.u]] * len(firsts_v) + group_v[choice[e.v]]] = 1.0
            at += (group_u.max() + 1) * len(firsts_v)
        assert at == matrix.shape[1]
        assert np.array_equal(dense @ x, rhs)
        expected = sum(c[k] for c, k in zip(node_cost, choice, strict=True)) + sum(
            e.cost[choice[e.u], choice[e.v]] for e in pair_edges
        )
        assert cost @ x == pytest.approx(expected * lp.LP_UNIT, rel=1e-12)


def _api_model(
    problem: ShardingProblem,
    node_cost: list[np.ndarray],
    pair_edges: list[ProblemEdge],
    memory: CoreRows | None,
) -> tuple[str, list[list[int]]]:
    """The model `_cpsat_model` writes, made by CP-SAT's Python API call by call (how it
    was made before): its proto's text, and the s variables' numbers."""
    from ortools.sat.python import cp_model

    scale = _cpsat_model(problem, node_cost, pair_edges, None).scale
    model = cp_model.CpModel()
    s = [
        [model.new_bool_var(f"s[{v}][{k}]") for k in range(len(n.labels))]
        for v, n in enumerate(problem.nodes)
    ]
    objective: list[object] = []

    def price(cost: float, var: cp_model.IntVar) -> None:
        if not np.isfinite(cost):
            model.add(var == 0)
        elif cost:
            objective.append(int(round(cost * scale)) * var)

    for v in range(len(problem.nodes)):
        model.add_exactly_one(s[v])
        for k, c in enumerate(node_cost[v]):
            price(c, s[v][k])
    for e in pair_edges:
        rows, cols = groups(e.cost)[0], groups(e.cost.T)[0]
        if len(rows) == 1 or len(cols) == 1:
            for var, c in (
                zip(s[e.v], e.cost[0, :], strict=True)
                if len(rows) == 1
                else zip(s[e.u], e.cost[:, 0], strict=True)
            ):
                price(c, var)
            continue
        pair = {
            (g, h): model.new_bool_var(f"e[{e.u},{e.v}][{g},{h}]")
            for g in range(len(rows))
            for h in range(len(cols))
        }
        for g, members in enumerate(rows):
            model.add(sum(pair[g, h] for h in range(len(cols))) == sum(s[e.u][k] for k in members))
        for h, members in enumerate(cols):
            model.add(sum(pair[g, h] for g in range(len(rows))) == sum(s[e.v][l] for l in members))
        for (g, h), var in pair.items():
            price(e.cost[rows[g][0], cols[h][0]], var)
    if memory is not None:
        _add_memory(model, memory, s)
    model.minimize(sum(objective))  # type: ignore[arg-type]
    return str(model.proto), [[var.index for var in row] for row in s]


@pytest.mark.parametrize("seed", range(12))
def test_the_cpsat_model_is_the_one_its_python_api_makes(seed: int) -> None:
    """Field for field, on problems with forbidden strategies and pairs, edges folded into
    one side, rows and columns grouped, costs that round to nothing, an objective with no
    term left, and memory rows."""
    rng = np.random.default_rng(seed)
    problem = random_problem(seed)
    priced = seed != 0  # seed 0: nothing costs anything but what rounds to nothing
    node_cost = [n.cost.astype(float) * priced for n in problem.nodes]
    node_cost[0][0] = np.inf
    node_cost[-1][-1] = 1e-16  # nonzero, but 0 once scaled to integers
    pair_edges = []
    for e in problem.edges:
        cost = e.cost * priced
        if cost.shape[0] > 1 and rng.random() < 0.3:
            cost[1] = cost[0]  # two rows alike: one group
        if rng.random() < 0.3:
            cost[rng.random(cost.shape) < 0.2] = np.inf
        if rng.random() < 0.2:
            cost = np.repeat(cost[:1], cost.shape[0], axis=0)  # v's side only: folded
        pair_edges.append(ProblemEdge(e.u, e.v, cost))
    memory = None
    if seed % 2:
        terms = {v: n.memory.astype(np.int64) for v, n in enumerate(problem.nodes) if v % 2}
        rows = [(np.arange(len(problem.nodes)), 150), (np.array([0, 1]), 60)]
        memory = CoreRows(terms, rows)
    built = _cpsat_model(problem, node_cost, pair_edges, memory)
    text, s = _api_model(problem, node_cost, pair_edges, memory)
    assert str(built.model.proto) == text
    assert [[var.index for var in row] for row in built.s] == s
