"""Pipeline schedules as data, and a simulator that times them.

A schedule is, per stage, the ordered list of its tasks (F or B, micro-batch). The
simulator runs every stage's list in order; a task starts when its stage is free and its
inputs have arrived:
    F(t, k)  after F(s, k) plus the transfer s -> t, for every stage s that sends to t
    B(s, k)  after F(s, k), and after B(t, k) plus the transfer t -> s for every stage t
             that sends gradients to s
After its last task a stage runs its optimizer update; the step ends when every stage
has. A stage holds the activations of micro-batch k from the start of F(s, k) to the end
of B(s, k); the peak count of such micro-batches times the stage's activation bytes per
micro-batch is its peak activation memory.

1F1B (PipeDream-flush, DAPPLE): stage s runs min(p - s - 1, m) forwards, then
alternates one forward and one backward, then the remaining backwards; its bubble is
(p - 1) / (m + p - 1) of the step when stages are equal, and stage 0 holds p
micro-batches at most. GPipe: all forwards, then all backwards; the same bubble, m
micro-batches held.
"""

from __future__ import annotations

from dataclasses import dataclass

from rhino.hlo.errors import RhinoError

Task = tuple[str, int]
"""("F" or "B", micro-batch)."""


def one_f_one_b(stages: int, microbatches: int) -> tuple[tuple[Task, ...], ...]:
    """The 1F1B order of every stage."""
    orders = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        tasks: list[Task] = [("F", k) for k in range(warmup)]
        for k in range(warmup, microbatches):
            tasks += [("F", k), ("B", k - warmup)]
        tasks += [("B", k) for k in range(microbatches - warmup, microbatches)]
        orders.append(tuple(tasks))
    return tuple(orders)


def gpipe(stages: int, microbatches: int) -> tuple[tuple[Task, ...], ...]:
    """All forwards, then all backwards, on every stage."""
    order = tuple([("F", k) for k in range(microbatches)] + [("B", k) for k in range(microbatches)])
    return (order,) * stages


SCHEDULES = {"1f1b": one_f_one_b, "gpipe": gpipe}


@dataclass(frozen=True)
class StageTimes:
    """What the simulator needs to know about the stages."""

    forward_s: tuple[float, ...]
    """Seconds of one micro-batch's forward, per stage."""
    backward_s: tuple[float, ...]
    """Seconds of one micro-batch's backward, per stage."""
    update_s: tuple[float, ...]
    """Seconds of the optimizer update (and gradient accumulation), per stage."""
    send_s: dict[tuple[int, int], float]
    """(from, to) -> seconds to send one micro-batch's tensors (forward: to > from;
    gradients: to < from)."""
    activation_bytes: tuple[float, ...]
    """Bytes one micro-batch's stored activations take on each stage."""


@dataclass(frozen=True)
class Event:
    stage: int
    kind: str
    """"F", "B" or "U" (the update)."""
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    schedule: str
    step_s: float
    events: tuple[Event, ...]
    peak_microbatches: tuple[int, ...]
    """Most micro-batches whose activations a stage holds at once."""
    peak_activation_bytes: tuple[float, ...]

    @property
    def busy_fraction(self) -> float:
        """Share of stage-time spent computing (1 - bubble)."""
        busy = sum(e.end_s - e.start_s for e in self.events)
        stages = len(self.peak_microbatches)
        return busy / (self.step_s * stages) if self.step_s > 0 else 1.0


def simulate(schedule: str, times: StageTimes, microbatches: int) -> Timeline:
    """Run the named schedule (a key of SCHEDULES) on `times`; see the module docstring."""
    p = len(times.forward_s)
    orders = SCHEDULES[schedule](p, microbatches)
    done: dict[tuple[int, str, int], float] = {}
    free = [0.0] * p
    position = [0] * p
    events: list[Event] = []
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for s in range(p):
            while position[s] < len(orders[s]):
                kind, k = orders[s][position[s]]
                ready = _ready(s, kind, k, times, done)
                if ready is None:
                    break
                start = max(free[s], ready)
                length = times.forward_s[s] if kind == "F" else times.backward_s[s]
                free[s] = done[(s, kind, k)] = start + length
                events.append(Event(s, kind, k, start, start + length))
                position[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RhinoError(f"schedule {schedule} deadlocks (a stage sends to an earlier one)")
    for s in range(p):
        events.append(Event(s, "U", -1, free[s], free[s] + times.update_s[s]))
    step = max(e.end_s for e in events)
    peaks = tuple(_peak_live(s, events) for s in range(p))
    return Timeline(
        schedule,
        step,
        tuple(events),
        peaks,
        tuple(n * a for n, a in zip(peaks, times.activation_bytes, strict=True)),
    )


def _ready(
    s: int, kind: str, k: int, times: StageTimes, done: dict[tuple[int, str, int], float]
) -> float | None:
    """When the inputs of task (s, kind, k) are there; None while some is not done."""
    ready = 0.0
    if kind == "B":
        if (s, "F", k) not in done:
            return None
        ready = done[(s, "F", k)]
    for (src, dst), seconds in times.send_s.items():
        if dst != s or (kind == "F") != (src < dst):
            continue
        finished = done.get((src, kind, k))
        if finished is None:
            return None
        ready = max(ready, finished + seconds)
    return ready


def _peak_live(stage: int, events: list[Event]) -> int:
    changes: list[tuple[float, int]] = []
    for e in events:
        if e.stage == stage and e.kind == "F":
            changes.append((e.start_s, 1))
        elif e.stage == stage and e.kind == "B":
            changes.append((e.end_s, -1))
    level = peak = 0
    for _, change in sorted(changes):  # at a tie, a release (-1) comes first
        level += change
        peak = max(peak, level)
    return peak
