"""The search over combined collectives (`rhino.search.spmd.combine.search_groups`)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import pytest

from rhino.search.spmd.combine import MAX_GROUP_PLANS, search_groups
from rhino.search.spmd.comm import GroupKey
from rhino.search.spmd.plan import Plan, PlannedCollective

KEYS: list[GroupKey] = [("all-reduce", (0,)), ("all-gather", (1,)), ("reduce-scatter", (0, 1))]


@dataclass(frozen=True)
class FakePlan:
    """What search_groups reads of a plan."""

    objective_s: float
    combined_latency_s: float
    collectives: tuple[PlannedCollective, ...]


def fake_planner(
    seed: int, jitter: bool
) -> tuple[object, list[tuple[frozenset[GroupKey], frozenset[GroupKey] | None]]]:
    """A plan per closed set, drawn from the seed (the same set, the same plan), taking a
    random while when `jitter` so that threads finish out of order; and the calls made."""
    calls: list[tuple[frozenset[GroupKey], frozenset[GroupKey] | None]] = []
    lock = threading.Lock()

    def plan_with(closed: frozenset[GroupKey], parent: frozenset[GroupKey] | None) -> Plan:
        rng = np.random.default_rng([seed, *sorted(KEYS.index(k) for k in closed)])
        used = [k for k in KEYS if k not in closed and rng.random() < 0.7]
        with lock:
            calls.append((closed, parent))
        collectives = tuple(
            PlannedCollective(kind, axes, 1.0, 1e-6, "x", group=g)
            for g, (kind, axes) in enumerate(used)
        )
        found = FakePlan(float(rng.uniform(1.0, 2.0)), 0.5 if used else 0.0, collectives)
        if parent == closed:  # a plan finished (`search_groups(finish=True)`): a bit cheaper
            found = FakePlan(found.objective_s - 0.01, found.combined_latency_s, collectives)
        if jitter:
            time.sleep(float(rng.random()) * 0.02)
        return found  # type: ignore[return-value]

    return plan_with, calls


@pytest.mark.parametrize("seed", range(20))
def test_the_answer_does_not_depend_on_the_workers(seed: int) -> None:
    first_one, calls_one = fake_planner(seed, jitter=False)
    first_two, calls_two = fake_planner(seed, jitter=True)
    start = first_one(frozenset(), None)  # type: ignore[operator]
    one = search_groups(start, first_one, lambda: 1.0, workers=1)  # type: ignore[arg-type]
    two = search_groups(start, first_two, lambda: 1.0, workers=2)  # type: ignore[arg-type]
    assert one == two
    assert sorted(calls_one[1:], key=str) == sorted(calls_two, key=str)
    assert one[2] == len(calls_two) <= MAX_GROUP_PLANS
    for closed, parent in calls_two:  # every trial varies its round's best by one key
        assert parent is not None and parent < closed and len(closed - parent) == 1


@pytest.mark.parametrize("seed", range(20))
def test_a_round_started_on_a_guess_gives_the_answer_made_one_by_one(seed: int) -> None:
    """With `speculate`, workers idle at a round's end start the next round on the best
    plan the round has so far: the answer and the plan count are those made one by one,
    every plan one by one makes is made, and every other plan varies some plan by one
    key."""
    first_one, calls_one = fake_planner(seed, jitter=False)
    first_two, calls_two = fake_planner(seed, jitter=True)
    start = first_one(frozenset(), None)  # type: ignore[operator]
    one = search_groups(start, first_one, lambda: 1.0, workers=1)  # type: ignore[arg-type]
    two = search_groups(start, first_two, lambda: 1.0, workers=2, speculate=True)  # type: ignore[arg-type]
    assert one == two
    assert set(calls_one[1:]) <= set(calls_two)
    assert len(set(calls_two)) == len(calls_two)  # no plan made twice
    for closed, parent in calls_two:
        assert parent is not None and parent < closed and len(closed - parent) == 1


@pytest.mark.parametrize("seed", range(20))
def test_the_plan_chosen_is_finished_as_one_by_one(seed: int) -> None:
    """With `finish`, the plan chosen (where it is not the first) is made once more, last,
    and kept where no worse: the answer and the plan count are those made one by one,
    also where a worker idle at a round's end started it on a guess."""
    first_one, calls_one = fake_planner(seed, jitter=False)
    first_two, calls_two = fake_planner(seed, jitter=True)
    start = first_one(frozenset(), None)  # type: ignore[operator]
    one = search_groups(start, first_one, lambda: 1.0, workers=1, finish=True)  # type: ignore[arg-type]
    two = search_groups(start, first_two, lambda: 1.0, workers=2, speculate=True, finish=True)  # type: ignore[arg-type]
    assert one == two
    assert set(calls_one[1:]) <= set(calls_two)
    assert len(set(calls_two)) == len(calls_two)  # no plan made twice
    best, closed, made = one
    plain = search_groups(start, fake_planner(seed, jitter=False)[0], lambda: 1.0)  # type: ignore[arg-type]
    if closed:
        assert calls_one[-1] == (closed, closed) and made == plain[2] + 1
        assert best.objective_s == pytest.approx(plain[0].objective_s - 0.01)
    else:
        assert plain == one and all(parent != trial for trial, parent in calls_two)


def test_a_guess_is_made_while_the_round_ends() -> None:
    """A round of three plans on two workers: the two first done, the third still being
    made, the next round's first plan starts on the better of the two (its parent)."""
    made: list[tuple[frozenset[GroupKey], frozenset[GroupKey] | None]] = []
    third_done = threading.Event()
    waited: list[bool] = []
    lock = threading.Lock()

    def plan_with(closed: frozenset[GroupKey], parent: frozenset[GroupKey] | None) -> FakePlan:
        with lock:
            made.append((closed, parent))
        if closed == frozenset({KEYS[2]}):
            waited.append(third_done.wait(5.0))  # it ends once the guess has started
        if len(closed) == 2:
            third_done.set()
        used = [k for k in KEYS if k not in closed]
        collectives = tuple(
            PlannedCollective(kind, axes, 1.0, 1e-6, "x", group=g)
            for g, (kind, axes) in enumerate(used)
        )
        cheaper = {frozenset({KEYS[0]}): 1.0, frozenset({KEYS[1]}): 1.2}
        return FakePlan(cheaper.get(closed, 1.5) - 0.01 * len(closed), 0.5, collectives)

    start = plan_with(frozenset(), None)
    best, closed, count = search_groups(start, plan_with, lambda: 1.0, workers=2, speculate=True)  # type: ignore[arg-type]
    assert waited == [True]  # the guess started before the round's last plan ended
    assert (frozenset({KEYS[0], KEYS[1]}), frozenset({KEYS[0]})) in made
    assert closed >= {KEYS[0]}
    assert count <= MAX_GROUP_PLANS


def test_no_plan_is_made_once_the_time_is_out() -> None:
    plan_with, calls = fake_planner(3, jitter=False)
    start = plan_with(frozenset(), None)  # type: ignore[operator]
    best, closed, made = search_groups(start, plan_with, lambda: 0.0, workers=2)  # type: ignore[arg-type]
    assert (best, closed, made) == (start, frozenset(), 0)
    assert len(calls) == 1
