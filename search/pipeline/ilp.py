"""Forward stage assignment: the ILP of Rhino §5.1 with bound tightening (§5.2).

Data
    V, E          forward instructions and their producer -> consumer edges
    c[i]          seconds of instruction i;  C = sum_i c[i]
    b[i]          bytes of i's result
    d             stages;  cap = (1 + eps) * C / d,  floor = max(0, 1 - eps) * C / d
    [lo[i], hi[i]]  the window of stages i may take (bound tightening, below)
The model of §5.1
    B[i] in [lo[i], hi[i]]    stage of i
    F[i,j] in {0,1}           edge (i, j) crosses stages:  F <= B[j] - B[i] <= M F
    (order)  B[j] >= B[i],  cost b[i] F[i,j]
is written here in its order (prefix) encoding: the same plans and costs, a stronger LP.
Variables
    y[i][t] in {0,1}          B[i] <= t  (t < lo[i]: 0;  t >= hi[i]: 1;  y[i][-1] = 0)
    x[i][t] = y[i][t] - y[i][t-1]          B[i] = t;   B[i] = sum_t t x[i][t]
    R[i][t] in {0,1}          stage t receives i's result (t > B[i])
Model
    min   sum_i b[i] sum_t R[i][t]
    (stage)      y[i][t] <= y[i][t+1]                                     for every i, t
    (order)      y[j][t] <= y[i][t]              (B[j] >= B[i])           for every (i, j), t
    (receive)    R[i][t] >= x[j][t] - x[i][t]    (j on t, i before it)    for every (i, j), t
    (balance)    floor <= sum_i c[i] x[i][t] <= cap                       for every t
    (receipt)    sum_i b[i] R[i][t] >= least(t)        (with tightening)  for every t
With B and big-M cut rows the LP relaxation is weak: F[i,j] = (B[j] - B[i]) / M is
allowed, so a boundary spread over M edges costs 1/M of one (on the 24-layer GPT into 8
stages CP-SAT's bound stayed far below the optimum). With the prefix rows, once bound
tightening has pinned the first and the last instructions, every boundary t has to be
crossed on every path, and the LP bound is 33-100% of the optimum (24-layer GPT: 48 of
48 MiB on 4 stages, 37 of 112 on 8; encoder-decoder: 38 of 48 on 8; UNet: 62 of 73 on
8). Without tightening it is 0: every instruction spread evenly over the stages.

The paper counts b[i] F[i,j] per edge, so a tensor read by two instructions of one later
stage is counted twice; here it is counted once per (producer, receiving stage), which is
what is sent. The paper has no balance row (its bounds alone keep stages balanced); here
it is explicit and two-sided: without `floor`, a loose epsilon lets stages go empty (a
"4-stage" plan on 8 device groups cuts fewer bytes and idles half of them).

Bound tightening. With A[i] the compute of i's ancestors and D[i] of its descendants,
every ancestor sits at a stage <= B[i] and every descendant at >= B[i]; stages after
B[i] hold no ancestor of i and stages before it no descendant. So by (balance)
    (B[i] + 1) cap >= A[i] + c[i]                (d - B[i]) cap >= D[i] + c[i]
    (d - 1 - B[i]) floor <= C - A[i] - c[i]      B[i] floor <= C - D[i] - c[i]
which give lo[i] and hi[i]; then lo grows along edges and hi shrinks against them
(B[j] >= B[i]). The bounds are implied by the model, so tightening never cuts off a
plan. Instructions whose window is one stage are fixed before the solver runs; the
others keep their window as their domain. The balance rows are scaled to integers
rounding every c[i] up for the cap and down for the floor, so a plan the solver accepts
meets the float balance that `evaluate` checks. From the windows, `receipts` bounds
what each stage t receives (least(t), by max flows); where the start plan cuts no more
than the sum, it is optimal and CP-SAT does not run (the 24- and 72-layer GPTs into 4 and
8 stages). The model is built over the problem's exact reduction
(`rhino.search.pipeline.reduce`), and its answer expanded back.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from rhino.hlo.errors import InfeasibleError
from rhino.search.pipeline.problem import StageProblem
from rhino.search.pipeline.receipts import least_receipts
from rhino.search.pipeline.reduce import Reduction, reduce_stages
from rhino.search.pipeline.stats import StageAssignment, StageSolveStats
from rhino.search.problem import FEASIBILITY, SolveOptions, SolveStatus
from rhino.search.spmd.solver import cpsat_solver

CORE_SEARCH = "core"
"""The one CP-SAT worker the stage ILP runs: the core-based search raises the bound one
stage's least receipt at a time and starts from the hint. With `CORE_PARAMETERS`, on the
same models and hints, it proved untightened plans optimal (the 24-layer GPT into 8
stages, the T5-large-sized encoder-decoder into 4) where CP-SAT's default worker and the
deterministic portfolio of 2 workers (`interleave_search`) did not within the time limit;
tightened, it was the fastest of the three on the encoder-decoder and close to the default
worker on the GPT (`scripts/bench_pipeline.py` times this ILP with and without
tightening). One worker is deterministic for any --threads."""

CORE_PARAMETERS = {
    "core_minimization_level": 0,
    "transitive_precedences_work_limit": 0,
    "cp_model_presolve": False,
    "use_sat_inprocessing": False,
    "cp_model_probing_level": 0,
    "symmetry_level": 0,
}
"""CP-SAT's settings for the core search, with and without tightening. The model is 0-1
variables under precedence rows (`y[j][t] <= y[i][t]`), a few balance and receipt rows,
and a complete hint: CP-SAT's root-level work on it costs more than the search.
- `transitive_precedences_work_limit` 0: CP-SAT closes the precedence pairs transitively
  at the root; much of its time went there (perf: `Linear2Indices::AddOrGet`,
  `RootLevelLinear2Bounds`), far more than the core search itself took.
- No presolve, inprocessing, probing or symmetry search: the windows and the receipts
  leave them little to find.
- Cores not minimized (CP-SAT's default level is 2).
These settings shortened CP-SAT's time on the zoo's encoder-decoders and GPTs, with and
without tightening (`scripts/bench_pipeline.py` measures the ILP's time both ways)."""

BALANCE_UNITS = 2.0**30
"""The balance row's integer scale: the total compute is about this many units."""


# -- bound tightening ---------------------------------------------------------------------


@dataclass(frozen=True)
class Windows:
    lo: tuple[int, ...]
    hi: tuple[int, ...]

    @property
    def fixed(self) -> int:
        return sum(1 for a, b in zip(self.lo, self.hi, strict=True) if a == b)

    @property
    def choices(self) -> int:
        """Sum of the window sizes (the x variables before presolve)."""
        return sum(b - a + 1 for a, b in zip(self.lo, self.hi, strict=True))


def full_windows(problem: StageProblem) -> Windows:
    n, d = len(problem.names), problem.stages
    return Windows((0,) * n, (d - 1,) * n)


def tighten(problem: StageProblem) -> Windows:
    """Each instruction's window of stages implied by (balance) and (order); raises
    InfeasibleError when some window is empty (no plan meets the balance)."""
    n, d, cap = len(problem.names), problem.stages, problem.capacity
    c = np.asarray(problem.compute, dtype=float)
    operands: list[list[int]] = [[] for _ in range(n)]
    for i, cs in enumerate(problem.consumers):
        for j in cs:
            operands[j].append(i)
    ancestors = closure_compute(operands, range(n), c)
    descendants = closure_compute(problem.consumers, range(n - 1, -1, -1), c)
    up_to, from_ = ancestors + c, descendants + c  # compute at or before i, at or after i
    lows, highs = np.zeros(n), np.full(n, d - 1.0)
    if cap > 0:
        lows = np.maximum(lows, np.ceil(up_to / cap - FEASIBILITY) - 1)
        highs = np.minimum(highs, d - np.ceil(from_ / cap - FEASIBILITY))
    floor, total = problem.floor, float(c.sum())
    if floor > 0:
        lows = np.maximum(lows, d - 1 - np.floor((total - up_to) / floor + FEASIBILITY))
        highs = np.minimum(highs, np.floor((total - from_) / floor + FEASIBILITY))
    lo, hi = [int(x) for x in lows], [int(x) for x in highs]
    for i in range(n):
        for j in problem.consumers[i]:
            lo[j] = max(lo[j], lo[i])
    for i in range(n - 1, -1, -1):
        for j in problem.consumers[i]:
            hi[i] = min(hi[i], hi[j])
    lo_, hi_ = np.array(lo), np.array(hi)
    too_big = c > cap * (1 + FEASIBILITY)
    empty = lo_ > hi_
    if (too_big | empty).any():
        i = int(np.argmax(too_big | empty))
        if too_big[i]:
            why = f"%{problem.names[i]} alone is {c[i] / total:.1%} of the compute"
            raise InfeasibleError(_unbalanced(problem, why))
        raise InfeasibleError(_unbalanced(problem, f"%{problem.names[i]} has no stage left"))
    fixed = np.bincount(lo_[lo_ == hi_], weights=c[lo_ == hi_], minlength=d)
    # possible[t]: the compute whose window holds t (a difference array over the windows)
    possible = np.cumsum(
        np.bincount(lo_, weights=c, minlength=d + 1)
        - np.bincount(hi_ + 1, weights=c, minlength=d + 1)
    )[:d]
    for t in range(d):
        if fixed[t] > cap * (1 + FEASIBILITY):
            share = fixed[t] / total
            why = f"the instructions that can only go to stage {t} are {share:.1%} of the compute"
            raise InfeasibleError(_unbalanced(problem, why))
        if possible[t] < problem.floor * (1 - FEASIBILITY):
            share = possible[t] / total
            why = f"the instructions that can go to stage {t} are {share:.1%} of the compute"
            raise InfeasibleError(_unbalanced(problem, why))
    return Windows(tuple(lo), tuple(hi))


def closure_compute(preds: Sequence[Sequence[int]], order: range, c: np.ndarray) -> np.ndarray:
    """For each node, the compute of the nodes it reaches through `preds` (transitively),
    visiting nodes in `order` (every pred before the node). Reachability as bit sets
    (Python integers). Where one pred p reaches, with itself, all that the node reaches,
    the node's sum is p's plus c[p] (on the zoo's large models, all but 5-8% of the nodes);
    the others' sets are summed byte by byte from a table of the 256 sums each byte can
    hold."""
    n = len(preds)
    width = (n + 7) // 8
    reach = [0] * n
    through = [-1] * n  # the pred whose sum the node's is, -1 for none
    summed: list[int] = []  # the nodes summed from the table
    for v in order:
        row = 0
        for p in preds[v]:
            row |= reach[p] | (1 << p)
        reach[v] = row
        through[v] = next((p for p in preds[v] if reach[p] | (1 << p) == row), -1)
        if through[v] < 0 and row:
            summed.append(v)
    total = np.zeros(n)
    if summed:
        rows = np.frombuffer(
            b"".join(reach[v].to_bytes(width, "little") for v in summed), dtype=np.uint8
        ).reshape(len(summed), width)
        weights = np.zeros(width * 8)
        weights[:n] = c
        byte_bits = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(float)  # [byte, bit]
        table = weights.reshape(width, 8) @ byte_bits.T  # [position, byte value] -> sum
        positions = np.arange(width)
        for start in range(0, len(summed), 1024):
            chunk = rows[start : start + 1024]
            total[summed[start : start + 1024]] = table[positions, chunk].sum(axis=1)
    for v in order:
        if through[v] >= 0:
            total[v] = total[through[v]] + c[through[v]]
    return total


def _unbalanced(problem: StageProblem, why: str) -> str:
    total = sum(problem.compute)
    biggest = max(range(len(problem.names)), key=lambda k: problem.compute[k])
    name = f"%{problem.names[biggest]}"
    share = problem.compute[biggest] / total if total else 0.0
    largest = "" if name in why else f"largest instruction {name} is {share:.1%} of the compute; "
    return (
        f"no {problem.stages}-stage plan keeps every stage within epsilon {problem.epsilon:g} of "
        f"the average ({max(0.0, 1 - problem.epsilon) / problem.stages:.1%} to "
        f"{(1 + problem.epsilon) / problem.stages:.1%} of the compute a stage): {why} "
        f"({largest}raise `epsilon` or use fewer stages)"
    )


# -- the ILP ----------------------------------------------------------------------------------


def solve_stages(
    problem: StageProblem,
    options: SolveOptions | None = None,
    *,
    tightening: bool = True,
    hint: tuple[int, ...] | None = None,
) -> StageAssignment:
    """The ILP of the module docstring on CP-SAT, over the problem's exact reduction
    (`reduce`). `hint` (a plan meeting the balance, e.g. the best baseline) starts
    the search, and is kept when the solver finds nothing better within the time limit.
    With tightening, the stages' least receipts (`receipts`) bound the cut from
    below; a start plan that reaches the bound is the answer without the solver."""
    options = options or SolveOptions()
    start = time.perf_counter()
    reduction = reduce_stages(problem)
    work = reduction.problem
    windows = tighten(work) if tightening else full_windows(work)
    receipts = (
        least_receipts(work, windows.lo, windows.hi, options.tuning.light_share)
        if tightening
        else (0,) * work.stages
    )
    tightened_s = time.perf_counter() - start
    first = _restricted_hint(reduction, hint)  # (plan, cut bytes) on the reduced problem
    least = sum(receipts)
    stats = StageSolveStats(
        nodes=len(problem.names),
        reduced_nodes=len(work.names),
        fixed=windows.fixed,
        window_choices=windows.choices,
        receipt_bound=least,
        tighten_s=tightened_s,
    )
    if first is not None and first[1] <= least:
        proven = reduction.expand(first[0])
        cut = problem.evaluate(proven).cut_bytes
        return StageAssignment(
            proven, cut, float(cut), SolveStatus.OPTIMAL, "hint", time.perf_counter() - start, stats
        )
    model, y, received = _build(work, windows, receipts)
    build_s = time.perf_counter() - start - tightened_s
    if first is not None:
        _add_hint(model, y, received, work, first[0])
    solver = cpsat_solver(options, options.time_limit_s)
    solver.parameters.num_workers = 1
    solver.parameters.interleave_search = False
    solver.parameters.subsolvers.append(CORE_SEARCH)
    for name, value in CORE_PARAMETERS.items():
        setattr(solver.parameters, name, value)
    status = solver.solve(model)
    stats = dataclasses.replace(
        stats,
        variables=len(model.proto.variables),
        constraints=len(model.proto.constraints),
        build_s=build_s,
        cpsat_s=solver.wall_time,
    )
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if status == cp_model.INFEASIBLE:
        raise InfeasibleError(_unbalanced(problem, "the solver proved that no plan meets it"))
    if not found and hint is None:
        raise InfeasibleError(
            f"the stage ILP found no plan within {options.time_limit_s:g} s "
            f"(status {solver.status_name(status)}); raise `time_limit_s`"
        )
    bound = max(float(least), solver.best_objective_bound if found else 0.0)
    plans = [(reduction.expand(tuple(_value(solver, row) for row in y)), "ilp")] if found else []
    plans += [(hint, "hint")] if hint is not None else []
    # the ILP's plan unless the hint cuts less
    cut, _, chosen, method = min(
        (problem.evaluate(plan).cut_bytes, k, plan, how) for k, (plan, how) in enumerate(plans)
    )
    optimal = status == cp_model.OPTIMAL or cut <= bound
    return StageAssignment(
        chosen,
        cut,
        min(float(cut), bound),
        SolveStatus.OPTIMAL if optimal else SolveStatus.FEASIBLE,
        method,
        time.perf_counter() - start,
        stats,
    )


def _restricted_hint(
    reduction: Reduction, hint: tuple[int, ...] | None
) -> tuple[tuple[int, ...], int] | None:
    """The hint on the reduced problem and its cut bytes there, when it still meets
    precedence and balance there."""
    if hint is None:
        return None
    restricted = reduction.restrict(hint)
    try:
        return restricted, reduction.problem.evaluate(restricted).cut_bytes
    except InfeasibleError:
        return None


Prefix = list[cp_model.IntVar | int]
"""y[i]: t -> the 0-1 variable "B[i] <= t" for t = -1 .. d-1 (constant outside i's window)."""


Received = list[dict[int, cp_model.IntVar | int]]
"""received[i]: s -> R[i][s] (1 where it is sure), for the stages that may receive i's result."""


def _build(
    problem: StageProblem, windows: Windows, receipts: tuple[int, ...]
) -> tuple[cp_model.CpModel, list[Prefix], Received]:
    model = cp_model.CpModel()
    n, d, lo, hi = len(problem.names), problem.stages, windows.lo, windows.hi
    y: list[Prefix] = []
    for i in range(n):
        row: Prefix = [
            0 if t < lo[i] else 1 if t >= hi[i] else model.new_bool_var(f"y[{i}][{t}]")
            for t in range(d)
        ]
        for t in range(lo[i], hi[i] - 1):
            model.add(row[t] <= row[t + 1])  # (stage)
        y.append(row + [0])  # the 0 is y[i][-1] (Python's last element)
    received: Received = []
    for i in range(n):
        for j in problem.consumers[i]:
            for t in range(lo[j], hi[i]):
                model.add(y[j][t] <= y[i][t])  # (order); constant outside [lo[j], hi[i])
        received.append(_received(model, problem, windows, y, i))
    _add_balance(model, problem, windows, y)
    per_stage: list[list[tuple[cp_model.IntVar | int, int]]] = [[] for _ in range(d)]
    for i, by_stage in enumerate(received):
        for s, r in by_stage.items():
            per_stage[s].append((r, problem.bytes[i]))
    for s, terms in enumerate(per_stage):
        if receipts[s] > 0 and not all(isinstance(r, int) for r, _ in terms):
            model.add(_weighted(terms) >= receipts[s])  # the stage's least receipt
    model.minimize(_weighted([term for terms in per_stage for term in terms]))
    return model, y, received


def _weighted(terms: list[tuple[cp_model.IntVar | int, int]]) -> cp_model.LinearExprT:
    """sum w * v over (v, w) in terms, v a variable or a constant; one expression object
    (a Python sum of products builds one per term: slower on the long balance rows)."""
    variables = [v for v, _ in terms if not isinstance(v, int)]
    weights = [w for v, w in terms if not isinstance(v, int)]
    constant = sum(v * w for v, w in terms if isinstance(v, int))
    return cp_model.LinearExpr.weighted_sum(variables, weights) + constant


def _x(
    y: list[Prefix], nodes: list[int], weight: list[int], t: int
) -> list[tuple[cp_model.IntVar | int, int]]:
    """sum weight[i] [B[i] = t] over the nodes, as terms of `_weighted`; B[i] = t is
    y[i][t] - y[i][t-1]."""
    terms: list[tuple[cp_model.IntVar | int, int]] = []
    for i in nodes:
        if weight[i]:
            terms += ((y[i][t], weight[i]), (y[i][t - 1], -weight[i]))
    return terms


def _received(
    model: cp_model.CpModel, problem: StageProblem, windows: Windows, y: list[Prefix], i: int
) -> dict[int, cp_model.IntVar | int]:
    """(receive) for i's result: R[i][s] by stage s."""
    lo, hi = windows.lo, windows.hi
    R: dict[int, cp_model.IntVar | int] = {}
    if not problem.bytes[i]:
        return R
    for j in problem.consumers[i]:
        for s in range(max(lo[j], lo[i] + 1), hi[j] + 1):
            r = R.get(s)
            if isinstance(r, int):
                continue  # received for sure
            if lo[j] == hi[j] == s and hi[i] < s:
                R[s] = 1  # j is on s and i before it
                continue
            if r is None:
                r = R[s] = model.new_bool_var(f"R[{i}][{s}]")
            model.add(r >= y[j][s] - y[j][s - 1] - y[i][s] + y[i][s - 1])  # x[j][s] - x[i][s]
    return R


def _add_balance(
    model: cp_model.CpModel, problem: StageProblem, windows: Windows, y: list[Prefix]
) -> None:
    total = sum(problem.compute)
    if total <= 0:
        return
    scale = 2.0 ** math.floor(math.log2(BALANCE_UNITS / total))
    cap = math.floor(problem.capacity * scale * (1 + 1e-12))
    floor = math.ceil(problem.floor * scale * (1 - 1e-12))
    up = [math.ceil(c * scale) for c in problem.compute]
    down = [math.floor(c * scale) for c in problem.compute]
    lo, hi = windows.lo, windows.hi
    for t in range(problem.stages):
        on = [i for i in range(len(y)) if lo[i] <= t <= hi[i]]
        fixed_up = sum(up[i] for i in on if lo[i] == hi[i])
        free = [i for i in on if lo[i] < hi[i]]
        if not free:
            continue  # fixed instructions only: `tighten` checked their load
        if fixed_up + sum(up[i] for i in free) > cap:
            model.add(_weighted(_x(y, free, up, t)) <= cap - fixed_up)
        fixed_down = sum(down[i] for i in on if lo[i] == hi[i])
        if floor > fixed_down:
            model.add(_weighted(_x(y, free, down, t)) >= floor - fixed_down)


def _add_hint(
    model: cp_model.CpModel,
    y: list[Prefix],
    received: Received,
    problem: StageProblem,
    hint: tuple[int, ...],
) -> None:
    """Every variable hinted (CP-SAT takes a complete, feasible hint as its first plan).
    Written to the proto in one piece: `add_hint` per variable took 8 us each."""
    index: list[int] = []
    value: list[int] = []
    for i, row in enumerate(y):
        for t, var in enumerate(row[:-1]):
            if not isinstance(var, int):
                index.append(var.index)
                value.append(int(hint[i] <= t))
    for i, by_stage in enumerate(received):
        readers = {hint[j] for j in problem.consumers[i]}
        for s, r in by_stage.items():
            if not isinstance(r, int):
                index.append(r.index)
                value.append(int(hint[i] < s and s in readers))
    model.proto.solution_hint.vars.extend(index)
    model.proto.solution_hint.values.extend(value)


def _value(solver: cp_model.CpSolver, row: Prefix) -> int:
    """B[i]: the first t with y[i][t] = 1 (y[i][d-1] is)."""
    return next(
        t
        for t, var in enumerate(row)
        if (var == 1 if isinstance(var, int) else solver.boolean_value(var))
    )


# -- brute force (tests) -------------------------------------------------------------------


def solve_stages_brute_force(problem: StageProblem) -> tuple[tuple[int, ...], int] | None:
    """The least cut bytes over every plan that meets (order) and (balance), and one plan
    reaching it (the first in lexicographic order); None when no plan meets them."""
    n, d = len(problem.names), problem.stages
    operands: list[list[int]] = [[] for _ in range(n)]
    for i, cs in enumerate(problem.consumers):
        for j in cs:
            operands[j].append(i)
    best: tuple[tuple[int, ...], int] | None = None
    for plan in itertools.product(range(d), repeat=n):
        if any(plan[p] > plan[j] for j in range(n) for p in operands[j]):
            continue
        try:
            cut = problem.evaluate(plan).cut_bytes
        except InfeasibleError:
            continue
        if best is None or cut < best[1]:
            best = (plan, cut)
    return best
