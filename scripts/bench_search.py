#!/usr/bin/env python
"""Time of the O3 search (`make_plan`) per model and mesh, stage by stage.

    python scripts/bench_search.py                          # examples on 1x8 and 2x4
    python scripts/bench_search.py --gpt-layers 4           # plus a generated 4-layer GPT
    python scripts/bench_search.py --mesh 2x4 --time-limit 30 examples/gpt_tiny.hlo
    python scripts/bench_search.py --profile bench/prof --out bench/search.json

For each (model, mesh) it runs `make_plan` once, cold (rhino's reshard and layout caches
cleared first, as in a fresh `rhino plan`), and reports the problem size (graph nodes,
edges, strategy pairs; ILP variables and constraints), where the time goes and what the
plan predicts. Stages are timed by wrapping the functions `make_plan` calls:

    build      build_graph: strategies (rules.strategies) + edges (builder edge matrices,
               reshard_cost) + the rest (call inlining, while carries)
    problem    to_problem: cost and memory vectors
    model      solve_ilp less the CP-SAT search: reductions and the model built in Python
               (the solver's own stats, e.g. reduce_s and core size, are kept in the JSON)
    cp-sat     CpSolver.solve: presolve and search (runs to --time-limit unless optimal)
    plan       to_plan: collectives of the chosen plan

A stage whose function is missing (renamed) is reported as None, not guessed. Large
models are generated with scripts/zoo.py into generated/ (not committed). Runs are
sequential: on a 2-core machine CP-SAT's 2 workers take both cores. The peak RSS printed
under the table (and `peak_rss_bytes` in the JSON) is the whole process's, every case
together (they run in this one process).
"""

from __future__ import annotations

import cProfile
import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import click
from benchlib import json_default, mib, own_peak_rss, revision
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Timers:
    """Seconds per stage, accumulated by the wrappers of `timed`."""

    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    cpsat: dict[str, Any] = field(default_factory=dict)
    """What the CP-SAT wrapper saw: wall time, model size, bound, branches."""

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
        self.calls[stage] = self.calls.get(stage, 0) + 1


def _timing(stage: str, fn: Callable[..., Any], timers: Timers) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timers.add(stage, time.perf_counter() - start)

    return wrapper


def _solve_wrapper(fn: Callable[..., Any], timers: Timers) -> Callable[..., Any]:
    """Time `solve_ilp` and keep the stats its `Solution` carries (reduction, model build)."""

    @functools.wraps(fn)
    def solve(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            solution = fn(*args, **kwargs)
        finally:
            timers.add("solve_ilp", time.perf_counter() - start)
        timers.cpsat["stats"] = solution.stats.to_json()
        return solution

    return solve


def _cpsat_wrapper(fn: Callable[..., Any], timers: Timers) -> Callable[..., Any]:
    @functools.wraps(fn)
    def solve(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        # Read only: with OR-tools' C++-backed protos, touching `c.linear` of another kind
        # of constraint turns it into an empty linear one (and the model infeasible).
        proto = model.proto
        timers.cpsat.update(
            variables=len(proto.variables),
            constraints=len(proto.constraints),
            linear_terms=sum(len(c.linear.vars) for c in proto.constraints if c.has_linear()),
        )
        start = time.perf_counter()
        try:
            return fn(self, model, *args, **kwargs)
        finally:
            wall = time.perf_counter() - start
            timers.add("cpsat", wall)
            timers.cpsat.update(
                wall_s=wall, branches=self.num_branches, conflicts=self.num_conflicts
            )

    return solve


@contextmanager
def timed(timers: Timers) -> Iterator[None]:
    """Wrap the functions `make_plan` calls, so each stage's time lands in `timers`."""
    from ortools.sat.python import cp_model

    import rhino.search.spmd.builder as builder
    import rhino.search.spmd.planner as planner

    targets: list[tuple[object, str, str]] = [
        (planner, "build_graph", "build"),
        (planner, "to_problem", "problem"),
        (planner, "to_plan", "plan"),
        (builder, "rule_strategies", "strategies"),
        (getattr(builder, "_Builder", None), "edge", "edges"),
    ]
    with ExitStack() as stack:
        for owner, name, stage in targets:
            if owner is not None and hasattr(owner, name):
                wrapped = _timing(stage, getattr(owner, name), timers)
                stack.enter_context(mock.patch.object(owner, name, wrapped))
        if hasattr(planner, "solve_ilp"):
            wrapped = _solve_wrapper(planner.solve_ilp, timers)
            stack.enter_context(mock.patch.object(planner, "solve_ilp", wrapped))
        stack.enter_context(
            mock.patch.object(
                cp_model.CpSolver, "solve", _cpsat_wrapper(cp_model.CpSolver.solve, timers)
            )
        )
        yield


def clear_caches() -> dict[str, Callable[[], Any]]:
    """Clear rhino's search caches; name -> cache_info of each lru_cache found."""
    import rhino.search.spmd.reshard as reshard
    import rhino.search.spmd.strategy as strategy

    caches = {
        "reshard": getattr(reshard, "_reshard", None),
        "reshard_tree": getattr(reshard, "_tree", None),
        "reshard_expand": getattr(reshard, "_expand", None),
        "candidate_specs": getattr(strategy, "_candidate_specs", None),
    }
    found = {k: c for k, c in caches.items() if c is not None and hasattr(c, "cache_info")}
    for c in found.values():
        c.cache_clear()
    return {k: c.cache_info for k, c in found.items()}


def ensure_gpt(layers: int, config: str) -> Path:
    path = ROOT / "generated" / f"gpt_{config}_layers{layers}.hlo"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "zoo.py"),
                "gpt",
                "--config",
                config,
                "--layers",
                str(layers),
                "--out",
                str(path),
            ],
            check=True,
        )
    return path


@dataclass(frozen=True)
class Case:
    path: Path
    mesh: str


def run_case(
    case: Case,
    cluster: Any,
    budget: float | None,
    time_limit: float,
    threads: int,
    profile_dir: Path | None,
    fail_fast: bool = False,
) -> dict[str, Any]:
    """One cold `make_plan`; a row of the report (with "error" when it raised)."""
    from rhino.hlo.errors import RhinoError
    from rhino.hlo.parser import parse_file
    from rhino.hlo.verify import verify
    from rhino.search.mesh import parse_mesh
    from rhino.search.spmd import planner
    from rhino.search.spmd.planner import PlanRequest, make_plan

    SolveOptions = planner.SolveOptions  # noqa: N806 - the class make_plan's solver takes

    module = parse_file(case.path)
    verify(module)
    request = PlanRequest(
        parse_mesh(case.mesh),
        cluster,
        "O3",
        budget,
        solve=SolveOptions(time_limit_s=time_limit, threads=threads),
    )
    row: dict[str, Any] = {
        "file": str(case.path.relative_to(ROOT) if case.path.is_relative_to(ROOT) else case.path),
        "mesh": case.mesh,
        "instructions": module.instruction_count,
    }
    infos = clear_caches()
    timers = Timers()
    profiler = cProfile.Profile() if profile_dir is not None else None
    start = time.perf_counter()
    try:
        with timed(timers):
            if profiler is not None:
                profiler.enable()
            try:
                plan = make_plan(module, request)
            finally:
                if profiler is not None:
                    profiler.disable()
    except RhinoError as e:
        row.update(error=str(e), stage_s=timers.seconds, solver_stats=timers.cpsat)
        return row
    except Exception as e:  # a crash in one case must not lose the others' timings
        if fail_fast:
            raise
        row.update(error=f"{type(e).__name__}: {e}", stage_s=timers.seconds)
        return row
    row["wall_s"] = time.perf_counter() - start
    if profiler is not None and profile_dir is not None:
        profile_dir.mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(profile_dir / f"{case.path.stem}_{case.mesh}.prof")
    t = timers.seconds
    solve_ilp, cpsat = t.get("solve_ilp"), t.get("cpsat")
    build, strat, edges = t.get("build"), t.get("strategies"), t.get("edges")
    row.update(
        nodes=plan.problem.get("nodes"),
        edges=plan.problem.get("edges"),
        pairs=plan.problem.get("pairs"),
        build_s=build,
        strategies_s=strat,
        edges_s=edges,
        build_other_s=(
            None if build is None or strat is None or edges is None else build - strat - edges
        ),
        problem_s=t.get("problem"),
        model_s=None if solve_ilp is None or cpsat is None else solve_ilp - cpsat,
        cpsat_s=cpsat,
        plan_s=t.get("plan"),
        search_s=plan.search_time_s,
        variables=plan.solver.variables,
        constraints=plan.solver.constraints,
        linear_terms=timers.cpsat.get("linear_terms"),
        status=plan.solver.status.value,
        gap=plan.solver.gap,
        objective_s=plan.objective_s,
        compute_s=plan.compute_s,
        comm_s=plan.comm_s,
        peak_memory_bytes=plan.peak_memory_bytes,
        reduce_s=timers.cpsat.get("stats", {}).get("reduce_s"),
        solver_stats=timers.cpsat.get("stats", {}),
        caches={k: info()._asdict() for k, info in infos.items()},
    )
    return row


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def render(rows: list[dict[str, Any]], title: str) -> Table:
    cols = (
        "file",
        "mesh",
        "instr",
        "nodes",
        "edges",
        "pairs",
        "strat s",
        "edges s",
        "build s",
        "model s",
        "cp-sat s",
        "search s",
        "vars",
        "cons",
        "status",
        "gap",
        "step ms",
        "comp ms",
        "comm ms",
        "peak MiB",
    )
    table = Table(title=title)
    for col in cols:
        table.add_column(col, justify="left" if col in ("file", "mesh", "status") else "right")
    for r in rows:
        name = Path(r["file"]).stem
        if "error" in r:
            table.add_row(name, r["mesh"], f"{r['instructions']:,}", f"[red]{r['error']}[/]")
            continue
        table.add_row(
            name,
            r["mesh"],
            f"{r['instructions']:,}",
            f"{r['nodes']:,}",
            f"{r['edges']:,}",
            f"{r['pairs']:,}",
            _s(r["strategies_s"]),
            _s(r["edges_s"]),
            _s(r["build_s"]),
            _s(r["model_s"]),
            _s(r["cpsat_s"]),
            _s(r["search_s"]),
            f"{r['variables']:,}",
            f"{r['constraints']:,}",
            r["status"],
            f"{r['gap']:.2%}",
            _ms(r["objective_s"]),
            _ms(r["compute_s"]),
            _ms(r["comm_s"]),
            f"{r['peak_memory_bytes'] / 2**20:,.1f}",
        )
    return table


EPILOG = """\b
Examples:
  python scripts/bench_search.py --gpt-layers 4 --out bench/search.json
  python scripts/bench_search.py --mesh 2x4 --no-memory-limit examples/gpt_tiny.hlo
  python scripts/bench_search.py --profile bench/prof examples/moe_tiny.hlo
"""


@click.command(epilog=EPILOG)
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--mesh",
    "meshes",
    multiple=True,
    default=("1x8", "2x4"),
    show_default=True,
    help="Device mesh; repeatable.",
)
@click.option(
    "--gpt-layers",
    type=int,
    multiple=True,
    help="Also plan a generated GPT with this many layers; repeatable.",
)
@click.option(
    "--gpt-config",
    default="hidden512",
    show_default=True,
    help="zoo.py GPT config of --gpt-layers (hidden512: D=512, S=1024, V=50304, B=8).",
)
@click.option("--no-examples", is_flag=True, help="Skip examples/*.hlo when no FILES are given.")
@click.option("--cluster", default="m8", show_default=True, help="Cluster name or YAML file.")
@click.option(
    "--memory", help="Per-device budget, e.g. 16GiB (default: the cluster's device memory)."
)
@click.option("--no-memory-limit", is_flag=True, help="Plan without a memory budget.")
@click.option("--time-limit", default=60.0, show_default=True, help="CP-SAT time limit, seconds.")
@click.option("--threads", default=2, show_default=True, help="CP-SAT workers.")
@click.option(
    "--profile",
    "profile_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write a cProfile dump per case here (<model>_<mesh>.prof).",
)
@click.option("--fail-fast", is_flag=True, help="Re-raise a case's crash instead of reporting it.")
@click.option(
    "--out",
    default="bench/search.json",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
)
def main(
    files: tuple[Path, ...],
    meshes: tuple[str, ...],
    gpt_layers: tuple[int, ...],
    gpt_config: str,
    no_examples: bool,
    cluster: str,
    memory: str | None,
    no_memory_limit: bool,
    time_limit: float,
    threads: int,
    profile_dir: Path | None,
    fail_fast: bool,
    out: Path,
) -> None:
    """Plan every model on every mesh with O3 and report size and time per stage."""
    measured_at = revision("search", "hlo")  # the code this run imports, before anything changes it
    from rhino.search.cluster import load_cluster, parse_quantity

    clus = load_cluster(cluster)
    budget = (
        None
        if no_memory_limit
        else (parse_quantity(memory, "bytes") if memory else clus.memory_bytes)
    )
    paths = list(files) or ([] if no_examples else sorted((ROOT / "examples").glob("*.hlo")))
    paths += [ensure_gpt(n, gpt_config) for n in gpt_layers]
    console = Console(width=220)
    rows = []
    for path in paths:
        for mesh in meshes:
            with console.status(f"{path.name} on {mesh}"):
                row = run_case(
                    Case(path, mesh), clus, budget, time_limit, threads, profile_dir, fail_fast
                )
            rows.append(row)
            done = (
                f"{row['search_s']:.1f} s, {row['status']}" if "error" not in row else row["error"]
            )
            console.print(f"{path.name} {mesh}: {done}")
    budget_text = "none" if budget is None else f"{budget / 2**30:.1f} GiB"
    console.print(
        render(
            rows,
            f"O3 search ({clus.name}, budget {budget_text}, "
            f"time limit {time_limit:g} s, {threads} workers)",
        )
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "search",
        "revision": measured_at,
        "solver": _solver_module(),
        "cluster": clus.name,
        "budget_bytes": budget,
        "time_limit_s": time_limit,
        "threads": threads,
        "rows": rows,
        "peak_rss_bytes": own_peak_rss(),
    }
    console.print(f"peak RSS of this process, every case together: {mib(doc['peak_rss_bytes'])}")
    out.write_text(json.dumps(doc, indent=2, default=json_default) + "\n")
    console.print(f"wrote {out}")


def _solver_module() -> str:
    """Where the `solve_ilp` that make_plan calls lives (it is being replaced)."""
    import rhino.search.spmd.planner as planner

    fn = getattr(planner, "solve_ilp", None)
    return f"{fn.__module__}.{fn.__name__}" if fn is not None else "?"


if __name__ == "__main__":
    main()
