#!/usr/bin/env python
"""Rhino's O3 plan against plain data parallelism and one device, run through XLA.

    python scripts/bench_run.py                                # examples, 1x8 2x4 8x1
    python scripts/bench_run.py --models gpt_tiny,mlp --meshes 2x4 --steps 20
    python scripts/bench_run.py --quick --out bench/run_quick.json

For each (model, mesh), in one process with 8 simulated CPU devices:

    plan     O3 (`make_plan`) and the data-parallel baseline (`data_parallel_plan`:
             state replicated, the batch split over every device, gradients all-reduced)
    run      each plan through `run_plan`: verified against the single-device program,
             the collectives XLA inserted compared with the predicted ones, XLA's memory
             sizes per device
    time     the O3 program, the DP program and the single-device program compiled once
             more and timed side by side: `--warmup` runs of each, then `--steps`
             rounds of one run of each, the order rotating every round (the machine is
             shared and noisy; interleaving spreads the noise over the three)

and it reports the predicted and measured collective bytes per device per step and their
ratio, the step time medians and the speedups, XLA's total / peak / argument / temp bytes per
device against the plan's estimate, whether the outputs matched, the search time and the
solver status. A model or mesh that fails (XLA rejects it, the outputs differ) keeps its
row with the error and the others go on.

Timings on simulated CPU devices measure rhino's plumbing (all devices share the host's
cores), not the speedup a GPU cluster would see; the predicted columns are for the
cluster model (`--cluster`). The peak RSS printed at the end (`peak_rss_bytes` in the
JSON) is the whole process's, every case together (plans, XLA compiles and runs).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
from benchlib import json_default, mib, own_peak_rss, revision
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
DEVICES = 8
"""Simulated CPU devices of the process (every mesh must fit)."""
DEFAULT_MESHES = ("1x8", "2x4", "8x1")


@dataclass(frozen=True)
class Defaults:
    """What the options default to."""

    models: tuple[str, ...]
    meshes: tuple[str, ...]
    steps: int
    warmup: int
    time_limit: float


FULL = Defaults((), DEFAULT_MESHES, steps=10, warmup=2, time_limit=60.0)
QUICK = Defaults(("mlp",), ("1x8",), steps=3, warmup=1, time_limit=10.0)


def simulate_cpu_devices(n: int) -> None:
    """Ask XLA for n host devices: only before jax is first imported."""
    if "jax" in sys.modules:
        import jax

        if len(jax.devices("cpu")) < n:
            raise click.UsageError(f"jax already started with fewer than {n} CPU devices")
        return
    flag = f"--xla_force_host_platform_device_count={n}"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


# -- one (model, mesh) --------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    path: Path
    mesh: str


@dataclass(frozen=True)
class Settings:
    cluster: Any
    budget: float | None
    time_limit: float
    threads: int
    steps: int
    warmup: int
    seed: int


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def plan_both(module: Any, case: Case, s: Settings) -> dict[str, Any]:
    """name -> Plan or the error text, for "o3" and "dp"."""
    from rhino.search.mesh import parse_mesh
    from rhino.search.problem import SolveOptions
    from rhino.search.spmd.baselines import data_parallel_plan
    from rhino.search.spmd.planner import PlanRequest, make_plan

    mesh = parse_mesh(case.mesh)
    solve = SolveOptions(time_limit_s=s.time_limit, threads=s.threads)
    makers: dict[str, Callable[[], Any]] = {
        "o3": lambda: make_plan(module, PlanRequest(mesh, s.cluster, "O3", s.budget, solve=solve)),
        "dp": lambda: data_parallel_plan(
            module, mesh, s.cluster, budget_bytes=s.budget, solve=solve
        ),
    }
    plans: dict[str, Any] = {}
    for name, make in makers.items():
        try:
            plans[name] = make()
        except Exception as e:  # one failing plan must not lose the other's row
            plans[name] = _error(e)
    return plans


def run_one(module: Any, plan: Any, s: Settings) -> dict[str, Any]:
    """`run_plan` (verified, fidelity, memory), summarized for the report."""
    from rhino.runtime.spmd.runner import RunOptions, run_plan

    doc: dict[str, Any] = {
        "objective_s": plan.objective_s,
        "compute_s": plan.compute_s,
        "comm_s": plan.comm_s,
        "search_s": plan.search_time_s,
        "status": plan.solver.status.value,
        "gap": plan.solver.gap,
        "warnings": list(plan.warnings),
    }
    try:
        report = run_plan(
            module,
            plan,
            RunOptions(platform="cpu", seed=s.seed, verify=True, steps=1, warmup=0, baseline=False),
        )
    except Exception as e:  # XLA rejected it: keep the row
        doc["error"] = _error(e)
        return doc
    f = report.fidelity.to_dict()
    doc.update(
        verify_ok=report.ok,
        verify=report.verify.summary() if report.verify else None,
        predicted_bytes=f["predicted_bytes"],
        measured_bytes=f["measured_bytes"],
        bytes_ratio=f["ratio"],
        fidelity_ok=f["ok"],
        by_kind_axes=f["by_kind_axes"],
        fidelity_messages=f["messages"][:20],
        memory=asdict(report.memory),
        notes=list(report.notes),
    )
    return doc


def compile_programs(
    module: Any, plans: dict[str, Any], seed: int
) -> tuple[dict[str, tuple[Any, list[Any]]], dict[str, str]]:
    """name -> (compiled program, its inputs) for "single" and each plan; name -> error
    text for those that do not compile."""
    from rhino.hlo.printer import print_module
    from rhino.runtime import xla_bridge as xb
    from rhino.runtime.inputs import entry_inputs
    from rhino.runtime.spmd.apply import apply_plan, planned_module

    programs: dict[str, tuple[Any, list[Any]]] = {}
    errors: dict[str, str] = {}
    original = planned_module(module)
    try:
        single = xb.compile_spmd(
            print_module(original), xb.local_devices("cpu", 1), num_partitions=1
        )
        programs["single"] = (single, [m.whole() for m in entry_inputs(original, seed)])
    except Exception as e:
        errors["single"] = _error(e)
    for name, plan in plans.items():
        try:
            annotated = apply_plan(module, plan)
            n = plan.mesh.size
            compiled = xb.compile_spmd(
                print_module(annotated), xb.local_devices("cpu", n), num_partitions=n
            )
            programs[name] = (compiled, list(entry_inputs(annotated, seed)))
        except Exception as e:
            errors[name] = _error(e)
    return programs, errors


def time_side_by_side(module: Any, plans: dict[str, Any], s: Settings) -> dict[str, dict[str, Any]]:
    """Median step time of each plan's program and of the single-device program: after
    `warmup` runs of each, `steps` rounds of one run of each, the order rotating (see
    module doc). A program that fails to run leaves the rounds with its error."""
    from rhino.runtime import xla_bridge as xb

    programs, errors = compile_programs(module, plans, s.seed)
    times: dict[str, list[float]] = {name: [] for name in programs}
    order = list(programs)

    def run(name: str, warmup: int) -> None:
        compiled, inputs = programs[name]
        try:
            times[name] += xb.time_execution(compiled, inputs, warmup=warmup, steps=1)
        except Exception as e:
            errors[name] = _error(e)
            order.remove(name)

    for name in list(order):
        if s.warmup:
            run(name, s.warmup - 1)
            times[name].clear()
    for r in range(s.steps):
        k = r % len(order) if order else 0
        for name in order[k:] + order[:k]:
            run(name, 0)
    out: dict[str, dict[str, Any]] = {name: {"error": text} for name, text in errors.items()}
    for name in order:
        ts = times[name]
        out[name] = {
            "median_s": statistics.median(ts),
            "min_s": min(ts),
            "max_s": max(ts),
            "steps": len(ts),
        }
    return out


def run_case(case: Case, s: Settings) -> dict[str, Any]:
    """One row: both plans planned, run, verified and timed (errors kept in the row)."""
    from rhino.hlo.parser import parse_file
    from rhino.hlo.verify import verify

    row: dict[str, Any] = {"model": case.path.stem, "file": _rel(case.path), "mesh": case.mesh}
    try:
        module = parse_file(case.path)
        verify(module)
    except Exception as e:
        row["error"] = _error(e)
        return row
    row["instructions"] = module.instruction_count
    plans = plan_both(module, case, s)
    ok_plans = {name: p for name, p in plans.items() if not isinstance(p, str)}
    for name, plan in plans.items():
        row[name] = {"error": plan} if isinstance(plan, str) else run_one(module, plan, s)
    timing = time_side_by_side(module, ok_plans, s)
    for name in plans:
        row[name]["step"] = timing.get(name)
    row["single"] = {"step": timing.get("single")}
    row["speedup"] = speedups(row)
    return row


def _median(row: dict[str, Any], name: str) -> float | None:
    step = (row.get(name) or {}).get("step") or {}
    return step.get("median_s")


def speedups(row: dict[str, Any]) -> dict[str, float | None]:
    """Measured (and predicted, O3 vs DP) speedups: how many times faster the first is."""

    def ratio(a: float | None, b: float | None) -> float | None:
        return b / a if a and b else None

    o3, dp, single = _median(row, "o3"), _median(row, "dp"), _median(row, "single")
    pred_o3 = (row.get("o3") or {}).get("objective_s")
    pred_dp = (row.get("dp") or {}).get("objective_s")
    return {
        "o3_vs_dp": ratio(o3, dp),
        "o3_vs_single": ratio(o3, single),
        "dp_vs_single": ratio(dp, single),
        "predicted_o3_vs_dp": ratio(pred_o3, pred_dp),
    }


# -- report -------------------------------------------------------------------------------


def _kib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**10:,.1f}"


def _mib(x: float | None) -> str:
    return "-" if x is None else f"{x / 2**20:,.2f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _ok(p: dict[str, Any]) -> str:
    if "error" in p:
        return "[red]error[/]"
    return "ok" if p.get("verify_ok") else "[red]FAIL[/]"


def _comm(p: dict[str, Any]) -> str:
    if p.get("measured_bytes") is None:
        return "-"
    pred, meas = p.get("predicted_bytes"), p.get("measured_bytes")
    return f"{_kib(pred)} / {_kib(meas)} ({_ratio(p.get('bytes_ratio'))})"


def _memory(p: dict[str, Any]) -> tuple[str, str, str, str, str]:
    m = p.get("memory") or {}
    keys = ("total_bytes", "peak_bytes", "argument_bytes", "temp_bytes", "plan_peak_bytes")
    return tuple(_mib(m.get(k)) for k in keys)  # type: ignore[return-value]


def render(rows: list[dict[str, Any]], title: str) -> list[Table]:
    """Two tables: communication and step time; memory per device and search."""
    time_cols = (
        "model",
        "mesh",
        "O3 ok",
        "DP ok",
        "O3 comm KiB pred / meas (ratio)",
        "DP comm KiB pred / meas (ratio)",
        "O3 ms",
        "DP ms",
        "1-dev ms",
        "O3 vs DP",
        "O3 vs DP pred",
        "O3 vs 1-dev",
        "DP vs 1-dev",
    )
    mem_cols = (
        "model",
        "mesh",
        "O3 total",
        "O3 peak",
        "O3 arg",
        "O3 temp",
        "O3 plan",
        "DP total",
        "DP peak",
        "DP arg",
        "DP temp",
        "DP plan",
        "O3 search s",
        "O3 status",
        "DP search s",
        "DP status",
    )
    times = Table(title=f"{title}: communication per device per step, step time")
    memory = Table(
        title="memory per device, MiB (XLA: arguments + outputs + temporaries, reported "
        "peak, arguments, temporaries; the plan's estimate) and search"
    )
    for table, cols in ((times, time_cols), (memory, mem_cols)):
        for col in cols:
            table.add_column(col, justify="left" if col in ("model", "mesh") else "right")
    for r in rows:
        if "error" in r:
            times.add_row(r["model"], r["mesh"], f"[red]{r['error'][:200]}[/]")
            continue
        o3, dp, sp = r["o3"], r["dp"], r["speedup"]
        times.add_row(
            r["model"],
            r["mesh"],
            _ok(o3),
            _ok(dp),
            _comm(o3),
            _comm(dp),
            _ms(_median(r, "o3")),
            _ms(_median(r, "dp")),
            _ms(_median(r, "single")),
            _x(sp["o3_vs_dp"]),
            _x(sp["predicted_o3_vs_dp"]),
            _x(sp["o3_vs_single"]),
            _x(sp["dp_vs_single"]),
        )
        memory.add_row(
            r["model"],
            r["mesh"],
            *_memory(o3),
            *_memory(dp),
            _s(o3.get("search_s")),
            str(o3.get("status", "-")),
            _s(dp.get("search_s")),
            str(dp.get("status", "-")),
        )
    return [times, memory]


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def failures(rows: list[dict[str, Any]]) -> list[str]:
    """One line per failed row or plan: errors and verification failures."""
    out = []
    for r in rows:
        where = f"{r['model']} {r['mesh']}"
        if "error" in r:
            out.append(f"{where}: {r['error']}")
            continue
        for name in ("o3", "dp", "single"):
            p = r.get(name) or {}
            if "error" in p:
                out.append(f"{where} {name}: {p['error']}")
            elif name != "single" and p.get("verify_ok") is False:
                out.append(f"{where} {name}: outputs differ: {p.get('verify')}")
            step = p.get("step") or {}
            if "error" in step:
                out.append(f"{where} {name} timing: {step['error']}")
    return out


# -- command ------------------------------------------------------------------------------


def model_paths(models: tuple[str, ...]) -> list[Path]:
    """The files to run. A model is a stem of examples/*.hlo or a path; none given means
    every example."""
    if not models:
        paths = sorted((ROOT / "examples").glob("*.hlo"))
    else:
        paths = []
        for m in models:
            p = Path(m)
            if not p.suffix:
                p = ROOT / "examples" / f"{m}.hlo"
            if not p.exists():
                raise click.BadParameter(
                    f"no model {m!r} (no file {_rel(p)})", param_hint="--models"
                )
            paths.append(p)
    return paths


def _split(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(v.strip() for text in values for v in text.split(",") if v.strip())


EPILOG = """\b
Examples:
  python scripts/bench_run.py --out bench/run.json
  python scripts/bench_run.py --models gpt_tiny --meshes 2x4,1x8 --steps 20
  python scripts/bench_run.py --quick --models examples/mlp.hlo --meshes 1x4
"""


@click.command(epilog=EPILOG)
@click.option(
    "--models",
    "models",
    multiple=True,
    help="Models (examples/<name>.hlo or a path), comma-separated or repeated; "
    "default: every example.",
)
@click.option(
    "--meshes",
    "meshes",
    multiple=True,
    help=f"Meshes, comma-separated or repeated (default {','.join(DEFAULT_MESHES)}).",
)
@click.option("--steps", type=click.IntRange(min=1), help="Timed rounds (default 10).")
@click.option(
    "--warmup", type=click.IntRange(min=0), help="Untimed runs of each program first (default 2)."
)
@click.option("--time-limit", type=float, help="Search time limit per plan, seconds (default 60).")
@click.option("--threads", default=2, show_default=True, help="Solver workers.")
@click.option(
    "--cluster", default="m8", show_default=True, help="Cluster model of the predictions."
)
@click.option("--memory", help="Per-device budget, e.g. 16GiB (default: the cluster's memory).")
@click.option("--no-memory-limit", is_flag=True, help="Plan without a memory budget.")
@click.option("--seed", default=0, show_default=True, help="Seed of the inputs.")
@click.option(
    "--quick",
    is_flag=True,
    help="Smoke test: mlp on 1x8, 3 rounds, 10 s search (explicit options win).",
)
@click.option(
    "--out",
    default="bench/run.json",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
)
def main(
    models: tuple[str, ...],
    meshes: tuple[str, ...],
    steps: int | None,
    warmup: int | None,
    time_limit: float | None,
    threads: int,
    cluster: str,
    memory: str | None,
    no_memory_limit: bool,
    seed: int,
    quick: bool,
    out: Path,
) -> None:
    """Plan every model on every mesh with O3 and as plain data parallelism, run both
    through XLA next to the single-device program, and report communication, step time
    and memory."""
    measured_at = revision(
        "search", "hlo", "runtime"
    )  # the code this run imports, before anything changes it
    simulate_cpu_devices(DEVICES)
    from rhino.search.cluster import load_cluster, parse_quantity
    from rhino.search.mesh import parse_mesh

    defaults = QUICK if quick else FULL
    models = _split(models) or defaults.models
    meshes = _split(meshes) or defaults.meshes
    for m in meshes:
        if parse_mesh(m).size > DEVICES:
            raise click.BadParameter(
                f"mesh {m} needs more than {DEVICES} devices", param_hint="--meshes"
            )
    clus = load_cluster(cluster)
    budget = (
        None
        if no_memory_limit
        else (parse_quantity(memory, "bytes") if memory else clus.memory_bytes)
    )
    settings = Settings(
        clus,
        budget,
        defaults.time_limit if time_limit is None else time_limit,
        threads,
        steps or defaults.steps,
        defaults.warmup if warmup is None else warmup,
        seed,
    )
    paths = model_paths(models)
    console = Console(width=200)
    rows = []
    started = time.perf_counter()
    for path in paths:
        for mesh in meshes:
            with console.status(f"{path.name} on {mesh}"):
                case_start = time.perf_counter()
                try:
                    row = run_case(Case(path, mesh), settings)
                except Exception as e:  # a crash in one case must not lose the others
                    row = {"model": path.stem, "file": _rel(path), "mesh": mesh, "error": _error(e)}
                row["wall_s"] = time.perf_counter() - case_start
            rows.append(row)
            console.print(
                f"{path.name} {mesh}: {row['wall_s']:.1f} s"
                + (f" [red]{row['error']}[/]" if "error" in row else "")
            )
    budget_text = "none" if budget is None else f"{budget / 2**30:.1f} GiB"
    title = (
        f"O3 vs data parallel vs one device ({DEVICES} simulated CPU devices; predictions "
        f"for {clus.name}, budget {budget_text}; median of {settings.steps} interleaved rounds)"
    )
    for table in render(rows, title):
        console.print(table)
    failed = failures(rows)
    for line in failed:
        console.print(f"[red]failed:[/] {line}")
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "run",
        "revision": measured_at,
        "platform": "cpu",
        "devices": DEVICES,
        "cluster": clus.name,
        "budget_bytes": budget,
        "time_limit_s": settings.time_limit,
        "threads": threads,
        "steps": settings.steps,
        "warmup": settings.warmup,
        "seed": seed,
        "wall_s": time.perf_counter() - started,
        "failures": failed,
        "rows": rows,
        "peak_rss_bytes": own_peak_rss(),
    }
    console.print(f"peak RSS of this process, every case together: {mib(doc['peak_rss_bytes'])}")
    out.write_text(json.dumps(doc, indent=2, default=json_default) + "\n")
    console.print(f"wrote {_rel(out)}")


def _rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


if __name__ == "__main__":
    main()
