"""rhino's plan against hand plans, measured through XLA (issue 9's first cases).

    python scripts/bench_hand_plans.py                 # the two MLPs of issue 9 on 1x4
    python scripts/bench_hand_plans.py --out bench/hand_plans.json

For each case (a zoo MLP training step), the hand plans are written with jax shardings
and compiled by `jax.jit` (XLA's SPMD partitioner, its collective combiners included):
data parallel (every batch input split over the devices, weights and Adam state
replicated) and Megatron (the first layer's weight column-split, the second's row-split,
the batch replicated). rhino's plan is compiled from the program `rhino plan --emit-hlo`
writes. Every program's collectives are counted from XLA's partitioned module
(`runtime.fidelity.measure_collectives`): how many, and bytes per device per step by kind
(an all-reduce whose result is only sliced per partition counts as a reduce-scatter, as
on CPU XLA has none).
rhino's estimated step time is printed beside them; the hand plans' estimates need them
written as rhino plans (pins), which this script does not do yet.

Prints a table and writes JSON. Runs on 4 simulated CPU devices.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import click  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from benchlib import json_default, revision  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo  # noqa: E402
from zoo_models.common import abstract_args, make_train_step  # noqa: E402

CASES = {  # issue 9: a big batch of small layers, a small batch of wide ones
    "mlp batch4096 hidden64": {"batch": 4096},
    "mlp batch16 hidden4096": {"batch": 16, "hidden": 4096},
}
BATCH = "[4]"
"""The batch's position among the step's arguments (params, adam_m, adam_v, count, batch)."""


def data_parallel(path: str, _shape: tuple[int, ...]) -> P:
    return P("b") if path.startswith(BATCH) else P()


def megatron(path: str, _shape: tuple[int, ...]) -> P:
    if path.startswith(BATCH):
        return P()
    if path.endswith("[0]['w']"):
        return P(None, "b")  # column split
    if path.endswith("[0]['b']"):
        return P("b")
    if path.endswith("[1]['w']"):
        return P("b", None)  # row split
    return P()


HAND = {"data parallel": data_parallel, "megatron": megatron}


def measured(partitioned: str) -> dict[str, Any]:
    """How many collectives one step runs and their bytes per device by kind."""
    from rhino.runtime.fidelity import measure_collectives
    from rhino.search.mesh import parse_mesh

    found = measure_collectives(partitioned, parse_mesh("1x4"))
    by_kind: dict[str, float] = {}
    for c in found:
        by_kind[c.row_kind] = by_kind.get(c.row_kind, 0.0) + c.total_bytes
    return {"collectives": len(found), "bytes": sum(by_kind.values()), "by_kind": by_kind}


def hand_plan(overrides: dict[str, int], layout: Any) -> dict[str, Any]:
    spec = zoo.model_spec("mlp", "tiny", overrides)
    args = abstract_args(spec)
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(1, 4), ("a", "b"))
    ins = jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, layout(jax.tree_util.keystr(path), x.shape)), args
    )
    outs = (NamedSharding(mesh, P()), ins[0], ins[1], ins[2], ins[3])  # state keeps its layout
    compiled = (
        jax.jit(make_train_step(spec), in_shardings=ins, out_shardings=outs).lower(*args).compile()
    )
    return measured(compiled.as_text())


def rhino_plan(overrides: dict[str, int]) -> dict[str, Any]:
    from rhino.hlo.parser import parse_module
    from rhino.hlo.printer import print_module
    from rhino.runtime import xla_bridge as xb
    from rhino.runtime.apply import realized_program
    from rhino.search.cluster import load_cluster
    from rhino.search.mesh import parse_mesh
    from rhino.search.planner import PlanRequest, make_plan

    module = parse_module(zoo.hlo_text(zoo.model_spec("mlp", "tiny", overrides)), "step.hlo")
    plan = make_plan(module, PlanRequest(parse_mesh("1x4"), load_cluster("m8")))
    program, _ = realized_program(module, plan)
    compiled = xb.compile_spmd(print_module(program), xb.local_devices("cpu", 4), num_partitions=4)
    predicted = sum(c.nbytes * c.count for c in plan.collectives)
    return {**measured(compiled.partitioned_hlo()), "estimated_s": plan.objective_s,
            "predicted_bytes": predicted}  # fmt: skip


@click.command()
@click.option(
    "--out", default="bench/hand_plans.json", show_default=True, type=click.Path(dir_okay=False)
)
def main(out: str) -> None:
    rows = []
    for name, overrides in CASES.items():
        row: dict[str, Any] = {"case": name, "mesh": "1x4"}
        for plan_name, layout in HAND.items():
            row[plan_name] = hand_plan(overrides, layout)
        row["rhino"] = rhino_plan(overrides)
        rows.append(row)
    table = Table(
        title="collectives per step, bytes per device (XLA's partitioned module, 4 CPU devices)"
    )
    for col in ("case", "plan", "collectives", "bytes", "by kind", "rhino estimate"):
        table.add_column(col, justify="left" if col in ("case", "plan", "by kind") else "right")
    for row in rows:
        for plan_name in (*HAND, "rhino"):
            r = row[plan_name]
            kinds = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(r["by_kind"].items()))
            estimate = f"{r['estimated_s'] * 1e6:.2f} us" if "estimated_s" in r else ""
            table.add_row(
                row["case"], plan_name, str(r["collectives"]), f"{r['bytes']:,.0f}", kinds, estimate
            )
    Console(width=160).print(table)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"revision": revision("search", "runtime", "scripts"), "rows": rows},
                                    indent=1, default=json_default))  # fmt: skip
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()
