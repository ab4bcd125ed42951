"""A window's optimum for O2's refinement (`rhino.search.spmd.merge`), here or on a
worker process that solves the pass's next windows ahead of it.

The refinement solves its windows one after another, each given the strategies of the
nodes around it, so each window's question depends on the answers before it. Most
answers change nothing around the next windows, though (after its first pass, a pass
mostly confirms the plan it has). `Ahead` gives a worker process, which holds a copy of
the core, a window further on in the pass with the strategies around it as they are
now, while this process solves the current one. When the pass reaches that window, the
worker's answer is taken only if the window still has the very same strategies around
it, and is then the answer this process would have found (the same problem, to the bit,
on the same solver): the plan does not depend on the worker, its speed, or whether it
started at all.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import signal
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from rhino.search.packing import Packed, pack, unpack
from rhino.search.problem import ProblemEdge, ProblemNode, ShardingProblem, SolveOptions
from rhino.search.spmd.identity import ByArray
from rhino.search.spmd.reduce import Matrices, Reduced, reduce_problem
from rhino.search.spmd.solver import solve_ilp
from rhino.search.workers import worker_context, workers_can_start

CLOSE_S = 0.2
"""Seconds the worker gets to exit when the refinement ends, before it is killed (what
it is solving then is of no use)."""
Inside = tuple[tuple[int, int, np.ndarray], ...]
"""A window's edges between its nodes: (position, position, matrix)."""
Outside = tuple[tuple[int, int, np.ndarray], ...]
"""A window's edges to nodes outside it: (position, outside node, matrix rows x its
strategies)."""


def window_answer(
    names: list[str],
    costs: list[np.ndarray],
    inside: Inside,
    outside: Outside,
    picks: tuple[int, ...],
    options: SolveOptions,
    far: Matrices | None = None,
) -> tuple[int, ...]:
    """The optimum of a window of core nodes (`names`, their `costs`, the `inside` edges)
    with the nodes around it at `picks` (one per `outside` edge; -1: not placed yet, the
    edge left out): a strategy per node, or CP-SAT's best within `options.work_limit`
    where the window's LP is fractional. `far` remembers which of the core's matrices
    are far from separable, and their largest values, window after window
    (`rhino.search.spmd.reduce`: testing them again took about 7% of T5-large's windows'
    time)."""
    charged = [c.copy() for c in costs]
    for (i, _, m), k in zip(outside, picks, strict=True):
        if k >= 0:
            charged[i] += m[:, k]
    sub = ShardingProblem(
        tuple(
            ProblemNode(name, _labels(len(c)), c, _nothing(len(c)))
            for name, c in zip(names, charged, strict=True)
        ),
        tuple(ProblemEdge(i, j, m) for i, j, m in inside),
    )
    # the window holds no memory: tie_broken(sub) would be sub with each cost + 0.0
    reduced = reduce_problem(sub, dominance=False, far=far)
    return solve_ilp(sub, options, reduced=reduced).choice


@functools.cache
def _labels(count: int) -> tuple[str, ...]:
    """A window node's strategy labels: its strategies' positions."""
    return tuple(map(str, range(count)))


@functools.cache
def _nothing(count: int) -> np.ndarray:
    """A window node's memory: none. One read-only array per strategy count (the
    reductions write new arrays, never into a problem's)."""
    zeros = np.zeros(count)
    zeros.flags.writeable = False
    return zeros


@dataclass(frozen=True)
class CoreCopy:
    """What a worker needs of a core to solve its windows: each core node's name and
    costs, and each edge's matrix."""

    names: dict[int, str]
    costs: dict[int, np.ndarray]
    edges: dict[tuple[int, int], np.ndarray]
    """(a, b) with a < b -> the matrix over a's (rows) and b's strategies."""
    flipped: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    """(a, b) -> edges[(a, b)].T, made once (`matrix`)."""

    def matrix(self, a: int, b: int) -> np.ndarray:
        """The edge matrix oriented a (rows) x b (columns): for b < a, one transposed
        view made once (the reductions remember separability by the matrix object)."""
        if a < b:
            return self.edges[(a, b)]
        flipped = self.flipped.get((b, a))
        if flipped is None:
            flipped = self.flipped[(b, a)] = self.edges[(b, a)].T
        return flipped

    @staticmethod
    def received(conn: Connection) -> CoreCopy:
        """The core `core_messages` sends."""
        names: dict[int, str] = {}
        costs: dict[int, np.ndarray] = {}
        edges: dict[tuple[int, int], np.ndarray] = {}
        while (message := conn.recv())[0] != "end":
            kind, body = message
            if kind == "names":
                names = body
            else:
                (costs if kind == "costs" else edges).update(_unpacked(body))
        return CoreCopy(names, costs, edges)


CHUNK_BYTES = 1 << 20
"""Bytes of arrays in one message of the core to the worker: the whole core pickled at
once (T5-large's: 23 MB, with copies on the way) would add 100 MB to the plan's peak."""


def core_messages(r: Reduced) -> Iterator[tuple[str, Any]]:
    """The core `r` as messages to a worker (`CoreCopy.received`): its nodes' names,
    then its costs and its edge matrices in runs of about CHUNK_BYTES, each run's arrays
    as one buffer (tens of thousands of small arrays pickle one by one in about half a
    second), then the end."""
    nodes = r.problem.nodes
    yield "names", {v: nodes[v].name for v in r.alive}
    kinds: tuple[tuple[str, dict[Any, np.ndarray]], ...] = (("costs", r.cost), ("edges", r.edges))
    for kind, arrays in kinds:
        run: list[tuple[Any, np.ndarray]] = []
        size = 0
        for key, array in arrays.items():
            run.append((key, array))
            size += array.nbytes
            if size >= CHUNK_BYTES:
                yield kind, _packed(run)
                run, size = [], 0
        if run:
            yield kind, _packed(run)
    yield "end", None


def _packed(arrays: list[tuple[Any, np.ndarray]]) -> tuple[list[Any], Packed, np.ndarray]:
    """Keyed arrays as their keys and the arrays packed (`rhino.search.packing`)."""
    packed, at = pack(array for _, array in arrays)
    return [key for key, _ in arrays], packed, at


def _unpacked(message: tuple[list[Any], Packed, np.ndarray]) -> dict[Any, np.ndarray]:
    keys, packed, at = message
    arrays = unpack(packed)
    return {key: arrays[i] for key, i in zip(keys, at.tolist(), strict=True)}


Task = tuple[
    tuple[int, ...],
    tuple[tuple[int, int], ...],
    tuple[tuple[int, int], ...],
    tuple[int, ...],
    SolveOptions,
]
"""A window as the worker gets it: its nodes in order, its inside edges as position
pairs, its outside edges as (position, outside node), the strategies of those outside
nodes, and the options of its solve."""


def _serve(conn: Connection) -> None:
    """The worker: the core (`CoreCopy.received`), then `window_answer` of each window of
    it that it is sent, until None or until this process's end of the pipe goes. Ctrl-C
    is this process's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    far: Matrices = ByArray()
    with contextlib.suppress(EOFError, OSError):
        core = CoreCopy.received(conn)
        while (task := conn.recv()) is not None:
            nodes, inside_at, outside_at, picks, options = task
            inside = tuple((i, j, core.matrix(nodes[i], nodes[j])) for i, j in inside_at)
            outside = tuple((i, w, core.matrix(nodes[i], w)) for i, w in outside_at)
            names = [core.names[v] for v in nodes]
            costs = [core.costs[v] for v in nodes]
            try:
                found: tuple[int, ...] | None = window_answer(
                    names, costs, inside, outside, picks, options, far
                )
            except Exception:  # noqa: BLE001 - solved again there, where it is reported
                found = None
            conn.send(found)


class Ahead:
    """A worker process solving windows ahead of the refinement (see module doc). Windows
    go to it through a pipe, their answers come back in the order given; an answer is
    taken only for the window and the strategies around it it was given with."""

    def __init__(self, r: Reduced) -> None:
        ctx = worker_context(__name__)
        self.conn, there = ctx.Pipe()
        self.process: BaseProcess | None = None
        """The worker, once started (until then, and after `close`, nothing is given)."""
        self.closed = False
        self.starting = True
        """Is the worker still starting?"""
        self.lock = threading.Lock()
        # started on a thread: the fork server may first have to start and import rhino
        # (a second or so), and the refinement goes on here meanwhile
        worker = ctx.Process(target=_serve, args=(there,), daemon=True)
        threading.Thread(target=self._start, args=(worker, there, r), daemon=True).start()
        self.sent: deque[tuple[tuple[int, ...], tuple[int, ...]]] = deque()
        """Windows given whose answers have not come back: (nodes, picks)."""
        self.answers: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, ...] | None] = {}
        """Answers back, not taken yet."""
        self.taken = 0
        """Answers taken."""

    def _start(self, worker: BaseProcess, there: Connection, r: Reduced) -> None:
        try:
            worker.start()
        except (OSError, RuntimeError):  # no worker: everything is solved here
            self.starting = False
            return
        finally:
            there.close()
        try:  # the core once; then each window as indices
            for message in core_messages(r):
                if self.closed:
                    break
                self.conn.send(message)
        except OSError:  # it died (a script run again there): everything is solved here
            self.closed = True
        with self.lock:
            self.starting = False
            if not self.closed:
                self.process = worker
                return
        _stop(worker, self.conn)

    @staticmethod
    def wanted(options: SolveOptions, solved: int) -> bool:
        """Does a refinement get a worker, its first plans having solved `solved`
        windows? Where there are threads to spare (this process is not a worker itself:
        those of --devices and of the combined search already keep the cores busy), a
        worker can start (`workers_can_start`) and there are many windows to solve
        (`Tuning.ahead_windows`)."""
        return (
            options.threads > 1
            and solved >= options.tuning.ahead_windows
            and multiprocessing.parent_process() is None
            and workers_can_start()
        )

    @property
    def working(self) -> int:
        """Windows given and not back (0 where the worker is gone)."""
        return len(self.sent) if self.process is not None else 0

    def has(self, nodes: tuple[int, ...], picks: tuple[int, ...]) -> bool:
        """Was this window given with these picks around it, and not taken?"""
        return (nodes, picks) in self.answers or (nodes, picks) in self.sent

    def back(self, nodes: tuple[int, ...], picks: tuple[int, ...]) -> bool:
        """Is the worker's answer for this window with these picks back (or will it never
        be: the worker is gone)?"""
        self.poll()
        return (nodes, picks) in self.answers or self.process is None

    def poll(self) -> None:
        """Receive the answers that are back."""
        while self.process is not None and self.sent and self.conn.poll():
            self._receive()

    def give(
        self,
        nodes: tuple[int, ...],
        inside: Inside,
        outside: Outside,
        picks: tuple[int, ...],
        options: SolveOptions,
    ) -> None:
        """Have the worker solve this window (nodes in the window's order) with `picks`
        around it."""
        if self.process is None:
            return
        task: Task = (
            nodes,
            tuple((i, j) for i, j, _ in inside),
            tuple((i, w) for i, w, _ in outside),
            picks,
            options,
        )
        try:
            self.conn.send(task)
        except OSError:
            self.close()
            return
        self.sent.append((nodes, picks))

    def take(self, nodes: tuple[int, ...], picks: tuple[int, ...]) -> tuple[int, ...] | None:
        """The worker's answer for this window with `picks` around it, waiting for it if
        it is on its way; None where it was not given so (what was given of this window
        is then dropped) or the worker is gone."""
        key = (nodes, picks)
        while key not in self.answers and key in self.sent and self.process is not None:
            self._receive()
        found = self.answers.pop(key, None)
        for stale in [k for k in self.answers if k[0] == nodes]:
            del self.answers[stale]
        if found is not None:
            self.taken += 1
        return found

    def _receive(self) -> None:
        try:
            found = self.conn.recv()
        except (EOFError, OSError):  # the worker died (e.g. a script run again there)
            self.close()
            return
        self.answers[self.sent.popleft()] = found

    def close(self) -> None:
        """Stop the worker (or have it stopped once it has started)."""
        with self.lock:
            self.closed = True
            process, self.process = self.process, None
        if process is not None:
            _stop(process, self.conn)
        self.sent.clear()
        self.answers.clear()


def _stop(worker: BaseProcess, conn: Connection) -> None:
    """Ask the worker to stop; kill it where it does not within CLOSE_S."""
    with contextlib.suppress(OSError):
        conn.send(None)
    worker.join(CLOSE_S)
    if worker.is_alive():
        worker.kill()
        worker.join()
    conn.close()
