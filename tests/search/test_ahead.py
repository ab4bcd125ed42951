"""O2's worker process solving the refinement's windows ahead of it
(`rhino.search.spmd.ahead`): the plan is the one made without it, to the bit, whether
the worker answers, dies, or never starts."""

from __future__ import annotations

import dataclasses
import gc
import pickle
import time

import numpy as np
import pytest

from rhino.search.problem import ShardingProblem, Solution, Tuning
from rhino.search.spmd import ahead, merge
from rhino.search.spmd.identity import ByArray
from rhino.search.spmd.reduce import Matrices, reduce_problem
from rhino.search.spmd.solver import tie_broken
from tests.search.test_merge import BY_SEGMENTS, series_parallel

WITH = dataclasses.replace(
    BY_SEGMENTS,
    threads=2,
    tuning=dataclasses.replace(BY_SEGMENTS.tuning, ahead_windows=0),
)
"""Level 3 with small segments, a worker ahead of every refinement."""
WITHOUT = dataclasses.replace(WITH, tuning=dataclasses.replace(WITH.tuning, ahead_windows=1 << 62))


def solved_with(
    problem: ShardingProblem, monkeypatch: pytest.MonkeyPatch, kind: type[ahead.Ahead]
) -> tuple[Solution, list[ahead.Ahead]]:
    """O2's plan with workers of `kind`, and those workers."""
    made: list[ahead.Ahead] = []

    class Recorded(kind):  # type: ignore[valid-type, misc]
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*args, **kwargs)
            made.append(self)
            # a small problem's refinement may end before the worker starts on a busy
            # machine: here it waits for it (or for its failing to start)
            deadline = time.monotonic() + 60
            while self.process is None and self.starting and time.monotonic() < deadline:
                time.sleep(0.01)

    monkeypatch.setattr(merge, "Ahead", Recorded)
    return merge.solve_merged(problem, WITH), made


@pytest.mark.parametrize("seed", [0, 1])
def test_a_worker_ahead_leaves_the_plan_as_it_is(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = series_parallel(seed, blocks=40)
    without = merge.solve_merged(problem, WITHOUT)
    found, made = solved_with(problem, monkeypatch, ahead.Ahead)
    assert found.choice == without.choice
    assert found.objective == without.objective
    assert found.stats.sizes == without.stats.sizes  # the same windows solved, reused
    assert len(made) == 1 and made[0].taken > 0  # the worker did answer windows
    assert made[0].process is None  # stopped when the refinement ended


class Dying(ahead.Ahead):
    """A worker killed after it was given its third window."""

    def give(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().give(*args, **kwargs)
        if len(self.sent) + len(self.answers) + self.taken >= 3 and self.process is not None:
            self.process.kill()


class Unborn(ahead.Ahead):
    """A worker that cannot start (as where it cannot import the caller's script)."""

    def _start(self, worker, there, r) -> None:  # type: ignore[no-untyped-def]
        there.close()
        self.starting = False


@pytest.mark.parametrize("kind", [Dying, Unborn])
def test_a_worker_that_dies_or_never_starts_leaves_the_plan_as_it_is(
    kind: type[ahead.Ahead], monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = series_parallel(0, blocks=40)
    without = merge.solve_merged(problem, WITHOUT)
    found, made = solved_with(problem, monkeypatch, kind)
    assert found.choice == without.choice
    assert found.stats.sizes == without.stats.sizes
    assert len(made) == 1 and made[0].process is None
    assert made[0].taken < 3


class Pickled:
    """The two ends of a pipe in one process: what is sent is pickled, and unpickled
    when received."""

    def __init__(self) -> None:
        self.queue: list[bytes] = []

    def send(self, message: object) -> None:
        self.queue.append(pickle.dumps(message))

    def recv(self) -> object:
        return pickle.loads(self.queue.pop(0))


@pytest.mark.parametrize("chunk", [1, 1 << 20])
def test_the_core_goes_to_the_worker_to_the_bit(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ahead, "CHUNK_BYTES", chunk)  # one array a message, or all in one
    problem = series_parallel(2, blocks=8)
    reduced = reduce_problem(tie_broken(problem), dominance=False)
    assert reduced.alive and reduced.edges
    pipe = Pickled()
    for message in ahead.core_messages(reduced):
        pipe.send(message)
    sent = ahead.CoreCopy.received(pipe)  # type: ignore[arg-type]
    assert not pipe.queue
    assert sent.names == {v: problem.nodes[v].name for v in reduced.alive}
    for mine, theirs in ((reduced.cost, sent.costs), (reduced.edges, sent.edges)):
        assert list(mine) == list(theirs)
        for key, array in mine.items():
            assert theirs[key].dtype == array.dtype and theirs[key].shape == array.shape
            assert theirs[key].tobytes() == array.tobytes()
    a, b = next(iter(reduced.edges))
    assert np.array_equal(sent.matrix(b, a), reduced.edges[(a, b)].T)
    assert sent.matrix(b, a) is sent.matrix(b, a)  # one view: remembered by the object


def test_a_worker_is_started_only_where_it_pays_and_cores_are_spare() -> None:
    options = dataclasses.replace(WITH, tuning=Tuning(ahead_windows=100))
    assert ahead.Ahead.wanted(options, 100)
    assert not ahead.Ahead.wanted(options, 99)
    assert not ahead.Ahead.wanted(dataclasses.replace(options, threads=1), 100)


def test_what_is_found_of_an_array_is_remembered_while_it_lives() -> None:
    memo: ByArray[str] = ByArray()
    a = np.ones((2, 3))
    memo.put(a, "a")
    assert memo.get(a) == "a"
    assert memo.get(a.copy()) is None  # by the object, not its content
    assert memo.get(a.T) is None  # a view is another object
    del a
    gc.collect()
    assert len(memo) == 0  # gone with its array


def test_windows_solved_with_what_earlier_ones_found_are_solved_alike() -> None:
    """The reductions' separability tests taken from earlier windows give each window
    the answer it gets alone."""
    problem = series_parallel(3, blocks=40)
    search = merge._SegmentSearch(
        problem, reduce_problem(tie_broken(problem), dominance=False), WITHOUT, {}
    )
    segments = merge._segments(search.r, sorted(search.r.alive), merge.critical_nodes(problem), 12)
    search.start("forward", segments)
    far: Matrices = ByArray()
    checked = 0
    for nodes in segments + search.coupled(segments, 1):
        window = search._window(nodes)
        picks = search._picks(window)
        names = [problem.nodes[v].name for v in window.nodes]
        costs = [search.r.cost[v] for v in window.nodes]
        args = (names, costs, window.inside, window.outside, picks, WITHOUT)
        assert ahead.window_answer(*args, far) == ahead.window_answer(*args)
        checked += 1
    assert checked > 10 and len(far)
