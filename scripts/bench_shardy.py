#!/usr/bin/env python
"""rhino's plans through Shardy (jax's partitioner) and through GSPMD: the bytes XLA moves.

    python scripts/bench_shardy.py                              # the cases below
    python scripts/bench_shardy.py --cases mlp:2x4,gpt_tiny:1x8 --out bench/shardy.json

For each (model, mesh), in one process with 8 simulated CPU devices: an O2 plan
(`make_plan`, cluster m8), then `run_plan` twice, with `--partitioner gspmd` and
`shardy`: each verified against the single-device program, and the collectives of XLA's
partitioned module measured (`rhino.runtime.fidelity`). It prints, per case, the plan's
predicted collective bytes per device per step, what XLA moves with each partitioner,
and whether Shardy's bytes match the prediction: `match` when the total is within ±5%
of the plan's (`TOLERANCE`), `rows` when every (kind, mesh axes) total is too; and writes
it all as JSON (`--out`), with each run's per-(kind, axes) totals and fidelity messages,
and the bench process' peak RSS after each case (all in one process: the largest so far,
XLA's compilations included).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click
from benchlib import json_default, mib, own_peak_rss, revision
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
DEVICES = 8
CASES = (
    "mlp:2x4",
    "gpt_tiny:1x8",
    "gpt_tiny:2x4",
    "gpt_scan_tiny:2x4",
    "moe_tiny:2x4",
    "vgg19_tiny:4x2",
)
"""model:mesh; a model is examples/<model>.hlo or a path."""
TOLERANCE = 0.05
"""Shardy's measured bytes, in total and per (kind, axes), within ±5% of the plan's."""


def _simulate_devices() -> None:
    from rhino.runtime.environment import quiet_native_logs

    quiet_native_logs()  # GSPMD's deprecation warning, as `rhino run` keeps it off
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={DEVICES}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _path(model: str) -> Path:
    path = Path(model)
    return path if path.suffix == ".hlo" else ROOT / "examples" / f"{model}.hlo"


def within(rows: list[dict[str, Any]], tolerance: float) -> bool:
    """Every row's (a fidelity report's, or its (kind, axes) totals') measured bytes
    within `tolerance` of its predicted ones."""
    return all(
        abs(r["measured_bytes"] - r["predicted_bytes"]) <= tolerance * r["predicted_bytes"]
        for r in rows
    )


def run_case(model: str, mesh_text: str, time_limit: float) -> dict[str, Any]:
    """Plan, then run through both partitioners; the figures of each."""
    from rhino.hlo.parser import parse_file
    from rhino.runtime.spmd.runner import RunOptions, run_plan
    from rhino.search.cluster import load_cluster
    from rhino.search.mesh import parse_mesh
    from rhino.search.problem import SolveOptions
    from rhino.search.spmd.planner import PlanRequest, make_plan

    module = parse_file(_path(model))
    started = time.perf_counter()
    plan = make_plan(
        module,
        PlanRequest(
            parse_mesh(mesh_text), load_cluster("m8"), solve=SolveOptions(time_limit_s=time_limit)
        ),
    )
    doc: dict[str, Any] = {"model": model, "mesh": mesh_text}
    doc["plan_s"] = time.perf_counter() - started
    for partitioner in ("gspmd", "shardy"):
        options = RunOptions(
            platform="cpu", verify=True, steps=1, warmup=0, baseline=False, partitioner=partitioner
        )
        started = time.perf_counter()
        try:
            report = run_plan(module, plan, options)
        except Exception as e:  # one failing run keeps the row
            doc[partitioner] = {"error": f"{type(e).__name__}: {e}"}
            continue
        fidelity = report.fidelity.to_dict()
        doc["predicted_bytes"] = fidelity["predicted_bytes"]
        doc[partitioner] = {
            "partitioner": report.partitioner,
            "measured_bytes": fidelity["measured_bytes"],
            "verify_ok": report.ok,
            "fidelity_ok": fidelity["ok"],
            "total_within_5pct": within([fidelity], TOLERANCE),
            "rows_within_5pct": within(fidelity["by_kind_axes"], TOLERANCE),
            "by_kind_axes": fidelity["by_kind_axes"],
            "messages": fidelity["messages"][:20],
            "notes": list(report.notes),
            "run_s": time.perf_counter() - started,
        }
    doc["peak_rss_bytes"] = own_peak_rss()
    return doc


def _measured(run: dict[str, Any]) -> str:
    if "error" in run:
        return "error"
    ok = "" if run["verify_ok"] else " (outputs differ)"
    return f"{run['measured_bytes']:,.0f}{ok}"


@click.command()
@click.option("--cases", default=",".join(CASES), show_default=True, help="model:mesh,...")
@click.option("--time-limit", default=60.0, show_default=True, help="Solver limit per plan (s).")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the results as JSON.")
def main(cases: str, time_limit: float, out: str | None) -> None:
    _simulate_devices()
    from rhino.runtime.environment import versions

    rows = []
    for case in cases.split(","):
        model, _, mesh = case.partition(":")
        rows.append(run_case(model, mesh, time_limit))
        print(f"{case}: done", file=sys.stderr)
    table = Table(title="collective bytes per device per step: plan, GSPMD, Shardy")
    columns = (
        "model", "mesh", "predicted", "GSPMD measured", "Shardy measured", "match", "rows",
        "peak RSS",
    )  # fmt: skip
    for col in columns:
        numeric = "measured" in col or col in ("predicted", "peak RSS")
        table.add_column(col, justify="right" if numeric else "left")
    for row in rows:
        shardy, gspmd = row.get("shardy", {"error": ""}), row.get("gspmd", {"error": ""})
        failed = "error" in shardy
        table.add_row(
            row["model"],
            row["mesh"],
            f"{row.get('predicted_bytes', 0):,.0f}",
            _measured(gspmd),
            _measured(shardy),
            "error" if failed else ("yes" if shardy["total_within_5pct"] else "no"),
            "error" if failed else ("yes" if shardy["rows_within_5pct"] else "no"),
            mib(row["peak_rss_bytes"]),
        )
    Console(width=120).print(table)
    if out:
        doc = {"revision": revision(), "versions": versions(), "cases": rows}
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(doc, indent=1, default=json_default))


if __name__ == "__main__":
    main()
