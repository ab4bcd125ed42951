"""Exact reductions of a stage problem: instructions without compute folded into a
neighbour that an optimal plan may always put them with.

Most forward instructions compute nothing (parameters, reshapes, broadcasts, transposes:
60% of a GPT's). For such an instruction i (c[i] = 0), some optimal plan has
    (source)  B[i] = B[j]   when i has no operand and one consumer j
    (up)      B[i] = B[j]   when i has one operand p and one consumer j, and b[p] <= b[i]
    (down)    B[i] = B[p]   when i has one operand p, p has no other consumer, b[i] <= b[p]
Proof for (up): take an optimal plan with B[i] < B[j] and move i to B[j]. Precedence
still holds (B[p] <= B[i] < B[j]), no stage's compute changes, i's tensor is no longer
sent (-b[i]), and p's tensor may now be received by B[j] (+b[p] at most): no worse.
(down) is the mirror image (p's tensor is no longer sent, i's may be received by one
more stage), (source) is (up) without p. Folding i into its neighbour k makes one node
of the two: its compute is k's, its operands and consumers the union of theirs outside
the pair, its result the one that leaves the pair (k's for source and up, i's for down).
Repeated until nothing folds. A plan of the reduced problem expands to one of the
original with the same cut bytes, and the reduced optimum is the original optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

from rhino.search.pipeline.problem import StageProblem


@dataclass(frozen=True)
class Reduction:
    problem: StageProblem
    """The reduced problem (nodes in the original order, each named as its survivor)."""
    node_of: tuple[int, ...]
    """For each original instruction, its node in the reduced problem."""
    survivor: tuple[int, ...]
    """For each node of the reduced problem, the original instruction it is named after."""

    def expand(self, stage: tuple[int, ...]) -> tuple[int, ...]:
        """A plan of the original problem from one of the reduced problem."""
        return tuple(stage[k] for k in self.node_of)

    def restrict(self, stage: tuple[int, ...]) -> tuple[int, ...]:
        """A plan of the reduced problem from one of the original: each node takes its
        survivor's stage (its cut may differ from the original plan's)."""
        return tuple(stage[i] for i in self.survivor)


def reduce_stages(problem: StageProblem) -> Reduction:
    """Fold every instruction the module docstring allows; see there."""
    n = len(problem.names)
    operands: list[set[int]] = [set() for _ in range(n)]
    consumers = [set(cs) for cs in problem.consumers]
    for i, cs in enumerate(problem.consumers):
        for j in cs:
            operands[j].add(i)
    size = list(problem.bytes)
    into = list(range(n))  # union-find parent
    alive = [True] * n
    changed = True
    while changed:
        changed = False
        for i in range(n):
            if (
                alive[i]
                and problem.compute[i] == 0
                and _fold(i, operands, consumers, size, into, alive)
            ):
                changed = True
    return _reduced(problem, operands, consumers, size, into, alive)


def _fold(
    i: int,
    operands: list[set[int]],
    consumers: list[set[int]],
    size: list[int],
    into: list[int],
    alive: list[bool],
) -> bool:
    """Fold i into a neighbour if a rule allows; True when it did."""
    ops, cons = operands[i], consumers[i]
    if len(cons) == 1 and (not ops or (len(ops) == 1 and size[next(iter(ops))] <= size[i])):
        j = next(iter(cons))  # (source) or (up): i joins its consumer
        for p in ops:
            consumers[p].discard(i)
            consumers[p].add(j)
            operands[j].add(p)
        operands[j].discard(i)
    elif len(ops) == 1 and consumers[next(iter(ops))] == {i} and size[i] <= size[next(iter(ops))]:
        j = next(iter(ops))  # (down): i joins its operand, whose result is now i's
        consumers[j] = set(cons)
        for c in cons:
            operands[c].discard(i)
            operands[c].add(j)
        size[j] = size[i]
    else:
        return False
    into[i] = j
    alive[i] = False
    operands[i], consumers[i] = set(), set()
    return True


def _reduced(
    problem: StageProblem,
    operands: list[set[int]],
    consumers: list[set[int]],
    size: list[int],
    into: list[int],
    alive: list[bool],
) -> Reduction:
    kept = [i for i in range(len(alive)) if alive[i]]
    position = {i: k for k, i in enumerate(kept)}

    def root(i: int) -> int:
        while into[i] != i:
            i = into[i]
        return i

    reduced = StageProblem(
        tuple(problem.names[i] for i in kept),
        tuple(problem.compute[i] for i in kept),
        tuple(size[i] for i in kept),
        tuple(tuple(sorted(position[j] for j in consumers[i])) for i in kept),
        problem.stages,
        problem.epsilon,
    )
    return Reduction(reduced, tuple(position[root(i)] for i in range(len(alive))), tuple(kept))
