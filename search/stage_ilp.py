"""Forward stage assignment: the ILP of Rhino §5.1 with bound tightening (§5.2).

Data
    V, E          forward instructions and their producer -> consumer edges
    c[i]          seconds of instruction i;  C = sum_i c[i]
    b[i]          bytes of i's result
    d             stages;  cap = (1 + eps) * C / d,  floor = max(0, 1 - eps) * C / d
    [lo[i], hi[i]]  the window of stages i may take (bound tightening, below)
Variables
    B[i] in [lo[i], hi[i]]    stage of i
    x[i][t] in {0,1}          B[i] = t
    F[i,j] in {0,1}           edge (i, j) crosses stages
    R[i][t] in {0,1}          stage t receives i's result (t != B[i])
Model
    min   sum_i b[i] sum_t R[i][t]
    (one)        sum_t x[i][t] = 1,  B[i] = sum_t t x[i][t]               for every i
    (order)      B[j] >= B[i]                                             for every (i, j)
    (cut)        F[i,j] <= B[j] - B[i] <= M F[i,j],  M = hi[j] - lo[i]    for every (i, j)
    (receive)    R[i][t] >= F[i,j] + x[j][t] - 1                         for every (i, j), t
    (balance)    floor <= sum_i c[i] x[i][t] <= cap                       for every t

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
meets the float balance that `evaluate` checks. The model is built over the problem's
exact reduction (`rhino.search.stage_reduce`), and its answer expanded back.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from rhino.hlo.errors import InfeasibleError
from rhino.search.problem import SolveOptions, SolveStatus
from rhino.search.solver import cpsat_solver
from rhino.search.stage_problem import StageProblem
from rhino.search.stage_reduce import Reduction, reduce_problem

BALANCE_UNITS = 2.0**30
"""The balance row's integer scale: the total compute is about this many units."""


@dataclass(frozen=True)
class StagePlan:
    """A stage per instruction, with how it was found."""

    stage: tuple[int, ...]
    cut_bytes: int
    """Recomputed by `evaluate`."""
    bound: float
    """Best lower bound on the cut bytes the solver proved."""
    status: SolveStatus
    method: str
    """"ilp", or "hint" when the start plan was not beaten (then it is the answer)."""
    solve_time_s: float
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        if self.cut_bytes <= 0:
            return 0.0
        return max(0.0, (self.cut_bytes - self.bound) / self.cut_bytes)


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
    ancestors = _closure_compute(operands, range(n), c)
    descendants = _closure_compute([list(cs) for cs in problem.consumers], range(n - 1, -1, -1), c)
    lo = [max(0, _ceil((ancestors[i] + c[i]) / cap) - 1) if cap > 0 else 0 for i in range(n)]
    hi = [min(d - 1, d - _ceil((descendants[i] + c[i]) / cap)) if cap > 0 else d - 1
          for i in range(n)]  # fmt: skip
    floor, total = problem.floor, float(c.sum())
    if floor > 0:
        for i in range(n):
            lo[i] = max(lo[i], d - 1 - _floor((total - ancestors[i] - c[i]) / floor))
            hi[i] = min(hi[i], _floor((total - descendants[i] - c[i]) / floor))
    for i in range(n):
        for j in problem.consumers[i]:
            lo[j] = max(lo[j], lo[i])
    for i in range(n - 1, -1, -1):
        for j in problem.consumers[i]:
            hi[i] = min(hi[i], hi[j])
    for i in range(n):
        if c[i] > cap * (1 + 1e-9):
            share = c[i] / c.sum()
            why = f"%{problem.names[i]} alone is {share:.1%} of the compute"
            raise InfeasibleError(_unbalanced(problem, why))
        if lo[i] > hi[i]:
            raise InfeasibleError(_unbalanced(problem, f"%{problem.names[i]} has no stage left"))
    fixed = [0.0] * d
    for i in range(n):
        if lo[i] == hi[i]:
            fixed[lo[i]] += c[i]
    possible = [0.0] * d
    for i in range(n):
        for t in range(lo[i], hi[i] + 1):
            possible[t] += c[i]
    for t in range(d):
        if fixed[t] > cap * (1 + 1e-9):
            why = f"the instructions that can only go to stage {t} are {fixed[t] / c.sum():.1%} of the compute"
            raise InfeasibleError(_unbalanced(problem, why))
        if possible[t] < problem.floor * (1 - 1e-9):
            why = f"the instructions that can go to stage {t} are {possible[t] / c.sum():.1%} of the compute"
            raise InfeasibleError(_unbalanced(problem, why))
    return Windows(tuple(lo), tuple(hi))


def _ceil(x: float) -> int:
    return math.ceil(x - 1e-9)


def _floor(x: float) -> int:
    return math.floor(x + 1e-9)


def _closure_compute(preds: list[list[int]], order: range, c: np.ndarray) -> np.ndarray:
    """For each node, the compute of the nodes it reaches through `preds` (transitively),
    visiting nodes in `order` (every pred before the node). Reachability as bit rows."""
    n = len(preds)
    width = (n + 7) // 8
    reach = np.zeros((n, width), dtype=np.uint8)
    for v in order:
        row = reach[v]
        for p in preds[v]:
            np.bitwise_or(row, reach[p], out=row)
            row[p >> 3] |= np.uint8(0x80 >> (p & 7))
    total = np.empty(n)
    for start in range(0, n, 1024):
        bits = np.unpackbits(reach[start : start + 1024], axis=1, count=n)
        total[start : start + 1024] = bits @ c
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
        f"({largest}raise --epsilon or use fewer stages)"
    )


# -- the ILP ----------------------------------------------------------------------------------


def solve_stages(problem: StageProblem, options: SolveOptions | None = None, *,
                 tightening: bool = True, hint: tuple[int, ...] | None = None) -> StagePlan:  # fmt: skip
    """The ILP of the module docstring on CP-SAT, over the problem's exact reduction
    (`stage_reduce`). `hint` (a plan meeting the balance, e.g. the best baseline) starts
    the search, and is kept when the solver finds nothing better within the time limit."""
    options = options or SolveOptions()
    start = time.perf_counter()
    reduction = reduce_problem(problem)
    work = reduction.problem
    windows = tighten(work) if tightening else full_windows(work)
    tightened_s = time.perf_counter() - start
    model, x = _build(work, windows)
    start_plan = _restricted_hint(reduction, hint)
    if start_plan is not None:
        _add_hint(model, x, start_plan)
    solver = cpsat_solver(options, options.time_limit_s)
    status = solver.solve(model)
    stats = {"nodes": float(len(problem.names)), "reduced_nodes": float(len(work.names)),
             "variables": float(len(model.proto.variables)),
             "constraints": float(len(model.proto.constraints)),
             "fixed": float(windows.fixed), "window_choices": float(windows.choices),
             "tighten_s": tightened_s, "cpsat_s": solver.wall_time}  # fmt: skip
    found = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    if status == cp_model.INFEASIBLE:
        raise InfeasibleError(_unbalanced(problem, "the solver proved that no plan meets it"))
    if not found and hint is None:
        raise InfeasibleError(f"the stage ILP found no plan within {options.time_limit_s:g} s "
                              f"(status {solver.status_name(status)}); raise --time-limit")  # fmt: skip
    bound = max(0.0, solver.best_objective_bound) if found else 0.0
    chosen, method = hint, "hint"
    if found:
        chosen = reduction.expand(tuple(_value(solver, row) for row in x))
        method = "ilp"
        if (
            hint is not None
            and problem.evaluate(hint).cut_bytes < problem.evaluate(chosen).cut_bytes
        ):
            chosen, method = hint, "hint"
    assert chosen is not None
    cut = problem.evaluate(chosen).cut_bytes
    optimal = status == cp_model.OPTIMAL or cut <= bound
    return StagePlan(chosen, cut, min(float(cut), bound),
                     SolveStatus.OPTIMAL if optimal else SolveStatus.FEASIBLE, method,
                     time.perf_counter() - start, stats)  # fmt: skip


def _restricted_hint(reduction: Reduction, hint: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The hint on the reduced problem, when it still meets precedence and balance there."""
    if hint is None:
        return None
    restricted = reduction.restrict(hint)
    try:
        reduction.problem.evaluate(restricted)
    except InfeasibleError:
        return None
    return restricted


Choice = dict[int, cp_model.IntVar | int]
"""x[i]: stage t -> the 0-1 variable (or the constant 1 of a fixed instruction)."""


def _build(problem: StageProblem, windows: Windows) -> tuple[cp_model.CpModel, list[Choice]]:
    model = cp_model.CpModel()
    n, lo, hi = len(problem.names), windows.lo, windows.hi
    # (one)
    x: list[Choice] = []
    B: list[cp_model.LinearExpr | int] = []
    for i in range(n):
        if lo[i] == hi[i]:
            x.append({lo[i]: 1})
            B.append(lo[i])
            continue
        row: Choice = {t: model.new_bool_var(f"x[{i}][{t}]") for t in range(lo[i], hi[i] + 1)}
        model.add_exactly_one(row.values())
        x.append(row)
        B.append(sum(t * v for t, v in row.items()))
    objective: list[cp_model.LinearExprT] = []
    for i in range(n):
        objective.extend(_edges(model, problem, windows, x, B, i))
    # (balance)
    _add_balance(model, problem, x)
    model.minimize(sum(objective))
    return model, x


def _edges(model: cp_model.CpModel, problem: StageProblem, windows: Windows, x: list[Choice],
           B: list[cp_model.LinearExpr | int], i: int) -> list[cp_model.LinearExprT]:  # fmt: skip
    """(order), (cut) and (receive) for the edges out of i; its objective terms."""
    lo, hi = windows.lo, windows.hi
    R: dict[int, cp_model.IntVar | int] = {}
    for j in problem.consumers[i]:
        # (order)
        if lo[j] < hi[i]:
            model.add(B[j] >= B[i])
        # (cut)
        if hi[j] <= lo[i]:
            continue  # never crosses: both at one stage
        if lo[j] > hi[i]:
            F: cp_model.IntVar | int = 1
        else:
            F = model.new_bool_var(f"F[{i},{j}]")
            model.add(F <= B[j] - B[i])
            model.add(B[j] - B[i] <= (hi[j] - lo[i]) * F)
        # (receive)
        for t, xjt in x[j].items():
            if lo[i] == hi[i] == t:
                continue  # j on i's stage: nothing received
            r = R.get(t)
            if _one(r):
                continue
            if _one(F) and _one(xjt):
                R[t] = 1
                continue
            if r is None:
                r = R[t] = model.new_bool_var(f"R[{i}][{t}]")
            model.add(r >= F + xjt - 1)
    size = problem.bytes[i]
    return [size * r for r in R.values()] if size else []


def _one(v: object) -> bool:
    """Is `v` the constant 1 (not a variable)?"""
    return isinstance(v, int) and v == 1


def _add_balance(model: cp_model.CpModel, problem: StageProblem, x: list[Choice]) -> None:
    total = sum(problem.compute)
    if total <= 0:
        return
    scale = 2.0 ** math.floor(math.log2(BALANCE_UNITS / total))
    cap = math.floor(problem.capacity * scale * (1 + 1e-12))
    floor = math.ceil(problem.floor * scale * (1 - 1e-12))
    up = [math.ceil(c * scale) for c in problem.compute]
    down = [math.floor(c * scale) for c in problem.compute]
    for t in range(problem.stages):
        on = [i for i, row in enumerate(x) if t in row]
        if all(isinstance(x[i][t], int) for i in on):
            continue  # fixed instructions only: `tighten` checked their load
        if sum(up[i] for i in on) > cap:
            model.add(sum(up[i] * x[i][t] for i in on if up[i]) <= cap)
        fixed = sum(down[i] for i in on if isinstance(x[i][t], int))
        if floor > fixed:
            model.add(sum(down[i] * x[i][t] for i in on if down[i]) >= floor)


def _add_hint(model: cp_model.CpModel, x: list[Choice], hint: tuple[int, ...]) -> None:
    for i, row in enumerate(x):
        for t, var in row.items():
            if not isinstance(var, int):
                model.add_hint(var, t == hint[i])


def _value(solver: cp_model.CpSolver, row: Choice) -> int:
    if len(row) == 1:
        return next(iter(row))
    return next(t for t, var in row.items() if isinstance(var, int) or solver.boolean_value(var))


# -- brute force (tests) -------------------------------------------------------------------


def solve_brute_force(problem: StageProblem) -> tuple[tuple[int, ...], int] | None:
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
