"""The task graph and static schedules of a stage plan, as data (no device runs): the
F/B order is the simulator's, every task is scheduled once, every schedule can run
(each task's inputs are made by tasks that come earlier in some stage's list) and its
sends can be made in one order all processes share, and the bytes sent between stages
are the ones the stage plan predicts."""

from __future__ import annotations

import pytest

from rhino.hlo.errors import ConfigError
from rhino.runtime.pipeline.programs import StagePrograms, stage_programs
from rhino.runtime.pipeline.tasks import run_order, schedule, task_graph, transfer_order
from rhino.search.pipeline.schedule import SCHEDULES
from tests.runtime.stage_plans import example, stage_plan


@pytest.fixture(scope="module")
def programs() -> StagePrograms:
    return stage_programs(example("gpt_tiny"), stage_plan("gpt_tiny", 4), 4)


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
def test_schedule_follows_the_simulator_and_can_run(programs: StagePrograms, name: str) -> None:
    graph = task_graph(programs)
    table = schedule(programs, name)
    orders = SCHEDULES[name](4, 4)
    for s, tasks in enumerate(table.actions):
        assert [(t.kind, t.microbatch) for t in tasks if t.kind in "FB"] == list(orders[s])
        assert tasks[-1].kind.startswith("U")  # the updates last, a level after another
        for before, after in zip(tasks, tasks[1:], strict=False):
            if after.kind.startswith("A"):  # an accumulation right after its task
                assert (before.kind, before.microbatch) == (after.kind[-1], after.microbatch)
    scheduled = [t for tasks in table.actions for t in tasks]
    assert sorted(scheduled) == list(graph.tasks)
    order = run_order(programs, graph, table)  # raises when a stage would wait forever
    assert sorted(order) == list(graph.tasks)
    sends = transfer_order(programs, graph, table)
    assert sorted(sends, key=repr) == sorted(graph.transfers_between_stages(), key=repr)
    position = {task: i for i, task in enumerate(order)}
    finished = [position[t.after] for t in sends if t.after is not None]
    assert finished == sorted(finished)


def test_bytes_between_stages_are_the_plans(programs: StagePrograms) -> None:
    graph = task_graph(programs)
    assert graph.sent_bytes() == stage_plan("gpt_tiny", 4).sent_bytes
    per_microbatch = [t for t in graph.transfers if t.microbatch >= 0]
    assert per_microbatch and {t.microbatch for t in per_microbatch} == {0, 1, 2, 3}
    assert all(b > 0 for b in graph.activation_bytes)


def test_gradients_are_accumulated_and_the_update_reads_the_sums(programs: StagePrograms) -> None:
    for s in range(4):
        summed = programs.accumulated((s, "B"))
        assert summed, f"stage {s} accumulates no gradient"
        update = programs.programs[(s, "U")]
        assert set(summed) & set(update.inputs)
    # the mean loss divides the micro-batches' accumulated sum, once per step
    loss = programs.values[programs.outputs[0]]
    assert loss.producer is not None and loss.producer[1] == "U"
    assert not loss.per_microbatch
    inputs = programs.programs[loss.producer].inputs
    assert any(programs.values[v].accumulate for v in inputs)


def test_unknown_schedule_is_refused(programs: StagePrograms) -> None:
    with pytest.raises(ConfigError, match="unknown schedule 'zb'"):
        schedule(programs, "zb")
