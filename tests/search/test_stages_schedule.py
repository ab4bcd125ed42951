"""1F1B and GPipe as task lists, timed by the simulator."""

from __future__ import annotations

import pytest

from rhino.hlo.errors import RhinoError
from rhino.search.pipeline.schedule import StageTimes, gpipe, one_f_one_b, simulate


def equal_stages(p: int, f: float = 1.0, b: float = 2.0, send: float = 0.0) -> StageTimes:
    sends = {(s, s + 1): send for s in range(p - 1)} | {(s + 1, s): send for s in range(p - 1)}
    return StageTimes((f,) * p, (b,) * p, (0.0,) * p, sends, (10.0,) * p)


@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 4), (4, 8), (4, 2), (8, 16)])
def test_equal_stages_take_m_plus_p_minus_1_slots(p: int, m: int) -> None:
    for schedule in ("1f1b", "gpipe"):
        timeline = simulate(schedule, equal_stages(p), m)
        assert timeline.step_s == pytest.approx((m + p - 1) * 3.0)
        assert 1 - timeline.busy_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_1f1b_holds_at_most_p_microbatches_gpipe_all_of_them() -> None:
    one = simulate("1f1b", equal_stages(4), 8)
    assert one.peak_microbatches == (4, 3, 2, 1)
    assert one.peak_activation_bytes == (40.0, 30.0, 20.0, 10.0)
    assert simulate("gpipe", equal_stages(4), 8).peak_microbatches == (8, 8, 8, 8)


def test_every_task_runs_once_after_its_inputs() -> None:
    timeline = simulate("1f1b", equal_stages(3, send=0.5), 4)
    end = {(e.stage, e.kind, e.microbatch): e.end_s for e in timeline.events}
    start = {(e.stage, e.kind, e.microbatch): e.start_s for e in timeline.events}
    assert len(end) == 3 * 4 * 2 + 3
    for s in range(3):
        for k in range(4):
            if s > 0:
                assert start[(s, "F", k)] >= end[(s - 1, "F", k)] + 0.5
            if s < 2:
                assert start[(s, "B", k)] >= end[(s + 1, "B", k)] + 0.5
            assert start[(s, "B", k)] >= end[(s, "F", k)]


def test_orders_cover_every_microbatch_forward_then_backward() -> None:
    for orders in (one_f_one_b(4, 6), gpipe(4, 6)):
        for order in orders:
            assert sorted(order) == sorted(
                [("F", k) for k in range(6)] + [("B", k) for k in range(6)]
            )
            assert all(order.index(("F", k)) < order.index(("B", k)) for k in range(6))


def test_without_a_gradient_edge_stage_0_does_not_wait_for_stage_1() -> None:
    linked = StageTimes((1.0, 1.0), (1.0, 1.0), (0.0, 0.0), {(0, 1): 0.0, (1, 0): 0.0}, (0.0, 0.0))
    assert simulate("gpipe", linked, 2).step_s == pytest.approx(6.0)
    forward_only = StageTimes((1.0, 1.0), (1.0, 1.0), (0.0, 0.0), {(0, 1): 0.0}, (0.0, 0.0))
    assert simulate("gpipe", forward_only, 2).step_s == pytest.approx(5.0)


def test_a_task_waiting_for_itself_is_reported_not_looped() -> None:
    with pytest.raises(RhinoError, match="deadlocks"):
        simulate("1f1b", StageTimes((1.0,), (1.0,), (0.0,), {(0, 0): 0.0}, (0.0,)), 1)


def test_sends_that_outweigh_compute_slow_1f1b_not_gpipe() -> None:
    """Why `rhino pipeline` can simulate GPipe faster than 1F1B: with at most p
    micro-batches in flight, 1F1B waits for each round trip of sends; GPipe streams its
    forwards. Free sends: the two take the same time."""
    p, m = 4, 8
    free = [simulate(s, equal_stages(p, 0.1, 0.2), m).step_s for s in ("1f1b", "gpipe")]
    assert free[0] == pytest.approx(free[1])
    slow = [simulate(s, equal_stages(p, 0.1, 0.2, send=1.0), m).step_s for s in ("1f1b", "gpipe")]
    assert slow[0] > 1.5 * slow[1]
