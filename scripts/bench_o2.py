"""O2 against O3, side by side: `rhino plan --opt O2` and `--opt O3` on zoo models.

    python scripts/bench_o2.py                                   # everything (hours)
    python scripts/bench_o2.py --gpt-layers 12 --gpt-layers 72 --meshes 2x8 --no-moe --no-others
    python scripts/bench_o2.py --o3-time-limit 300 --out bench/o2.json

Models: the zoo GPT with hidden size 512 at 12, 24, 36, 48 and 72 layers (unrolled), the
GShard MoE configurations of the Rhino paper's Table 2, and the other zoo models in a
mid-size configuration; meshes 1x8, 2x4 and 2x8 on the m8 cluster, without a memory
limit (what the search itself costs). Each (model, mesh, level) runs in a fresh process,
so its peak RSS is its own; the time is parse + plan, wall clock, on this machine.

Prints a table (instructions, critical nodes and their share, cones, core nodes,
segments, O2 time per phase, both levels' estimated step time and wall time, O2/O3 and
peak RSS) and writes every number as JSON (--out). O2/O3 compares estimated step times:
below 1 means O2 found the better plan (O3 ran out of time before proving optimality).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
from benchlib import ROOT, json_default, measure, revision
from rich.console import Console
from rich.table import Table

GPT_LAYERS = (12, 24, 36, 48, 72)
MOE_CONFIGS = ("8e-380m", "8e-760m", "16e-1.3b", "16e-2.4b", "32e-10b")
OTHERS = (
    ("gpt_scan", "hidden512"),
    ("wresnet", "wr-1.3b"),
    ("unet", "base"),
    ("mlp", "small"),
    ("dnabert", "tiny"),
)
MESHES = ("1x8", "2x4", "2x8")


def ensure_model(model: str, config: str, layers: int | None = None) -> Path:
    """The zoo model's HLO under generated/ (written on first use)."""
    name = f"{model}_{config}" + (f"_layers{layers}" if layers else "")
    path = ROOT / "generated" / f"{name}.hlo"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        extra = ["--layers", str(layers)] if layers else []
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "zoo.py"),
                model,
                "--config",
                config,
                *extra,
                "--out",
                str(path),
            ],
            check=True,
        )
    return path


def budget_of(
    memory: str, module: Any, mesh: str, free_peak: float | None
) -> tuple[float | None, float | None]:
    """The budget `--memory` names for this model and mesh (bytes; None for none), and the
    peak of O2's plan without a budget when it was needed (`free_peak` if given)."""
    from rhino.search.cluster import load_cluster, parse_quantity
    from rhino.search.mesh import parse_mesh
    from rhino.search.spmd.planner import PlanRequest, make_plan

    if memory == "none":
        return None, None
    if memory == "device":
        return load_cluster("m8").memory_bytes, None
    if not memory.startswith("tight:"):
        return parse_quantity(memory, "bytes"), None
    if free_peak is None:  # the plan without a budget, from O2
        free_peak = make_plan(
            module, PlanRequest(parse_mesh(mesh), load_cluster("m8"))
        ).peak_memory_bytes
    low = smallest_peak(module, mesh)
    return low + float(memory.removeprefix("tight:")) * (free_peak - low), free_peak


def smallest_peak(module: Any, mesh: str) -> float:
    """The smallest peak any plan can have on this mesh."""
    from rhino.search.cluster import load_cluster
    from rhino.search.mesh import parse_mesh
    from rhino.search.spmd.builder import build_graph
    from rhino.search.spmd.planner import to_problem
    from rhino.search.spmd.solver import min_peak_memory

    graph = build_graph(module, parse_mesh(mesh), load_cluster("m8"))
    return min_peak_memory(to_problem(graph, None))[0]


def plan_once(
    path: str,
    mesh: str,
    level: str,
    time_limit: float,
    memory: str = "none",
    free_peak: float | None = None,
) -> dict[str, Any]:
    """One plan, in this process: what the table needs."""
    from rhino.hlo.parser import parse_file
    from rhino.search.cluster import load_cluster
    from rhino.search.mesh import parse_mesh
    from rhino.search.problem import SolveOptions
    from rhino.search.spmd.planner import PlanRequest, make_plan

    budget, free_peak = budget_of(memory, parse_file(path), mesh, free_peak)
    start = time.perf_counter()
    module = parse_file(path)
    parsed = time.perf_counter() - start
    request = PlanRequest(
        parse_mesh(mesh),
        load_cluster("m8"),
        level,
        budget,
        solve=SolveOptions(time_limit_s=time_limit),
    )
    plan = make_plan(module, request)
    solver = plan.solver.to_json()  # as in the plan file
    return {
        "budget_bytes": budget,
        "free_peak_bytes": free_peak,
        "peak_memory_bytes": plan.peak_memory_bytes,
        "budget_search": solver.get("budget_search"),
        "instructions": sum(1 for _ in module.instructions()),
        "wall_s": time.perf_counter() - start,
        "parse_s": parsed,
        "objective_s": plan.objective_s,
        "solver_objective_s": solver["objective_s"],
        "status": solver["status"],
        "gap": solver["gap"],
        "merge_level": solver["merge_level"],
        "sizes": solver["sizes"],
        "phases_s": solver["phases_s"],
    }


def run_one(
    path: Path, mesh: str, level: str, time_limit: float, memory: str, free_peak: float | None
) -> dict[str, Any]:
    """One plan in a fresh worker process (`--worker`): its row, with the process's peak RSS
    (`benchlib.measure`)."""
    done = measure(
        [
            sys.executable,
            __file__,
            "--worker",
            str(path),
            mesh,
            level,
            str(time_limit),
            "--memory",
            memory,
            *(["--free-peak", str(free_peak)] if free_peak is not None else []),
        ]
    )
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    row: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {**row, "peak_rss_bytes": done.peak_rss_bytes}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def render(rows: list[dict[str, Any]]) -> Table:
    t = Table(
        title="O2 vs O3 (m8 cluster, no memory limit; times are wall seconds on this machine)"
    )
    for col in (
        "model",
        "mesh",
        "instr",
        "critical (of nodes)",
        "cones",
        "core",
        "segments",
        "O2 phases s",
        "O2 s",
        "O3 s",
        "O2 step ms",
        "O3 step ms",
        "O3 status",
        "O2/O3",
        "RSS O2/O3 MiB",
    ):
        t.add_column(col, justify="left" if col in ("model", "mesh", "O2 phases s") else "right")
    for r in rows:
        o2, o3 = r.get("O2", {}), r.get("O3", {})
        sizes = o2.get("sizes", {})
        phases = o2.get("phases_s", {})
        crit = sizes.get("critical")
        share = f"{crit} ({crit / max(sizes.get('nodes', 1), 1):.1%})" if crit is not None else "-"
        phase_text = " ".join(
            f"{k.removeprefix('solve.')}={v:.1f}"
            for k, v in phases.items()
            if k in ("build", "solve.merge", "solve.segments", "solve.refine", "solve.ilp", "plan")
        )
        ratio = (
            (o2["objective_s"] / o3["objective_s"])
            if "objective_s" in o2 and "objective_s" in o3
            else None
        )
        rss = "/".join(
            f"{x['peak_rss_bytes'] / 2**20:.0f}" if "peak_rss_bytes" in x else "-" for x in (o2, o3)
        )
        t.add_row(
            r["model"],
            r["mesh"],
            str(o2.get("instructions", o3.get("instructions", "-"))),
            share,
            str(sizes.get("cones", "-")),
            str(sizes.get("core_nodes", "-")),
            str(sizes.get("segments", "-")),
            phase_text or o2.get("error", "-"),
            f"{o2['wall_s']:.1f}" if "wall_s" in o2 else "-",
            f"{o3['wall_s']:.1f}" if "wall_s" in o3 else o3.get("error", "-")[:30],
            _ms(o2.get("objective_s")),
            _ms(o3.get("objective_s")),
            o3.get("status", "-") + (f" {o3['gap']:.0%}" if o3.get("status") == "feasible" else ""),
            "-" if ratio is None else f"{ratio:.4f}",
            rss,
        )
    return t


@click.command()
@click.option("--worker", nargs=4, hidden=True, type=(str, str, str, float))
@click.option("--free-peak", type=float, hidden=True)
@click.option(
    "--memory",
    default="none",
    show_default=True,
    help="Budget per device: none, device (the cluster's memory, as `rhino plan`), a size "
    "(6GiB), or tight:F (the smallest possible peak plus F times the distance to the peak "
    "of O2's plan without a budget: 0 < F < 1 binds).",
)
@click.option(
    "--gpt-layers", type=int, multiple=True, help=f"GPT depths (default {GPT_LAYERS}; 0 for none)."
)
@click.option("--moe", "moe_configs", multiple=True, help=f"MoE configs (default {MOE_CONFIGS}).")
@click.option("--no-moe", is_flag=True)
@click.option("--no-others", is_flag=True, help="Skip the other zoo models.")
@click.option("--meshes", multiple=True, help=f"Meshes (default {MESHES}).")
@click.option("--no-o3", is_flag=True, help="O2 only.")
@click.option("--o2-time-limit", default=60.0, show_default=True)
@click.option("--o3-time-limit", default=300.0, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default="bench/o2.json", show_default=True)
@click.option(
    "--o3-from",
    type=click.Path(dir_okay=False, exists=True),
    help="Take O3's results from this earlier JSON (same model and mesh) instead of running it.",
)
def main(
    worker: tuple[str, str, str, float] | None,
    free_peak: float | None,
    memory: str,
    gpt_layers: tuple[int, ...],
    moe_configs: tuple[str, ...],
    no_moe: bool,
    no_others: bool,
    meshes: tuple[str, ...],
    no_o3: bool,
    o2_time_limit: float,
    o3_time_limit: float,
    out: str,
    o3_from: str | None,
) -> None:
    if worker:
        print(json.dumps(plan_once(*worker, memory, free_peak), default=json_default))
        return
    models: list[tuple[str, Path]] = []
    for layers in gpt_layers or GPT_LAYERS:
        if layers <= 0:  # --gpt-layers 0: no GPT
            continue
        models.append((f"gpt hidden512 x{layers}", ensure_model("gpt", "hidden512", layers)))
    if not no_moe:
        for config in moe_configs or MOE_CONFIGS:
            models.append((f"moe {config}", ensure_model("moe", config)))
    if not no_others:
        for model, config in OTHERS:
            models.append((f"{model} {config}", ensure_model(model, config)))
    console = Console(width=220)
    rows: list[dict[str, Any]] = []
    levels = ("O2",) if no_o3 else ("O2", "O3")
    earlier = {}
    if o3_from:
        for row in json.loads(Path(o3_from).read_text())["rows"]:
            if "O3" in row:
                earlier[row["model"], row["mesh"]] = row["O3"]
    for name, path in models:
        for mesh in meshes or MESHES:
            row: dict[str, Any] = {"model": name, "file": str(path.relative_to(ROOT)), "mesh": mesh}
            for level in levels:
                console.print(f"[dim]{name} on {mesh}, {level} ...[/]")
                limit = o2_time_limit if level == "O2" else o3_time_limit
                if level == "O3" and (name, mesh) in earlier:
                    row[level] = {**earlier[name, mesh], "from": o3_from}
                    continue
                # with tight:F, O3 gets the budget O2 got (the same free plan's peak)
                peak = row.get("O2", {}).get("free_peak_bytes")
                row[level] = run_one(path, mesh, level, limit, memory, peak)
            rows.append(row)
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(
                json.dumps(
                    {
                        "revision": revision("search", "hlo", "scripts"),
                        "cluster": "m8",
                        "o2_time_limit_s": o2_time_limit,
                        "o3_time_limit_s": o3_time_limit,
                        "memory": memory,
                        "rows": rows,
                    },
                    indent=1,
                    default=json_default,
                )
            )
    console.print(render(rows))
    console.print(f"JSON: {out}")


if __name__ == "__main__":
    main()
