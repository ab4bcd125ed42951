"""The LP relaxation of the ILP of `rhino.search.spmd.solver` on HiGHS, its bound and
its rounding.

Variables and rows are the ILP's (see that module's doc), the s and e variables in
[0, 1] instead of {0, 1}; costs in microseconds (`LP_UNIT`). The row/column form is
tight: on the problems measured so far its optimum was integral, and then it is an
optimal plan, proven by the LP. An LP of at least `Tuning.lp_first_order_variables`
variables runs on PDLP instead of the simplex; its point is not exact, so its value is
never taken as the optimum: its row prices give a Lagrangian bound whether or not it
converged (`_lagrangian_bound`), and the plan comes from rounding its point. The LP
holds (memory) as a running sum over the rows, a node where it enters and where it
leaves (`_running_usage`), not once per row it is live at.

Warm starts. The combined-collectives search (`rhino.search.spmd.combine`) solves the
same graph again at other costs, and its reductions leave nearly the same core each
time. `WarmStart` hands the simplex basis of one LP to the next, each column and row
named by what it stands for in the original problem (`LpNames`: a node's strategy, a
pair of an edge's strategy groups), so the next LP starts from the basis of those it
shares (HiGHS repairs the rest: an "alien" basis). On the README demo such an LP took a
fifth to a half of a cold start's simplex iterations (scripts/bench_revisions.py).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import highspy
import numpy as np

from rhino.search.heap import return_freed_memory
from rhino.search.problem import ProblemEdge, ShardingProblem, SolveOptions, Tuning
from rhino.search.spmd.reduce import consecutive

TIE_BREAK_S_PER_BYTE = 1e-17
"""Seconds each byte a plan holds weighs besides its cost, so ties go to less memory."""
MIN_CPSAT_S = 0.2
"""CP-SAT and the LP get at least this long, even past the deadline, so there is a plan."""
LP_SHARE = 0.9
"""Of the time left, the LP may take this much: on large cores its optimum is the
integral answer after minutes (the 24-layer GPT on 2x4: 1.9M variables), and CP-SAT
alone would not come near it in the rest."""
LP_SOLVER: Literal["choose", "simplex", "ipm"] = "choose"
"""HiGHS' LP method ("choose" lets it choose) below `Tuning.lp_first_order_variables`."""
PDLP_TOLERANCE = 1e-9
"""PDLP's optimality tolerance: at HiGHS' default (1e-7) its prices bounded the 24-layer
GPT's optimum a hundred times more loosely."""
INTEGRAL_TOLERANCE = 1e-6
"""An LP value this close to 0 or 1 counts as integral."""
LP_PRESOLVE_VARIABLES = Tuning().lp_first_order_variables
"""HiGHS presolves an LP with at least this many variables (by default, those that run
on PDLP); the simplex solves the others faster without: O2's refinement windows and the
whole-graph LPs of most example models solve faster without it, the largest ones
faster with it (scripts/bench_search.py measures it)."""
LP_UNIT = 1e6
"""The LP counts microseconds: HiGHS' tolerances (~1e-7) would swallow costs in seconds."""


@dataclass(frozen=True)
class CoreRows:
    """Memory rows over a core's nodes: for each row, sum over its members v of
    terms[v][k_v] <= rhs (bytes above what the members hold whatever they choose)."""

    terms: dict[int, np.ndarray]
    rows: list[tuple[np.ndarray, int]]

    def fits(self, choice: tuple[int, ...] | list[int]) -> bool:
        if not self.rows:
            return True
        held = np.zeros(len(choice), dtype=np.int64)
        for v, terms in self.terms.items():
            held[v] = terms[choice[v]]
        members = [m for m, _ in self.rows]
        row = np.repeat(np.arange(len(members)), [len(m) for m in members])
        usage = np.bincount(row, weights=held[np.concatenate(members)], minlength=len(members))
        return bool(np.all(usage <= np.array([rhs for _, rhs in self.rows])))


@dataclass(frozen=True)
class LpNames:
    """What an LP's nodes stand for in the problem they were reduced from, so that LPs
    of one graph at other costs can share a basis (`WarmStart`)."""

    nodes: np.ndarray
    """Each LP node's index in the original problem."""
    strategies: list[np.ndarray]
    """Each LP node's strategies' indices in the original problem."""
    count: int
    """Nodes in the original problem."""
    width: int
    """Strategies of an original node, at most."""

    def keys(self, fields: list[np.ndarray]) -> np.ndarray | None:
        """One integer per (kind, a, b, c, d) row of `fields` (kinds below 8, a and b
        below `count`, c and d below `width`), or None where they do not fit in 63 bits."""
        dims = (8, self.count + 1, self.count + 1, self.width + 1, self.width + 1)
        if math.prod(dims) >= 2**63:
            return None
        return np.ravel_multi_index(tuple(fields), dims).astype(np.int64)


@dataclass(frozen=True)
class LpBasis:
    """A simplex basis by names: the keys (`LpNames.keys`) of an LP's columns and rows,
    and the status HiGHS ended each with, as HiGHS' values (`_read_basis`)."""

    columns: np.ndarray
    rows: np.ndarray
    column_status: np.ndarray
    row_status: np.ndarray

    def __reduce__(self) -> tuple[Any, ...]:  # without what `_sorted` cached
        return (LpBasis, (self.columns, self.rows, self.column_status, self.row_status))

    def statuses(self, columns: np.ndarray, rows: np.ndarray) -> highspy.HighsBasis:
        """An alien basis for the LP whose columns and rows have these keys: the status
        each had here; a column it did not have at its lower bound, a row basic."""
        known_columns, known_rows = self._sorted
        start = highspy.HighsBasis()
        start.col_status = _carried(*known_columns, columns, _LOWER)
        start.row_status = _carried(*known_rows, rows, _BASIC)
        start.alien = True
        start.valid = True
        return start

    @functools.cached_property
    def _sorted(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """(keys, status values) of the columns and of the rows, by key (read once: the
        plans of a round all start from their parent's basis)."""

        def by_key(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            order = np.argsort(keys)
            return keys[order], values[order]

        return by_key(self.columns, self.column_status), by_key(self.rows, self.row_status)


def _carried(known: np.ndarray, values: np.ndarray, keys: np.ndarray, default: int) -> list[Any]:
    """The status of each of `keys` where the sorted `known` has it (`values`), else
    `default` (a HiGHS basis status value)."""
    if not len(known):
        return [_STATUS[default]] * len(keys)
    at = np.minimum(np.searchsorted(known, keys), len(known) - 1)
    found = known[at] == keys
    return [_STATUS[v] for v in np.where(found, values[at], default).tolist()]


@dataclass
class WarmStart:
    """What a solve of a graph hands the next solve of it at other costs: a basis to
    start an LP from and, after it, the basis it ended with; and the plan it found, which
    O2's level 3 refines instead of making its first plans again
    (`rhino.search.spmd.merge.solve_merged`)."""

    start: LpBasis | None = None
    found: LpBasis | None = None
    plan: tuple[int, ...] | None = None


@dataclass(frozen=True)
class LpResult:
    """The LP relaxation's answer (`solve_lp`)."""

    choice: tuple[int, ...] | None
    """The plan, where the LP optimum is integral (a proven optimum); else None."""
    bound: float
    """A lower bound on the optimum (0.0 where the LP gave none)."""
    rounded: tuple[int, ...] | None
    """Each node's largest LP value (a plan to start from); None where the LP had no point."""
    variables: int
    constraints: int


def solve_lp(
    problem: ShardingProblem,
    node_cost: list[np.ndarray],
    pair_edges: list[ProblemEdge],
    options: SolveOptions,
    memory: CoreRows | None = None,
    names: LpNames | None = None,
    warm: WarmStart | None = None,
) -> LpResult:
    """The LP relaxation of the ILP (same variables in [0, 1]) on HiGHS, the constraint
    matrix built as sparse arrays: `node_cost` the nodes' costs with the tie break,
    `pair_edges` the edges left after `fold_single_edges`, `memory` the rows to hold.
    The LP may take LP_SHARE of the time left (at least MIN_CPSAT_S). With `names` and
    `warm`, the simplex starts from `warm.start` and leaves its basis in `warm.found`."""
    sizes = np.array([len(n.labels) for n in problem.nodes], dtype=np.int64)
    first = np.concatenate(([0], np.cumsum(sizes)))  # node v's s variables: first[v]..
    n_vars = int(first[-1])
    objective = [np.concatenate(node_cost) * LP_UNIT]
    rows: list[np.ndarray] = [np.repeat(np.arange(len(sizes)), sizes)]  # (one)
    cols: list[np.ndarray] = [np.arange(n_vars)]
    vals: list[np.ndarray] = [np.ones(n_vars)]
    n_rows = len(sizes)
    naming = _Naming(names, sizes) if names is not None and warm is not None else None
    grouped = []
    for e in pair_edges:
        rep_u, of_u = _grouped(e.cost)
        rep_v, of_v = _grouped(e.cost.T)
        if naming is not None:
            naming.edge(e.u, e.v, rep_u, rep_v)
        whole = len(rep_u) == e.cost.shape[0] and len(rep_v) == e.cost.shape[1]
        objective.append((e.cost if whole else e.cost[np.ix_(rep_u, rep_v)]).ravel() * LP_UNIT)
        grouped.append((e.u, e.v, len(rep_u), len(rep_v), of_u, of_v))
    if grouped:
        edge_rows, edge_cols, n_vars, n_rows = _pair_rows(grouped, first, n_vars, n_rows)
        rows.append(edge_rows)
        cols.append(edge_cols)
        vals.append(np.where(edge_cols >= first[-1], 1.0, -1.0))
    cost = np.concatenate(objective)
    forbidden = ~np.isfinite(cost)  # a forbidden choice or pair: the variable is 0
    cost[forbidden] = 0.0
    col_upper = np.where(forbidden, 0.0, 1.0)
    rhs = np.zeros(n_rows)
    rhs[: len(sizes)] = 1.0
    if memory is not None and memory.rows:  # (memory) as a running sum, its own columns
        more_rows, more_cols, more_vals, limits = _running_usage(memory, first, n_rows, n_vars)
        if naming is not None:
            naming.memory(len(limits))
        rows, cols, vals = rows + more_rows, cols + more_cols, vals + more_vals
        n_rows, n_vars = n_rows + len(limits), n_vars + len(limits)
        cost = np.concatenate([cost, np.zeros(len(limits))])
        col_upper = np.concatenate([col_upper, limits])
        rhs = np.concatenate([rhs, np.zeros(len(limits))])
    matrix = columns(  # HiGHS takes the matrix by columns
        np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), (n_rows, n_vars)
    )
    lower = upper = rhs
    first_order = n_vars >= options.tuning.lp_first_order_variables
    named = naming.finished() if naming is not None and not first_order else None
    run = _run_highs(
        cost,
        matrix,
        lower,
        upper,
        col_upper,
        time_limit=max(MIN_CPSAT_S, options.left() * LP_SHARE),
        presolve=n_vars >= LP_PRESOLVE_VARIABLES,
        first_order=first_order,
        warm=(warm, *named) if warm is not None and named is not None else None,
    )
    if run is None:
        return LpResult(None, 0.0, None, n_vars, n_rows)
    x, prices, optimum = run
    hint = tuple(int(np.argmax(x[first[v] : first[v + 1]])) for v in range(len(sizes)))
    s = x[: first[len(sizes)]]
    if optimum is not None and not first_order:  # exact: the bound, and the plan if integral
        integral = bool(np.all(np.abs(s - np.round(s)) <= INTEGRAL_TOLERANCE))
        return LpResult(hint if integral else None, optimum / LP_UNIT, hint, n_vars, n_rows)
    if prices is None:
        return LpResult(None, 0.0, hint, n_vars, n_rows)
    # the bound is on the plan's own objective, without the tie break
    pure = cost.copy()
    pure[: len(s)] -= (
        LP_UNIT * TIE_BREAK_S_PER_BYTE * np.concatenate([n.memory for n in problem.nodes])
    )
    bound = _lagrangian_bound(pure, matrix, lower, upper, col_upper, prices)
    return LpResult(None, bound / LP_UNIT if np.isfinite(bound) else 0.0, hint, n_vars, n_rows)


def _pair_rows(
    grouped: list[tuple[int, int, int, int, np.ndarray, np.ndarray]],
    first: np.ndarray,
    n_vars: int,
    n_rows: int,
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The rows of the edges `grouped` (each u, v, its gu and gv groups of u's and of v's
    strategies, the group of each of u's and of v's strategies), laid out edge after
    edge from column `n_vars` and row `n_rows` on: edge e's pairs pair[g, h] are gu x gv
    columns in row-major order; its gu (rows) rows, sum_h pair[g, h] - sum_{k in g}
    s_u[k] = 0; then its gv (cols) rows, sum_g pair[g, h] - sum_{l in h} s_v[l] = 0.
    Returns each entry's row and column (a pair's entries are +1, a strategy's -1: the
    strategies' columns are those below `first[-1]`), and the columns and rows in all
    after them. All edges in a few numpy calls, not ten calls per edge."""
    us, vs, gu, gv = (np.array([g[i] for g in grouped], dtype=np.int64) for i in range(4))
    of_u, of_v = [g[4] for g in grouped], [g[5] for g in grouped]
    pairs = gu * gv
    pair_start = n_vars + np.cumsum(pairs) - pairs
    row_start = n_rows + np.cumsum(gu + gv) - (gu + gv)  # each edge's (rows), then (cols)
    edge = np.repeat(np.arange(len(grouped)), pairs)
    column = np.arange(n_vars, n_vars + int(pairs.sum()))
    local = column - pair_start[edge]
    across = gv[edge]
    pair_rows_u = row_start[edge] + local // across
    pair_rows_v = (row_start + gu)[edge] + local % across
    su = np.array([len(o) for o in of_u], dtype=np.int64)
    sv = np.array([len(o) for o in of_v], dtype=np.int64)
    rows = [
        pair_rows_u,
        pair_rows_v,
        np.repeat(row_start, su) + np.concatenate(of_u),
        np.repeat(row_start + gu, sv) + np.concatenate(of_v),
    ]
    cols = [column, column, consecutive(first[us], su), consecutive(first[vs], sv)]
    return (
        np.concatenate(rows),
        np.concatenate(cols),
        n_vars + int(pairs.sum()),
        n_rows + int((gu + gv).sum()),
    )


@dataclass(frozen=True)
class Columns:
    """A sparse matrix by columns (compressed sparse columns, as scipy's csc_array holds
    it): column j's rows are indices[indptr[j]:indptr[j + 1]], ascending, and its values
    data[...] likewise."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    shape: tuple[int, int]


def columns(
    rows: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int]
) -> Columns:
    """The matrix with `values` at (`rows`, `cols`), entries at one place summed (in the
    order given); what scipy's coo_array(...).tocsc() gives, without importing scipy (a
    tenth of a second, in every process that plans)."""
    order = np.lexsort((rows, cols))
    rows, cols, values = rows[order], cols[order], values[order]
    if len(rows) > 1:
        new = np.ones(len(rows), dtype=bool)
        new[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1])
        if not new.all():
            starts = np.flatnonzero(new)
            values = np.add.reduceat(values, starts)
            rows, cols = rows[starts], cols[starts]
    indptr = np.zeros(shape[1] + 1, dtype=np.int64)
    np.cumsum(np.bincount(cols, minlength=shape[1]), out=indptr[1:])
    return Columns(indptr, rows.astype(np.int64), values.astype(np.float64), shape)


def _memory_unit(memory: CoreRows) -> float:
    """The LP's unit of memory: the power of two at or above the largest right-hand
    side, so usage is about 1 (GiB on a GPU). In bytes (up to 1e10) next to costs of ~1
    they left PDLP far from converging on the 24-layer GPT's rows, and a unit far above
    the usage (GiB for a budget of 50 B) drops its excess below HiGHS' tolerance."""
    largest = max((abs(rhs) for _, rhs in memory.rows), default=1)
    return 2.0 ** math.ceil(math.log2(max(largest, 1)))


def _running_usage(
    memory: CoreRows, first: np.ndarray, row0: int, col0: int
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], np.ndarray]:
    """The memory rows as a running sum: a column L_r per row r, in [0, rhs_r] (in
    `_memory_unit`s), and the equality rows
        L_r - L_{r-1} - sum_{v entering at r} sum_k m_v[k] s_v[k]
                      + sum_{v leaving at r}  sum_k m_v[k] s_v[k] = 0      (L_{-1} = 0)
    where v enters at r when it is a member of row r and not of r - 1, and leaves when
    it is a member of r - 1 and not of r; L_r is then row r's usage exactly. The rows
    lie in program order and a node is a member of consecutive rows, so each node is in
    two of these rows, where the rows themselves held it once per row it is live at (on
    the 24-layer GPT on 2x8 under a budget, 112M nonzeros, and PDLP's run reached 20 GB).
    The rows are numbered from row0 and the L columns from col0; returns the matrix's
    (rows, columns, values) and the L columns' upper bounds."""
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    unit = _memory_unit(memory)

    def add(r: int, nodes: np.ndarray, sign: float) -> None:
        for v in nodes.tolist():
            terms = memory.terms.get(v)
            if terms is not None and terms.any():
                rows.append(np.full(len(terms), row0 + r))
                cols.append(first[v] + np.arange(len(terms)))
                vals.append(sign * terms / unit)

    before = np.zeros(0, dtype=np.int64)
    for r, (members, _) in enumerate(memory.rows):
        add(r, np.setdiff1d(members, before, assume_unique=True), -1.0)
        add(r, np.setdiff1d(before, members, assume_unique=True), 1.0)
        before = members
    running = np.arange(len(memory.rows))
    rows += [row0 + running, row0 + running[1:]]
    cols += [col0 + running, col0 + running[:-1]]
    vals += [np.ones(len(running)), -np.ones(len(running) - 1)]
    return rows, cols, vals, np.array([rhs / unit for _, rhs in memory.rows])


def _lagrangian_bound(
    cost: np.ndarray,
    matrix: Columns,
    lower: np.ndarray,
    upper: np.ndarray,
    col_upper: np.ndarray,
    prices: np.ndarray,
) -> float:
    """A lower bound on min cost.x (lower <= matrix.x <= upper, 0 <= x <= col_upper) from
    any row prices y, whether or not the LP finished: the Lagrangian
        sum_i min_{z in [lower_i, upper_i]} y_i z
          + sum_j min_{x_j in [0, col_upper_j]} (cost_j - A_j.y) x_j
    after y is made to respect each one-sided row's sign (a price that would make the
    first term -inf is 0)."""
    y = np.where(np.isneginf(lower), np.minimum(prices, 0.0), prices)
    y = np.where(np.isposinf(upper), np.maximum(y, 0.0), y)
    rows = np.where(
        y > 0,
        y * np.where(np.isfinite(lower), lower, 0.0),
        y * np.where(np.isfinite(upper), upper, 0.0),
    )
    column = np.repeat(np.arange(matrix.shape[1]), np.diff(matrix.indptr))
    # A^T y column by column, each column's terms added in order (as scipy's product)
    reduced = cost - np.bincount(
        column, weights=matrix.data * y[matrix.indices], minlength=matrix.shape[1]
    )
    return float(rows.sum() + np.sum(col_upper * np.minimum(reduced, 0.0)))


class _Naming:
    """The keys (`LpNames.keys`) of an LP's columns and rows, gathered as `solve_lp`
    lays them out: kinds 0 a strategy (node, -, strategy), 1 a pair of groups (u, v,
    u's group's first strategy, v's), 2 a node's (one) row, 3 and 4 an edge's (rows)
    and (cols) rows by group, 5 and 6 a memory row's running column and its row."""

    def __init__(self, names: LpNames, sizes: np.ndarray) -> None:
        self.names = names
        nodes = names.nodes
        zero = np.zeros(int(sizes.sum()), dtype=np.int64)
        strategies = np.concatenate(names.strategies)
        self.columns = [[zero, np.repeat(nodes, sizes), zero, strategies, zero]]
        none = np.zeros(len(nodes), dtype=np.int64)
        self.rows = [[none + 2, nodes, none, none, none]]

    def edge(self, u: int, v: int, rep_u: np.ndarray, rep_v: np.ndarray) -> None:
        a, b = int(self.names.nodes[u]), int(self.names.nodes[v])
        su, sv = self.names.strategies[u][rep_u], self.names.strategies[v][rep_v]
        n = len(su) * len(sv)
        pairs = [np.repeat(su, len(sv)), np.tile(sv, len(su))]
        self.columns.append([np.full(n, 1), np.full(n, a), np.full(n, b), *pairs])
        zu, zv = np.zeros(len(su), dtype=np.int64), np.zeros(len(sv), dtype=np.int64)
        self.rows.append([zu + 3, zu + a, zu + b, su, zu])
        self.rows.append([zv + 4, zv + a, zv + b, zv, sv])

    def memory(self, count: int) -> None:
        # row r's number split over the two node fields (there may be more rows than nodes)
        a, b = np.divmod(np.arange(count, dtype=np.int64), self.names.count + 1)[::-1]
        z = np.zeros(count, dtype=np.int64)
        self.columns.append([z + 5, a, b, z, z])
        self.rows.append([z + 6, a, b, z, z])

    def finished(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The columns' and the rows' keys, or None where they cannot be named."""
        columns = self.names.keys([np.concatenate(f) for f in zip(*self.columns, strict=True)])
        rows = self.names.keys([np.concatenate(f) for f in zip(*self.rows, strict=True)])
        if columns is None or rows is None:
            return None
        return columns, rows


_STATUS = list(highspy.HighsBasisStatus.__members__.values())
"""HiGHS' basis statuses by value (kLower 0, kBasic 1, kUpper 2, kZero 3, kNonbasic 4)."""
_LOWER, _BASIC, _UPPER = (
    highspy.HighsBasisStatus.kLower.value,
    highspy.HighsBasisStatus.kBasic.value,
    highspy.HighsBasisStatus.kUpper.value,
)


def _read_basis(
    highs: highspy.Highs,
    value: np.ndarray,
    col_upper: np.ndarray,
    columns: np.ndarray,
    rows: np.ndarray,
) -> LpBasis | None:
    """The basis `highs` ended with (`columns` and `rows` its columns' and rows' keys),
    or None where it has none. Read as its basic variables (an array) and, for the
    others, where `value` (the point it ended at) puts them: a column at its upper bound
    (nonzero) there, at its lower bound else; a row (every row is an equality) at its
    lower bound. Reading HiGHS' own statuses (`getBasis`) takes a Python object per column
    and row: 0.24 s for the README demo's 135k columns, against 0.02 s, and the LPs that
    start from either take the same simplex iterations (3176, 4864, 8546 for the demo's
    first three combined-collectives plans)."""
    # highspy's stubs leave out this method of its base class, _Highs
    status, basic = highs.getBasicVariables()  # type: ignore[attr-defined]
    if status != highspy.HighsStatus.kOk:
        return None
    column_status = np.full(len(value), _LOWER, dtype=np.int8)
    column_status[(col_upper > 0) & (value >= col_upper - INTEGRAL_TOLERANCE)] = _UPPER
    row_status = np.full(len(rows), _LOWER, dtype=np.int8)
    column_status[basic[basic >= 0]] = _BASIC
    row_status[-1 - basic[basic < 0]] = _BASIC
    return LpBasis(columns, rows, column_status, row_status)


def _run_highs(
    cost: np.ndarray,
    matrix: Columns,
    lower: np.ndarray,
    upper: np.ndarray,
    col_upper: np.ndarray,
    time_limit: float,
    presolve: bool,
    first_order: bool = False,
    warm: tuple[WarmStart, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray | None, float | None] | None:
    """min cost.x subject to lower <= matrix.x <= upper, 0 <= x <= col_upper (`matrix` by
    columns, `Columns` or scipy's csc_array), on HiGHS (`first_order`: PDLP): (x, the
    row prices or None, the optimum
    or None when HiGHS did not prove one), or None when it has no point at all. `warm`:
    the basis to start from and to leave the final one in, and the columns' and rows'
    keys."""
    n, m = len(cost), len(lower)
    with _quiet_stdout():  # HiGHS may print on stdout, which must stay clean for --json
        highs = highspy.Highs()
        highs.setOptionValue("output_flag", False)
        highs.setOptionValue("solver", "hipdlp" if first_order else LP_SOLVER)
        if first_order:
            highs.setOptionValue("pdlp_optimality_tolerance", PDLP_TOLERANCE)
        highs.setOptionValue("presolve", "on" if presolve else "off")
        highs.setOptionValue("time_limit", float(time_limit))
        # the arrays as they are (a HighsLp's fields would copy them element by element:
        # a third of a refinement window's time in HiGHS): sizes, by columns, minimize,
        # no offset; costs, column bounds, row bounds, the matrix, every column continuous
        highs.passModel(
            n,
            m,
            len(matrix.data),
            int(highspy.MatrixFormat.kColwise),
            int(highspy.ObjSense.kMinimize),
            0.0,
            np.ascontiguousarray(cost, dtype=np.float64),
            np.zeros(n),
            np.ascontiguousarray(col_upper, dtype=np.float64),
            np.ascontiguousarray(lower, dtype=np.float64),
            np.ascontiguousarray(upper, dtype=np.float64),
            matrix.indptr.astype(np.int32),
            matrix.indices.astype(np.int32),
            np.ascontiguousarray(matrix.data, dtype=np.float64),
            np.zeros(n, dtype=np.int32),
        )
        if warm is not None and warm[0].start is not None:
            highs.setBasis(warm[0].start.statuses(warm[1], warm[2]))
        highs.run()
    answer = _answer(highs, col_upper, warm)
    del highs
    if n >= TRIM_COLUMNS:
        return_freed_memory()
    return answer


def _answer(
    highs: highspy.Highs,
    col_upper: np.ndarray,
    warm: tuple[WarmStart, np.ndarray, np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray | None, float | None] | None:
    """What `_run_highs` returns, read from `highs` once it has run; the basis it ended
    with into `warm`."""
    solution = highs.getSolution()
    if not solution.value_valid:
        if warm is not None:
            warm[0].found = None
        return None
    value = np.asarray(solution.col_value)  # a Python list each time it is read
    if warm is not None:
        warm[0].found = _read_basis(highs, value, col_upper, warm[1], warm[2])
    optimal = highs.getModelStatus() == highspy.HighsModelStatus.kOptimal
    return (
        value,
        np.asarray(solution.row_dual) if solution.dual_valid else None,
        float(highs.getInfo().objective_function_value) if optimal else None,
    )


TRIM_COLUMNS = 50_000
"""An LP of this many columns or more hands what it freed back to the system
(`rhino.search.heap.return_freed_memory`). glibc keeps what a thread frees in that
thread's arena, where what the next LP of another thread asks for cannot reuse it: the
meshes of `--devices`, which run the combined-collectives search on threads, peaked up to
180 MiB higher for it (`rhino plan examples/gpt_tiny.hlo --devices 8`: 361-363 MiB with
it, 474-540 without). The README demo's whole-core LPs (135k columns) free megabytes; the
refinement's window LPs (7k-17k columns on the 72-layer GPT) free little, and there are
many (1129 on Qwen-MoE 2x4, where trimming after each took 3.2 s in all)."""


class _QuietStdout:
    """Silence what native code writes to file descriptor 1 (not only sys.stdout) while
    any thread is inside: the first one in points it at /dev/null, the last one out
    points it back (threads that each saved and restored it would leave it pointing at
    /dev/null when their spans overlap)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.saved = -1

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self.lock:
            if self.inside == 0:
                sys.stdout.flush()
                self.saved = os.dup(1)
                with open(os.devnull, "wb") as devnull:
                    os.dup2(devnull.fileno(), 1)
            self.inside += 1
        try:
            yield
        finally:
            with self.lock:
                self.inside -= 1
                if self.inside == 0:
                    os.dup2(self.saved, 1)
                    os.close(self.saved)


_quiet_stdout = _QuietStdout()


def lp_variables(strategies: int, matrices: Iterable[np.ndarray]) -> int:
    """The variables `solve_lp` makes for a problem of `strategies` strategies in all and
    edges with these matrices: one per strategy, and one per pair of a row group and a
    column group of each edge that costs something between two nodes of several
    strategies (the others fold into a node, `fold_single_edges`)."""
    pairs = sum(
        len(_grouped(m)[0]) * len(_grouped(m.T)[0])
        for m in matrices
        if m.shape[0] > 1 and m.shape[1] > 1 and m.any()
    )
    return strategies + pairs


def groups(matrix: np.ndarray) -> tuple[list[list[int]], list[int]]:
    """Rows of `matrix` grouped by equal content (bit for bit), the groups in the order of
    their first rows: (members of each group, group of each row)."""
    first, row_of = _grouped(matrix)
    members: list[list[int]] = [[] for _ in first]
    for k, g in enumerate(row_of.tolist()):
        members[g].append(k)
    return members, row_of.tolist()


def _grouped(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`groups` as arrays: the first row of each group, and the group of each row."""
    rows = np.ascontiguousarray(matrix)
    if rows.shape[0] <= 1 or rows.shape[1] == 0:
        return np.zeros(min(rows.shape[0], 1), dtype=np.int64), np.zeros(
            rows.shape[0], dtype=np.int64
        )
    if rows.dtype.itemsize == 8 and _distinct(rows):  # the usual case (see _distinct)
        return np.arange(rows.shape[0], dtype=np.int64), np.arange(rows.shape[0], dtype=np.int64)
    whole = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inverse = np.unique(whole, return_index=True, return_inverse=True)
    order = np.argsort(first)  # groups by their first row
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return first[order].astype(np.int64), rank[inverse.ravel()]


def _distinct(rows: np.ndarray) -> bool:
    """True when no two rows of `rows` (C-contiguous, 8-byte items) are the same: their
    bits, as integers, summed with fixed odd weights (modulo 2^64, so in any order the
    same sum) all differ. Where two sums meet, False, and `_grouped` compares the rows
    themselves. Half the time of sorting them, and the rows of 3 in 4 of T5-large's
    window LPs' edges all differ."""
    with np.errstate(over="ignore"):
        sums = (rows.view(np.uint64) * _weights(rows.shape[1])).sum(axis=1, dtype=np.uint64)
    sums.sort()
    return bool((sums[1:] != sums[:-1]).all())


@functools.cache
def _weights(count: int) -> np.ndarray:
    return np.random.default_rng(count).integers(0, 2**63, count, dtype=np.uint64) * 2 + 1
