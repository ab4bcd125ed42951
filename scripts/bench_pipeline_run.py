"""Pipeline execution on zoo models: stage plans run on simulated CPU devices (stage s on
device s), per model, stage count and schedule.

    python scripts/bench_pipeline_run.py                         # gpt, moe, unet; d = 2, 4
    python scripts/bench_pipeline_run.py --models gpt_tiny --stages 4 --microbatches 4
    python scripts/bench_pipeline_run.py --out bench/pipeline_run.json

Per (model, d, schedule), with m micro-batches: whether every output (loss, updated
parameters, optimizer state) matches the single-device step; the bytes sent between
stages per step as the stage plan predicts them (`rhino pipeline`), as this task graph
plans them and as measured (goal: all three equal); whether every stage ran its tasks
in the planned order; the bubble the simulator predicts from the measured task times
against the measured one (1 - busy share of stage time) and (p-1)/(m+p-1); the measured
step (median of --steps after one warm-up) against the simulator's. The programs of a
(model, d) are compiled once and run under both schedules. Times are wall clock on this
machine's CPU threads (one per stage, sharing its cores): the measured bubble is the
share of time a stage's thread waited, and on fewer cores than stages the stages' tasks
slow each other down; bytes and order do not depend on that. The peak RSS printed at the
end (`peak_rss_bytes` in the JSON) is the whole process's, every model together.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import click  # noqa: E402  (jax reads XLA_FLAGS when it starts: set above, first)
from benchlib import ROOT, mib, own_peak_rss, revision  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from rhino.hlo.errors import InfeasibleError, RhinoError  # noqa: E402
from rhino.hlo.parser import parse_file  # noqa: E402
from rhino.hlo.printer import print_module  # noqa: E402
from rhino.runtime import xla_bridge as xb  # noqa: E402
from rhino.runtime.inputs import entry_inputs  # noqa: E402
from rhino.runtime.pipeline.programs import StagePlan  # noqa: E402
from rhino.runtime.pipeline.run import prepare, run_steps  # noqa: E402
from rhino.runtime.pipeline.tasks import stage_times  # noqa: E402
from rhino.runtime.verify import compare_outputs  # noqa: E402
from rhino.search.cluster import load_cluster  # noqa: E402
from rhino.search.pipeline import PipelineRequest, plan_pipeline  # noqa: E402
from rhino.search.pipeline.schedule import simulate  # noqa: E402
from rhino.search.problem import SolveOptions  # noqa: E402

MODELS = ("gpt_tiny", "moe_tiny", "unet_tiny")
SCHEDULES = ("1f1b", "gpipe")


def stage_plan(path: Path, stages: int, microbatches: int) -> tuple[StagePlan, float]:
    """The stage plan at the smallest epsilon in 0.1, 0.2, ... that admits one."""
    module = parse_file(path)
    epsilon = 0.1
    while True:
        request = PipelineRequest(
            stages,
            epsilon,
            microbatches,
            load_cluster("m8"),
            SolveOptions(time_limit_s=20, threads=1, work_limit=5.0),
        )
        try:
            return StagePlan.of(plan_pipeline(module, request)), epsilon
        except InfeasibleError:
            if epsilon >= 2.0:
                raise
            epsilon = round(epsilon + 0.1, 2)


def run_model(name: str, stages: int, m: int, steps: int) -> list[dict[str, Any]]:
    path = ROOT / "examples" / f"{name}.hlo"
    module = parse_file(path)
    plan, epsilon = stage_plan(path, stages, m)
    started = time.perf_counter()
    pipeline = prepare(module, plan, m)
    compile_s = time.perf_counter() - started
    inputs = [maker.whole() for maker in entry_inputs(module, 0)]
    reference = xb.compile_spmd(print_module(module), pipeline.devices[:1], num_partitions=1)
    want = xb.execute(reference, inputs)
    rows = []
    for name_s in SCHEDULES:
        table, records = run_steps(pipeline, name_s, inputs, steps=steps, warmup=1)
        checks = compare_outputs(want, list(records[-1].outputs))
        median = sorted(records, key=lambda r: r.seconds)[len(records) // 2]
        per_task = {}
        for task in pipeline.graph.tasks:
            times = sorted(e - s for r in records for t, s, e in r.events if t == task)
            per_task[task] = times[len(times) // 2]
        sends = {}
        for pair in median.send_seconds:
            sends[pair] = sum(r.send_seconds.get(pair, 0.0) for r in records) / len(records) / m
        simulated = simulate(name_s, stage_times(pipeline.graph, per_task, sends), m)
        busy = sum(e - s for _, s, e in median.events)
        span = max(e for _, _, e in median.events)
        order = [[t for t, _, _ in median.events if t.stage == s] for s in range(stages)]
        rows.append(
            {
                "model": name,
                "stages": stages,
                "microbatches": m,
                "schedule": name_s,
                "epsilon": epsilon,
                "outputs": len(checks),
                "verify_ok": all(c.ok for c in checks),
                "max_rel_error": max(c.max_rel_error for c in checks),
                "bytes_predicted": sum(plan.sent_bytes.values()),
                "bytes_planned": sum(pipeline.graph.sent_bytes().values()),
                "bytes_measured": sum(median.sent.values()),
                "bytes_by_pair": {
                    f"{a}->{b}": {
                        "predicted": plan.sent_bytes.get((a, b), 0),
                        "planned": pipeline.graph.sent_bytes().get((a, b), 0),
                        "measured": n,
                    }
                    for (a, b), n in sorted(median.sent.items())
                },
                "order_as_planned": order == [list(t) for t in table.actions],
                "bubble_simulated": 1 - simulated.busy_fraction,
                "bubble_measured": 1 - busy / (span * stages) if span > 0 else 0.0,
                "bubble_formula": (stages - 1) / (m + stages - 1),
                "step_measured_s": median.seconds,
                "step_simulated_s": simulated.step_s,
                "peak_activation_bytes": list(simulated.peak_activation_bytes),
                "compile_s": compile_s,
            }
        )
    return rows


@click.command()
@click.option(
    "--models", default=",".join(MODELS), show_default=True, help="Comma-separated examples/ names."
)
@click.option("--stages", "stage_counts", default="2,4", show_default=True)
@click.option("--microbatches", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--steps", default=3, show_default=True, type=click.IntRange(min=1))
@click.option("--out", type=click.Path(dir_okay=False), help="Write the JSON report here.")
def main(models: str, stage_counts: str, microbatches: int, steps: int, out: str | None) -> None:
    rows, failures = [], []
    for name in models.split(","):
        for d in (int(x) for x in stage_counts.split(",")):
            try:
                rows += run_model(name, d, microbatches, steps)
            except RhinoError as exc:  # reported; the others still run
                failures.append(
                    {"model": name, "stages": d, "error": f"{type(exc).__name__}: {exc}"}
                )
    table = Table(title=f"pipeline runs on CPU, m = {microbatches} (bytes per step)")
    for col in (
        "model",
        "d",
        "sched",
        "verify",
        "bytes pred/plan/meas",
        "order",
        "bubble sim/meas/formula",
        "step meas/sim",
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["model"],
            str(r["stages"]),
            r["schedule"],
            f"{'ok' if r['verify_ok'] else 'FAIL'} {r['outputs']}",
            f"{r['bytes_predicted']}/{r['bytes_planned']}/{r['bytes_measured']}",
            "same" if r["order_as_planned"] else "DIFFERS",
            f"{r['bubble_simulated']:.0%}/{r['bubble_measured']:.0%}/{r['bubble_formula']:.0%}",
            f"{r['step_measured_s'] * 1e3:.0f}/{r['step_simulated_s'] * 1e3:.0f} ms",
        )
    console = Console(width=200)
    console.print(table)
    for f in failures:
        console.print(f"[red]failed[/] {f['model']} d={f['stages']}: {f['error']}")
    doc = {
        "benchmark": "pipeline_run",
        "revision": revision("runtime", "search", "hlo"),
        "cpu_count": os.cpu_count(),
        "microbatches": microbatches,
        "rows": rows,
        "failures": failures,
        "peak_rss_bytes": own_peak_rss(),
    }
    console.print(f"peak RSS of this process, every model together: {mib(doc['peak_rss_bytes'])}")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
