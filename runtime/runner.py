"""Run a plan: annotate, compile with XLA's SPMD partitioner, verify, measure.

    run_plan(module, plan, options) -> RunReport

The annotated program runs on the plan's number of local devices. With `verify`, the
original program runs on one device with the same inputs (drawn from a seed; each device
creates only its own shards) and every output is compared. Fidelity compares the
collectives XLA put in the partitioned module with the ones the plan predicted. Timing
is the median and spread of `steps` runs after `warmup` runs.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from rhino.hlo.errors import ExecutionError
from rhino.hlo.ir import Module
from rhino.hlo.printer import print_module
from rhino.runtime import xla_bridge as xb
from rhino.runtime.apply import apply_plan, planned_module
from rhino.runtime.fidelity import FidelityReport, PredictedCollective, compare, measure_collectives
from rhino.runtime.inputs import entry_inputs
from rhino.runtime.verify import VerifyReport, run_and_compare
from rhino.search.mesh import DeviceMesh
from rhino.search.plan import Plan


@dataclass(frozen=True)
class RunOptions:
    platform: str | None = None
    """"cpu", "gpu", or None for jax's default."""
    seed: int = 0
    verify: bool = True
    steps: int = 5
    warmup: int = 1
    baseline: bool = True
    """Also time the single-device program (needs `verify`'s compile)."""


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    max_s: float
    steps: int

    @staticmethod
    def of(times: tuple[float, ...]) -> Timing:
        return Timing(statistics.median(times), min(times), max(times), len(times))


@dataclass(frozen=True)
class RunReport:
    mesh: tuple[int, ...]
    devices: tuple[str, ...]
    """The devices used (`cpu:0`, ...)."""
    verify: dict[str, Any] | None
    """ok, and per output its max absolute and relative error."""
    fidelity: dict[str, Any]
    step: Timing
    single_device_step: Timing | None
    memory: dict[str, float]
    """XLA's per-device sizes (argument, output, temp, peak) and the plan's estimate."""
    predicted_step_s: float
    notes: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.verify is None or bool(self.verify["ok"])


def predicted_collectives(plan: Plan) -> list[PredictedCollective]:
    return [
        PredictedCollective(
            c.kind, tuple(c.axes), c.nbytes, c.instruction, c.note, max(1, round(c.count))
        )
        for c in plan.collectives
    ]


def run_plan(module: Module, plan: Plan, options: RunOptions) -> RunReport:
    """Execute `plan` on local devices; verify and measure it (see module doc)."""
    mesh = DeviceMesh(tuple(plan.mesh))
    devices = xb.local_devices(options.platform, mesh.size)
    original = print_module(planned_module(module))
    annotated_module = apply_plan(module, plan)
    annotated = print_module(annotated_module)
    notes = [f"%{i.name}: layout {i.outs[0]} has no XLA sharding; XLA chose its own" for i in plan.instructions
             if i.sharding is None and i.opcode not in ("tuple", "get-tuple-element")]  # fmt: skip
    verify_report: VerifyReport | None = None
    if options.verify:
        verify_report = run_and_compare(original, annotated, devices, options.seed)
        sharded = verify_report.sharded
        reference = verify_report.reference
    else:
        sharded = xb.compile_spmd(annotated, devices, num_partitions=mesh.size)
        reference = None
    if sharded is None:
        raise ExecutionError("the sharded program was not compiled")
    root = annotated_module.entry.root
    measured = measure_collectives(
        sharded.partitioned_hlo(), mesh, root=root.name if root else None
    )
    fidelity: FidelityReport = compare(predicted_collectives(plan), measured)
    inputs = list(entry_inputs(annotated_module, options.seed))
    step = Timing.of(xb.time_execution(sharded, inputs, warmup=options.warmup, steps=options.steps))
    single = None
    if reference is not None and options.baseline:
        whole = [m.whole() for m in inputs]
        single = Timing.of(
            xb.time_execution(reference, whole, warmup=options.warmup, steps=options.steps)
        )
    stats = sharded.memory_stats()
    memory = {
        "argument_bytes": stats.argument_bytes,
        "output_bytes": stats.output_bytes,
        "temp_bytes": stats.temp_bytes,
        "peak_bytes": stats.peak_bytes,
        "plan_peak_bytes": plan.peak_memory_bytes,
    }
    verify_doc = None
    if verify_report is not None:
        verify_doc = {
            "ok": verify_report.ok,
            "summary": verify_report.summary(),
            "outputs": [
                {
                    "index": k,
                    "ok": o.ok,
                    "max_abs_error": o.max_abs_error,
                    "max_rel_error": o.max_rel_error,
                }
                for k, o in enumerate(verify_report.outputs)
            ],
        }
    return RunReport(
        mesh=mesh.shape,
        devices=tuple(str(d) for d in devices),
        verify=verify_doc,
        fidelity=fidelity.to_dict(),
        step=step,
        single_device_step=single,
        memory=memory,
        predicted_step_s=plan.objective_s,
        notes=tuple(notes),
    )
