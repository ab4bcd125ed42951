"""What the O3 search finds on models whose best plan is known (issue 3's checks)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rhino.hlo.parser import parse_file
from rhino.search.cluster import load_cluster, load_cluster_text
from rhino.search.mesh import parse_mesh
from rhino.search.spmd.plan import Plan
from rhino.search.spmd.planner import PlanRequest, make_plan
from rhino.search.spmd.spec import parse_spec
from tests.hlo.corpus import ROOT

DATA = ROOT / "tests" / "data"


def plan_for(path: Path, mesh: str, cluster=None, **kw) -> Plan:
    return make_plan(
        parse_file(path), PlanRequest(parse_mesh(mesh), cluster or load_cluster("m8"), **kw)
    )


def layout(plan: Plan, name: str) -> str:
    inst = plan.instruction(name)
    assert inst is not None, name
    return inst.outs[0]


def test_small_batch_big_weights_comes_out_megatron() -> None:
    plan = plan_for(DATA / "mlp_megatron.hlo", "1x4")
    assert layout(plan, "params_0___w__.1") == "RS1"  # first weight split by columns
    assert layout(plan, "params_1___w__.1") == "RS0"  # second by rows
    # the forward pass reduces the second dot's partial sums, and moves nothing else:
    # an all-reduce, or a reduce-scatter with its all-gather (the same bytes)
    act = 8 * 256 * 4
    forward = [c for c in plan.collectives if c.instruction in ("dot_general.6", "sub.7")]
    assert {c.kind for c in forward} <= {"all-reduce", "reduce-scatter", "all-gather"}
    assert sum(c.nbytes for c in forward) <= 2 * act
    assert all(c.nbytes <= act for c in plan.collectives)  # no weight-sized traffic


def test_big_batch_small_weights_comes_out_data_parallel() -> None:
    plan = plan_for(DATA / "mlp_data_parallel.hlo", "1x4")
    for data in ("batch__x__.1", "batch__y__.1"):
        assert layout(plan, data) == "RS0"
    for dot in ("dot_general.5", "dot_general.6"):  # forward dots split on the batch
        assert layout(plan, dot) == "RS0"
    weight_bytes = 256 * 256 * 4
    assert all(c.nbytes <= weight_bytes for c in plan.collectives)  # only weight-sized traffic


CHEAP_AXIS0 = """
name: cheap-axis-0
devices_per_node: 4
device: {memory: 32 GiB, memory_bandwidth: 800 GB/s, flops: {f32: 14 TFLOP/s}}
links:
  intra_node: {bandwidth: 100 GB/s, latency: 2 us}
  inter_node: {bandwidth: 100 Gb/s, latency: 5 us}
meshes:
  "2x2": [{bandwidth: 100 GB/s, latency: 2 us}, {bandwidth: 1 GB/s, latency: 2 us}]
"""


def test_all_reduce_goes_on_the_cheap_axis() -> None:
    cluster = load_cluster_text(CHEAP_AXIS0, "cheap.yaml")
    plan = plan_for(DATA / "mlp_megatron.hlo", "2x2", cluster)
    volume = {
        axes: sum(c.nbytes for c in plan.collectives if c.axes == axes)
        for axes in ((0,), (1,), (0, 1))
    }
    assert volume[(0,)] > 0, "tensor parallelism needs some collective"
    # the big reductions use the cheap axis (the loss, a scalar summed over a batch split
    # on both axes, may be all-reduced over both)
    assert volume[(1,)] + volume[(0, 1)] < 0.05 * volume[(0,)], volume
    biggest = max(plan.collectives, key=lambda c: c.nbytes)
    assert biggest.axes == (0,) and biggest.kind in ("all-reduce", "reduce-scatter")


def test_plan_round_trips_through_json(tmp_path: Path) -> None:
    plan = plan_for(DATA / "mlp_step.hlo", "1x4")
    path = tmp_path / "plan.json"
    plan.write(path)
    assert Plan.read(path) == plan
    assert plan.state == 2  # both weights come back updated


def test_same_plan_twice() -> None:
    a = plan_for(DATA / "mlp_megatron.hlo", "1x4")
    b = plan_for(DATA / "mlp_megatron.hlo", "1x4")
    assert [i.strategy for i in a.instructions] == [i.strategy for i in b.instructions]


@pytest.mark.parametrize("name", ["params_0___w__.1=RS0", "params_0___w__.1=RR"])
def test_pins_are_honoured(name: str) -> None:
    from rhino.search.spmd.spec import parse_spec

    inst, spec = name.split("=")
    plan = plan_for(DATA / "mlp_megatron.hlo", "1x4", pins=((inst, parse_spec(spec)),))
    assert layout(plan, inst) == spec


def test_reshape_merging_a_split_dim_gets_a_stride_and_saves_communication() -> None:
    from rhino.search.spmd.spec import parse_spec

    pins = (("p", parse_spec("RS1")), ("out", parse_spec("RS1")))
    strided = plan_for(DATA / "strided_reshape.hlo", "1x4", pins=pins)
    maximal = plan_for(DATA / "strided_reshape.hlo", "1x4", pins=pins, strides=False)
    assert (
        layout(strided, "r") == "RS0[s=1]"
    )  # dims (8, 4) merged: units of 1 row dealt round-robin
    assert layout(strided, "x") == "RS0[s=1]"
    assert strided.comm_s == 0 and not strided.collectives
    assert maximal.comm_s > 0
    assert strided.objective_s < maximal.objective_s
    assert strided.instruction("r").sharding is None  # XLA has no form for it (see rhino run)


SLOW_LINKS = """
name: slow
devices_per_node: 1
device: {memory: 32 GiB, memory_bandwidth: 800 GB/s, flops: {f32: 14 TFLOP/s}}
links:
  intra_node: {bandwidth: 100 GB/s, latency: 2 us}
  inter_node: {bandwidth: 1 Gb/s, latency: 50 us}
"""


@pytest.mark.parametrize("mode", ["exact", "largest"])
def test_a_budget_below_the_unconstrained_peak_is_met(mode: str) -> None:
    slow = load_cluster_text(
        SLOW_LINKS, "slow.yaml"
    )  # communication so dear that all is replicated
    free = plan_for(DATA / "mlp_zero.hlo", "1x4", slow, budget_bytes=None)
    assert all(i.outs[0] == "RR" for i in free.instructions if i.opcode == "parameter")
    budget = 20e6  # below the replicated peak (~43 MB), above the smallest possible (~10.2 MiB)
    assert free.peak_memory_bytes > budget
    plan = plan_for(DATA / "mlp_zero.hlo", "1x4", slow, budget_bytes=budget, memory_mode=mode)
    assert plan.peak_memory_bytes <= budget
    assert plan.objective_s >= free.objective_s
    assert plan.instruction("params_0___w__.1").outs[0] != "RR"  # the largest weight is sharded


def test_an_impossible_budget_says_what_would_work() -> None:
    from rhino.hlo.errors import InfeasibleError

    with pytest.raises(
        InfeasibleError, match=r"smallest possible peak is .* set `budget_bytes` to"
    ):
        plan_for(DATA / "mlp_zero.hlo", "1x4", budget_bytes=1e6)


def test_scanned_gpt_plans_with_its_loop_carries() -> None:
    from rhino.search.problem import SolveOptions

    # the hint gives the solver a plan at once; 20 s bounds the test, optimal or not
    plan = plan_for(
        ROOT / "examples" / "gpt_scan_tiny.hlo", "1x2", solve=SolveOptions(time_limit_s=20)
    )
    names = {i.name for i in plan.instructions}
    assert not any("#" in n for n in names)  # carried values are decisions, not instructions
    # ... reported with their layouts: one per carried leaf of the scan's while loop
    assert plan.carried and all("#" in k and v for k, v in plan.carried.items())
    # shared conversions; the latency of combined collectives is the plan's, not the ILP's
    assert plan.objective_s <= (plan.solver.objective_s + plan.combined_latency_s) * (1 + 1e-9)


def test_gpt_block_shards_attention_by_heads_and_the_mlp_megatron_style() -> None:
    plan = plan_for(DATA / "gpt_block.hlo", "1x8")  # batch 2: data parallelism cannot use 8 devices
    scores = [i for i in plan.instructions if i.opcode == "dot" and i.shape.startswith("f32[2,16,")]
    assert scores and all(i.outs[0] == "RS1" for i in scores)  # dim 1 = the 16 heads
    prefix = "params__layers___0___"
    for name in ("attn____wq__.1", "attn____wk__.1", "attn____wv__.1", "mlp____fc1____w__.1"):
        assert layout(plan, prefix + name) == "RS1"  # column split
    assert layout(plan, prefix + "mlp____fc2____w__.1") == "RS0"  # row split
    # Megatron row-splits the attention's output projection too; rhino may do better:
    # its gradient's all-reduce is combined with the others, the activations' is not
    pins = ((prefix + "attn____wo__.1", parse_spec("RS0", 2)),)
    megatron = plan_for(DATA / "gpt_block.hlo", "1x8", pins=pins)
    assert plan.objective_s <= megatron.objective_s


def test_state_paired_by_shape_is_said_and_an_alias_is_taken_as_given() -> None:
    from rhino.hlo.parser import parse_module
    from rhino.search.spmd.builder import build_graph, state_pairs

    text = (DATA / "mlp_step.hlo").read_text()
    guessed = build_graph(parse_module(text, "step.hlo"), parse_mesh("1x2"), load_cluster("m8"))
    assert any("no input_output_alias" in n for n in guessed.notes), guessed.notes
    assert not any("no input_output_alias" in w for w in guessed.warnings)
    assert guessed.state  # paired by shape
    header, rest = text.split("\n", 1)
    aliased = parse_module(f"{header}, input_output_alias={{ {{1}}: (1, {{}}) }}\n{rest}", "a.hlo")
    assert state_pairs(aliased) == [(1, 1)]
    graph = build_graph(aliased, parse_mesh("1x2"), load_cluster("m8"))
    assert not any("no input_output_alias" in n for n in graph.notes)


@pytest.mark.parametrize(("mesh", "level"), [("2x4", 3), ("2x8", 2)])
def test_the_plans_of_the_combined_search_made_apart_are_the_plans_made_one_by_one(
    monkeypatch: pytest.MonkeyPatch, mesh: str, level: int
) -> None:
    """The combined-collectives search makes a round's plans in worker processes where
    O2 searched by segments (level 3: the windows the workers solved handed back) or the
    problem is large (level 2: each LP from its parent's basis, sent there and back):
    the same plan as one by one."""
    import dataclasses
    from concurrent.futures import ProcessPoolExecutor

    from rhino.search.problem import SolveOptions, Tuning
    from rhino.search.spmd import planner

    pools: list[int] = []
    here: list[int] = []

    class Counted(ProcessPoolExecutor):
        def submit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            if args[0] is planner._solve_apart:  # not the tasks that start the workers
                pools.append(id(self))
            return super().submit(*args, **kwargs)

    def solved_here(*args, **kwargs):  # type: ignore[no-untyped-def]
        here.append(1)
        return solve(*args, **kwargs)

    solve = planner._solve
    monkeypatch.setattr(planner, "ProcessPoolExecutor", Counted)
    monkeypatch.setattr(planner, "_solve", solved_here)

    # level 3 on a small model where the whole core may not be one ILP
    options = SolveOptions(tuning=Tuning(whole_core_pairs=0)) if level == 3 else SolveOptions()
    plans = [
        plan_for(
            ROOT / "examples" / "gpt_tiny.hlo",
            mesh,
            solve=dataclasses.replace(options, threads=threads),
        )
        for threads in (1, 2)
    ]
    one, apart = plans
    # every plan after the first made apart (and wrong guesses of `speculate`: no more
    # than a round's plans), only the first here
    assert one.solver.combined is not None
    assert one.solver.combined.plans - 1 <= len(pools) <= 2 * one.solver.combined.plans
    assert len(set(pools)) == 1
    assert len(here) == one.solver.combined.plans + 1
    assert one.solver.merge_level == apart.solver.merge_level == level
    assert one.solver.combined is not None and one.solver.combined.plans >= 3
    assert apart.solver.combined == one.solver.combined
    assert apart.objective_s == one.objective_s
    assert [i.outs for i in apart.instructions] == [i.outs for i in one.instructions]


def test_a_worker_gets_a_plan_of_the_combined_search_as_its_changes_from_the_first() -> None:
    """What goes to a worker for each plan after the first: the nodes and edges a closed
    key changed, from which it makes the very problem (the same objects elsewhere)."""
    from rhino.search.spmd import planner
    from rhino.search.spmd.builder import build_graph
    from rhino.search.spmd.combine import node_latencies

    graph = build_graph(
        parse_file(ROOT / "examples" / "gpt_tiny.hlo"), parse_mesh("2x4"), load_cluster("m8")
    )
    first = planner.to_problem(graph, None)
    keys = sorted({key for table in node_latencies(graph) for key in table})
    assert keys
    for key in keys:
        problem = planner.to_problem(graph, None, frozenset([key]))
        changes = planner._changes(first, problem)
        nodes, edges, budget, constant = changes
        assert 0 < len(nodes) + len(edges) < len(first.nodes) + len(first.edges)
        assert (budget, constant) == (problem.budget, problem.constant_memory)
        again = planner._changed(first, changes)
        assert all(a is b for a, b in zip(again.nodes, problem.nodes, strict=True))
        assert all(a is b for a, b in zip(again.edges, problem.edges, strict=True))
    assert planner._changes(first, first)[:2] == ([], [])


def test_at_level_3_each_plan_of_the_combined_search_refines_the_plan_it_varies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plans after the first close one more key than a plan made before: O2's level 3
    refines that plan (`WarmStart.plan`) instead of making its first plans again."""
    from rhino.search.problem import SolveOptions, Tuning
    from rhino.search.spmd import merge, planner

    handed: list[tuple[int, ...] | None] = []
    found: list[tuple[int, ...]] = []

    def recorded(problem, options=None, start=None, memo=None, warm=None):  # type: ignore[no-untyped-def]
        handed.append(warm.plan if warm is not None else None)
        solution = merge.solve_merged(problem, options, start, memo, warm)
        found.append(solution.choice)
        return solution

    monkeypatch.setattr(planner, "solve_merged", recorded)
    segments = SolveOptions(threads=1, tuning=Tuning(whole_core_pairs=0))
    plan = plan_for(ROOT / "examples" / "gpt_tiny.hlo", "2x4", solve=segments)
    assert plan.solver.merge_level == 3
    assert plan.solver.combined is not None and plan.solver.combined.plans >= 3
    assert handed[0] is None  # the first plan: first plans of its own
    assert all(given is not None and given in found[:i] for i, given in enumerate(handed) if i)


def test_at_level_3_the_trials_leave_the_wide_passes_to_the_plan_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first plan makes O2's wide pass, the combined search's trials do not, and the
    plan the search chose is refined once more with it: the plan returned is that one
    where it is no worse."""
    from rhino.search.problem import SolveOptions, Tuning
    from rhino.search.spmd import merge, planner

    calls: list[tuple[int, tuple[int, ...] | None, tuple[int, ...], float]] = []

    def recorded(problem, options=None, start=None, memo=None, warm=None):  # type: ignore[no-untyped-def]
        solution = merge.solve_merged(problem, options, start, memo, warm)
        given = warm.plan if warm is not None else None
        calls.append((options.tuning.wide_passes, given, solution.choice, solution.objective))
        return solution

    monkeypatch.setattr(planner, "solve_merged", recorded)
    segments = SolveOptions(threads=1, tuning=Tuning(whole_core_pairs=0))
    plan = plan_for(ROOT / "examples" / "gpt_tiny.hlo", "2x4", solve=segments)
    combined = plan.solver.combined
    assert plan.solver.merge_level == 3 and combined is not None and combined.closed
    assert calls[0][0] == 1  # the first plan
    *trials, finish = calls[1:]
    assert trials and all(wide == 0 for wide, _, _, _ in trials)
    wide, given, choice, _ = finish
    assert wide == 1 and given in [found for _, _, found, _ in trials]
    assert combined.plans == len(calls)
    # refined from the chosen trial's plan, on the same problem: no worse by its cost
    assert finish[3] <= min(obj for _, _, found, obj in trials if found == given)


def test_the_combined_search_plans_here_when_its_workers_cannot_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the worker processes break (killed, or dying as they start), the plans are
    made here, the same."""
    import dataclasses
    from concurrent.futures import Future, ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    from rhino.search.problem import SolveOptions, Tuning
    from rhino.search.spmd import planner

    tried: list[int] = []

    class Broken(ProcessPoolExecutor):
        def submit(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            tried.append(1)
            future: Future[object] = Future()
            future.set_exception(BrokenProcessPool("a child terminated abruptly"))
            return future

    monkeypatch.setattr(planner, "ProcessPoolExecutor", Broken)
    segments = SolveOptions(tuning=Tuning(whole_core_pairs=0), threads=2)
    broken = plan_for(ROOT / "examples" / "mlp.hlo", "2x4", solve=segments)
    here = plan_for(
        ROOT / "examples" / "mlp.hlo", "2x4", solve=dataclasses.replace(segments, threads=1)
    )
    assert tried  # the search did try its workers
    assert broken.objective_s == here.objective_s
    assert [i.outs for i in broken.instructions] == [i.outs for i in here.instructions]


_FROM_STANDARD_INPUT = """
import json, sys
from pathlib import Path
from rhino.hlo.parser import parse_file
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.problem import SolveOptions, Tuning
from rhino.search.spmd.meshsearch import plan_best_mesh
from rhino.search.spmd.planner import PlanRequest, make_plan

path = Path(sys.argv[1])
segments = SolveOptions(tuning=Tuning(whole_core_pairs=0), threads=2)
request = PlanRequest(parse_mesh("2x4"), load_cluster("m8"), solve=segments)
plan = make_plan(parse_file(path), request)
best, _ = plan_best_mesh(path.read_text(), str(path), 8, request, jobs=2)
print(json.dumps([plan.objective_s, plan.solver.combined.plans, best.objective_s]))
"""


def test_a_script_read_from_standard_input_plans_without_worker_processes() -> None:
    """`python - < script.py`: the main module is "<stdin>", which a worker process
    cannot import again (it would die as it starts, and the pool break). The combined
    search and the meshes of --devices are then searched in this process: the same
    plans, no traceback."""
    import json
    import subprocess

    from rhino.search.problem import SolveOptions, Tuning
    from rhino.search.spmd.meshsearch import plan_best_mesh

    mlp = ROOT / "examples" / "mlp.hlo"
    done = subprocess.run(
        [sys.executable, "-", str(mlp)],
        input=_FROM_STANDARD_INPUT,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    objective, plans, best = json.loads(done.stdout)
    segments = SolveOptions(tuning=Tuning(whole_core_pairs=0), threads=1)
    here = plan_for(mlp, "2x4", solve=segments)
    assert plans > 1  # the combined search ran
    assert objective == here.objective_s
    request = PlanRequest(parse_mesh("2x4"), load_cluster("m8"), solve=segments)
    assert best == plan_best_mesh(mlp.read_text(), str(mlp), 8, request, jobs=1)[0].objective_s


@pytest.mark.parametrize(
    ("attributes", "can"),
    [
        ({"__file__": "<stdin>"}, False),
        ({"__file__": str(ROOT / "no such script.py")}, False),
        ({"__file__": str(ROOT / "pyproject.toml")}, True),  # a file: it can be imported
        ({}, True),  # interactive, `python -c`
    ],
)
def test_workers_can_start_where_the_main_module_can_be_imported_again(
    monkeypatch: pytest.MonkeyPatch, attributes: dict[str, str], can: bool
) -> None:
    import types

    from rhino.search import workers

    main = types.ModuleType("__main__")
    main.__dict__.update(attributes)
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(workers, "_main_line", lambda: None)  # no top-level code running
    assert workers.workers_can_start() is can


_SCRIPT = """import rhino

plan = rhino  # line 3: the top level

if __name__ == "__main__":
    plan = rhino  # line 6: guarded
"""


@pytest.mark.parametrize(
    ("name", "line", "can"),
    [
        ("train.py", 3, False),
        ("train.py", 6, True),
        ("train.py", None, True),
        ("__main__.py", 3, True),  # a package's: multiprocessing does not run it again
    ],
)
def test_workers_cannot_start_from_a_scripts_top_level_outside_its_main_guard(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, line: int | None, can: bool
) -> None:
    """Each worker would run that top-level code again (the whole search included)."""
    import types

    from rhino.search import workers

    script = tmp_path / name
    script.write_text(_SCRIPT)
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(workers, "_main_line", lambda: line)  # where the main thread is
    assert workers.workers_can_start() is can
    if not can:
        assert "if __name__" in (workers.why_no_workers() or "")


def test_a_script_asks_from_its_top_level_and_from_its_main_guard(tmp_path: Path) -> None:
    """`workers_can_start` reads where the main thread is in the script, from any thread."""
    import subprocess
    import textwrap

    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import threading
            from rhino.search.workers import workers_can_start

            def asked_from_a_thread():
                found = []
                thread = threading.Thread(target=lambda: found.append(workers_can_start()))
                thread.start()
                thread.join()
                return found[0]

            print("top", workers_can_start(), asked_from_a_thread())

            if __name__ == "__main__":
                print("guarded", workers_can_start(), asked_from_a_thread())
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["top False False", "guarded True True"]


def test_the_combined_search_stops_cpsat_by_its_work_in_every_plan_after_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A later plan is a trial: CP-SAT in it stops at TRIAL_WORK (the same on any
    machine), not at the clock; the first plan has the time limit alone."""
    from rhino.search.problem import SolveOptions
    from rhino.search.spmd import merge, planner

    limits: list[float | None] = []

    def recorded(problem, options=None, start=None, memo=None, warm=None):  # type: ignore[no-untyped-def]
        limits.append(options.work_limit)
        return merge.solve_merged(problem, options, start, memo, warm)

    monkeypatch.setattr(planner, "solve_merged", recorded)
    plan = plan_for(ROOT / "examples" / "mlp.hlo", "2x4", solve=SolveOptions(threads=1))
    assert plan.solver.combined is not None and plan.solver.combined.plans == len(limits) > 1
    assert limits == [None] + [planner.TRIAL_WORK] * (len(limits) - 1)
    assert SolveOptions(work_limit=0.5).working_at_most(planner.TRIAL_WORK).work_limit == 0.5
