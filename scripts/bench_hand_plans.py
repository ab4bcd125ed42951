"""rhino's plan against hand plans, measured through XLA (issue 9's plan-quality suite).

    python scripts/bench_hand_plans.py                       # every case on 1x4
    python scripts/bench_hand_plans.py --case "gpt tiny" --out bench/hand_plans.json

For each case (a zoo training step), the hand plans of `hand_plans.py` (data parallel,
ZeRO, Megatron, GShard, as apply) are written with jax shardings and compiled by
`jax.jit` (XLA's SPMD partitioner, its collective combiners included); rhino's plan
(`rhino plan`, O2) is compiled from the program `--emit-hlo` writes. Every program's
collectives are counted from XLA's partitioned module (`runtime.fidelity`): how many, and
bytes per device per step by kind (an all-reduce whose result is only sliced per
partition counts as a reduce-scatter, as on CPU XLA has none).

Estimated step times: rhino's plan's own; a hand plan's is rhino's plan with every entry
parameter pinned to the hand layout (O2 fills in the rest: the best completion of the
hand plan under rhino's model, so never worse than the hand plan itself), and data
parallel's is `rhino.search.spmd.baselines.data_parallel_plan` (the batch split carried
through the graph).

Checks per case (the "ok" column): rhino's estimate is at or below every hand plan's;
XLA moves what rhino's plan predicts, within 5%; rhino's measured bytes are no more than
the best hand plan's (the lowest estimate), or rhino's estimate is lower (the column
says which). Bytes are compared as sent per device (`WIRE`: an all-reduce of a buffer
sends as much as a reduce-scatter and an all-gather of it). Prints a table and writes
JSON. Runs on 4 simulated CPU devices. The peak RSS printed at the end (`peak_rss_bytes`
in the JSON) is the whole process's, every case together.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):  # tests set 8
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import click  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from benchlib import json_default, mib, own_peak_rss, revision  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hand_plans  # noqa: E402
import zoo  # noqa: E402
from zoo_models.common import abstract_args, make_train_step  # noqa: E402

from rhino.hlo.ir import Module  # noqa: E402
from rhino.hlo.parser import parse_module  # noqa: E402
from rhino.hlo.printer import print_module  # noqa: E402
from rhino.runtime import xla_bridge as xb  # noqa: E402
from rhino.runtime.fidelity import compare, measure_collectives  # noqa: E402
from rhino.runtime.spmd.apply import realized_program  # noqa: E402
from rhino.runtime.spmd.runner import predicted_collectives  # noqa: E402
from rhino.search.cluster import load_cluster  # noqa: E402
from rhino.search.mesh import DeviceMesh, parse_mesh  # noqa: E402
from rhino.search.spmd.baselines import data_parallel_plan  # noqa: E402
from rhino.search.spmd.planner import PlanRequest, make_plan  # noqa: E402

DEVICES = 4
MESH = "1x4"
CASES: dict[str, tuple[str, str, dict[str, int]]] = {
    # issue 9's first two: a big batch of small layers, a small batch of wide ones
    "mlp batch4096 hidden64": ("mlp", "tiny", {"batch": 4096}),
    "mlp batch16 hidden4096": ("mlp", "tiny", {"batch": 16, "hidden": 4096}),
    "gpt tiny": ("gpt", "tiny", {}),
    "mlp small": ("mlp", "small", {}),
    "moe tiny": ("moe", "tiny", {}),
    "moe small": ("moe", "small", {}),
    "dnabert tiny": ("dnabert", "tiny", {}),
    "unet tiny": ("unet", "tiny", {}),
    "wresnet tiny": ("wresnet", "tiny", {}),
    "gpt hidden512 2 layers": ("gpt", "hidden512", {"layers": 2}),
    "vgg19 tiny": ("vgg19", "tiny", {}),
    "unet small": ("unet", "small", {}),
    "dnabert small": ("dnabert", "small", {}),
    "gpt medium 2 layers": ("gpt", "medium", {"layers": 2}),
    "moe 8e-380m 2 layers": ("moe", "8e-380m", {"layers": 2}),
}
FIDELITY = 0.05
"""XLA's bytes may differ from the plan's prediction by this share."""
WIRE = {
    "all-reduce": 2 * (DEVICES - 1) / DEVICES,
    "all-gather": (DEVICES - 1) / DEVICES,
    "reduce-scatter": (DEVICES - 1) / DEVICES,
    "all-to-all": (DEVICES - 1) / DEVICES,
    "collective-permute": 1.0,
}
"""Bytes each device sends per byte of a collective's buffer (ring algorithms): a
collective's buffer size alone does not compare across kinds (an all-reduce is a
reduce-scatter then an all-gather of the same buffer, and sends twice what each does)."""


def measured(partitioned: str, mesh: DeviceMesh) -> dict[str, Any]:
    """How many collectives one step runs and their bytes per device by kind."""
    found = measure_collectives(partitioned, mesh)
    by_kind: dict[str, float] = {}
    for c in found:
        by_kind[c.row_kind] = by_kind.get(c.row_kind, 0.0) + c.total_bytes
    return {
        "collectives": len(found),
        "bytes": sum(by_kind.values()),
        "by_kind": by_kind,
        "wire_bytes": sum(b * WIRE[kind] for kind, b in by_kind.items()),
    }


def hand_plan(spec: Any, module: Module, name: str, layout: hand_plans.Layout) -> dict[str, Any]:
    """The hand plan compiled by jax (measured) and its estimate (see module doc)."""
    args = abstract_args(spec)
    devices = Mesh(np.array(jax.devices()[:DEVICES]).reshape(1, DEVICES), ("a", "b"))
    flat = iter(hand_plans.leaves(args))
    ins = jax.tree_util.tree_map(
        lambda _x: NamedSharding(devices, layout(*next(flat), DEVICES)), args
    )
    outs = (NamedSharding(devices, P()), ins[0], ins[1], ins[2], ins[3])  # state keeps its layout
    compiled = (
        jax.jit(make_train_step(spec), in_shardings=ins, out_shardings=outs).lower(*args).compile()
    )
    mesh, cluster = parse_mesh(MESH), load_cluster("m8")
    if name == "data parallel":
        plan = data_parallel_plan(module, mesh, cluster)
    else:
        pins = hand_plans.pins(module, args, layout, DEVICES)
        plan = make_plan(module, PlanRequest(mesh, cluster, pins=pins))
    return {**measured(compiled.as_text(), mesh), "estimated_s": plan.objective_s}


def rhino_plan(module: Module) -> dict[str, Any]:
    """rhino's plan, compiled from the program `--emit-hlo` writes."""
    mesh = parse_mesh(MESH)
    plan = make_plan(module, PlanRequest(mesh, load_cluster("m8")))
    program, _ = realized_program(module, plan)
    compiled = xb.compile_spmd(
        print_module(program), xb.local_devices("cpu", DEVICES), num_partitions=DEVICES
    )
    partitioned = compiled.partitioned_hlo()
    root = program.entry.root
    report = compare(
        predicted_collectives(plan),
        measure_collectives(partitioned, mesh, root=root.name if root else None),
    )
    return {
        **measured(partitioned, mesh),
        "estimated_s": plan.objective_s,
        "predicted_bytes": report.predicted_bytes,
        "fidelity_bytes": report.measured_bytes,
    }


def run_case(name: str) -> dict[str, Any]:
    family, config, overrides = CASES[name]
    spec = zoo.model_spec(family, config, overrides)
    module = parse_module(zoo.hlo_text(spec), f"{family}_{config}.hlo")
    row: dict[str, Any] = {
        "case": name,
        "mesh": MESH,
        "instructions": sum(1 for _ in module.instructions()),
    }
    row["hand"] = {
        plan: hand_plan(spec, module, plan, layout)
        for plan, layout in hand_plans.plans_for(family).items()
    }
    row["rhino"] = rhino_plan(module)
    row["checks"] = checks(row)
    return row


def checks(row: dict[str, Any]) -> dict[str, Any]:
    """The suite's three checks on one case (see module doc)."""
    rhino, hand = row["rhino"], row["hand"]
    best = min(hand, key=lambda p: hand[p]["estimated_s"])
    predicted, got = rhino["predicted_bytes"], rhino["fidelity_bytes"]
    fidelity = got / predicted if predicted else (1.0 if got == 0 else float("inf"))
    fewer_bytes = rhino["wire_bytes"] <= hand[best]["wire_bytes"] * (1 + FIDELITY)
    faster = rhino["estimated_s"] < hand[best]["estimated_s"] * (1 - 1e-9)
    return {
        "best_hand": best,
        "at_or_below_every_hand_estimate": rhino["estimated_s"]
        <= hand[best]["estimated_s"] * (1 + 1e-9),
        "measured_over_predicted": fidelity,
        "fidelity_ok": abs(fidelity - 1.0) <= FIDELITY,
        "bytes": "fewer or equal"
        if fewer_bytes
        else "more, estimated faster"
        if faster
        else "more",
    }


@click.command()
@click.option(
    "--case",
    "cases",
    multiple=True,
    type=click.Choice(sorted(CASES)),
    help="Cases to run (default: all).",
)
@click.option(
    "--out", default="bench/hand_plans.json", show_default=True, type=click.Path(dir_okay=False)
)
def main(cases: tuple[str, ...], out: str) -> None:
    rows = [run_case(name) for name in cases or CASES]
    table = Table(
        title=f"rhino vs hand plans on {MESH} (4 CPU devices): "
        "XLA's collectives per step, bytes per device"
    )
    for col in ("case", "plan", "collectives", "bytes", "sent", "by kind", "estimate", "check"):
        table.add_column(
            col, justify="left" if col in ("case", "plan", "by kind", "check") else "right"
        )
    for row in rows:
        for plan_name, r in [*row["hand"].items(), ("rhino", row["rhino"])]:
            kinds = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(r["by_kind"].items()))
            c = row["checks"]
            check = ""
            if plan_name == "rhino":
                ok = (
                    c["at_or_below_every_hand_estimate"]
                    and c["fidelity_ok"]
                    and c["bytes"] != "more"
                )
                check = (
                    f"{'ok' if ok else 'FAIL'}: best hand {c['best_hand']}, XLA/predicted "
                    f"{c['measured_over_predicted']:.3f}, bytes {c['bytes']}"
                )
            table.add_row(
                row["case"],
                plan_name,
                str(r["collectives"]),
                f"{r['bytes']:,.0f}",
                f"{r['wire_bytes']:,.0f}",
                kinds,
                f"{r['estimated_s'] * 1e6:,.2f} us",
                check,
            )
    console = Console(width=200)
    console.print(table)
    peak = own_peak_rss()
    console.print(f"peak RSS of this process, every case together: {mib(peak)}")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    doc = {"revision": revision("search", "runtime", "scripts"), "rows": rows}
    Path(out).write_text(
        json.dumps({**doc, "peak_rss_bytes": peak}, indent=1, default=json_default)
    )
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()
