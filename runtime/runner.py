"""Run a plan: annotate, compile with XLA's SPMD partitioner, verify, measure.

    run_plan(module, plan, options) -> RunReport

The annotated program runs on the first mesh-size devices of the job. With `verify`, the
original program runs on one device with the same inputs (drawn from a seed; each device
creates only its own shards) and every output shard is compared with the same piece of
the single-device output. Fidelity compares the collectives XLA put in the partitioned
module with the ones the plan predicted. Timing is the median and spread of `steps` runs
after `warmup` runs.

Several processes (hosts), joined by `xla_bridge.init_distributed`, run a plan the same
way: each calls `run_plan` with the same module, plan and options (checked through the
coordinator before anything is compiled), the mesh spans every process's devices, and
each process feeds, verifies and times only its own partitions, against a single-device
reference it runs locally on its own first device (inputs are a function of the seed, so
every process computes the same reference). The partitioned module, hence the fidelity
reading and XLA's memory sizes, is the same in every process.
"""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass, field
from typing import Any

from rhino.hlo.errors import ExecutionError
from rhino.hlo.ir import Module
from rhino.hlo.printer import print_module
from rhino.runtime import xla_bridge as xb
from rhino.runtime.apply import planned_module, realized_program
from rhino.runtime.fidelity import (
    FidelityReport,
    PredictedCollective,
    compare,
    kernel_launches,
    measure_collectives,
    parse_partitioned,
)
from rhino.runtime.inputs import entry_inputs
from rhino.runtime.verify import VerifyReport, reduction_lengths, verify_shards
from rhino.search.mesh import DeviceMesh
from rhino.search.spmd.plan import Plan


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
    """The plan's estimate for its cluster (the search's objective)."""
    kernels: int
    """Kernels XLA's compiled program launches per step (`fidelity.kernel_launches`):
    what the fixed cost per kernel, which the estimate leaves out, multiplies."""
    notes: tuple[str, ...] = field(default=())
    process_index: int = 0
    """This process's index in a job of several (`--process-id`); 0 when alone."""
    process_count: int = 1
    """Processes in the job; `step`, `single_device_step` and `verify` are this process's."""
    local_partitions: tuple[int, ...] = ()
    """The partitions (indices into `devices`) this process fed, verified and timed."""

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
    """Execute `plan` on the job's devices; verify and measure it (see module doc)."""
    mesh = DeviceMesh(tuple(plan.mesh))
    process = xb.process_info()
    devices = _mesh_devices(options.platform, mesh, process)
    original = print_module(planned_module(module))
    annotated_module, realized_notes = realized_program(module, plan)
    annotated = print_module(annotated_module)
    digest = hashlib.sha256(f"{annotated}\n{options!r}".encode()).hexdigest()[:16]
    xb.check_agreement("plan and run options (digest)", digest)
    notes = list(realized_notes)
    inputs = entry_inputs(annotated_module, options.seed)
    sharded = xb.compile_spmd(annotated, devices, num_partitions=mesh.size)
    reference = None
    verify_report: VerifyReport | None = None
    if options.verify:
        reference = xb.compile_spmd(
            original, xb.local_devices(options.platform, 1), num_partitions=1
        )
        verify_report = verify_shards(
            reference, sharded, inputs, options.seed, lengths=reduction_lengths(module)
        )
    root = annotated_module.entry.root
    partitioned = parse_partitioned(sharded.partitioned_hlo())
    measured = measure_collectives(partitioned, mesh, root=root.name if root else None)
    fidelity: FidelityReport = compare(predicted_collectives(plan), measured)
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
        # what XLA's buffer assignment allocates per device in all: on CPU `peak_bytes`
        # is arguments plus outputs and leaves the temporaries out
        "total_bytes": stats.argument_bytes
        + stats.output_bytes
        - stats.alias_bytes
        + stats.temp_bytes,
        "plan_peak_bytes": plan.peak_memory_bytes,
    }
    return RunReport(
        mesh=mesh.shape,
        devices=tuple(str(d) for d in devices),
        verify=None if verify_report is None else _verify_doc(verify_report),
        fidelity=fidelity.to_dict(),
        step=step,
        single_device_step=single,
        memory=memory,
        predicted_step_s=plan.objective_s,
        kernels=kernel_launches(partitioned),
        notes=tuple(notes),
        process_index=process.index,
        process_count=process.count,
        local_partitions=sharded.addressable,
    )


def _verify_doc(report: VerifyReport) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "summary": report.summary(),
        "outputs": [
            {
                "index": k,
                "ok": o.ok,
                "max_abs_error": o.max_abs_error,
                "max_rel_error": o.max_rel_error,
            }
            for k, o in enumerate(report.outputs)
        ],
    }


def _mesh_devices(
    platform: str | None, mesh: DeviceMesh, process: xb.ProcessInfo
) -> tuple[Any, ...]:
    """The mesh's devices: the first mesh-size ones of this process, or, in a job of
    several processes, all of the job's (each process must drive some partitions)."""
    if process.count > 1:
        total = xb.device_count(platform)
        if total != mesh.size:
            raise ExecutionError(
                f"the plan's mesh {'x'.join(map(str, mesh.shape))} has {mesh.size} devices "
                f"but the {process.count} processes of this job have {total} in all; a job "
                f"of several processes runs on all of its devices"
            )
    return xb.global_devices(platform, mesh.size)
