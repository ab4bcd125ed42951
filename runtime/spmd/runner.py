"""Run a plan: annotate, compile with XLA's SPMD partitioner, verify, measure.

    run_plan(module, plan, options) -> RunReport

The annotated program is compiled through Shardy, jax's partitioner (its shardings in the
sdy dialect, `apply.shardy_program`), or through GSPMD (`RunOptions.partitioner`;
`compile_realized`), and runs on the first mesh-size devices of the job. With `verify`, the
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
from dataclasses import asdict, dataclass, field
from typing import Any

from rhino.hlo.errors import ConfigError, ExecutionError
from rhino.hlo.ir import Module
from rhino.hlo.printer import print_module
from rhino.runtime import xla_bridge as xb
from rhino.runtime.fidelity import (
    FidelityReport,
    PredictedCollective,
    compare,
    kernel_launches,
    measure_collectives,
    parse_partitioned,
)
from rhino.runtime.inputs import entry_inputs
from rhino.runtime.spmd.apply import (
    dropped_notes,
    planned_module,
    realized_program,
    shardy_program,
)
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
    partitioner: str = "shardy"
    """"shardy": the plan as Shardy shardings (`realized_stablehlo`), partitioned by XLA's
    Shardy partitioner, as jax does; "gspmd": the annotated HLO through GSPMD. Shardy
    falls back to GSPMD, with a note, where the module holds a sharding Shardy cannot
    take (PARTITIONERS)."""

    def __post_init__(self) -> None:
        if self.partitioner not in PARTITIONERS:
            raise ConfigError(
                f"partitioner {self.partitioner!r}: expected one of {', '.join(PARTITIONERS)}"
            )


PARTITIONERS = ("shardy", "gspmd")
"""XLA's SPMD partitioners a plan compiles through, the default first."""


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
class MemoryReport:
    """XLA's sizes per device of the compiled program, and the plan's estimate."""

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    peak_bytes: int
    """XLA's reported peak (on CPU: arguments plus outputs, the temporaries left out)."""
    total_bytes: int
    """What XLA's buffer assignment allocates in all: arguments, outputs (less those
    aliased to arguments) and temporaries."""
    plan_peak_bytes: float
    """The plan's estimate of the peak."""


@dataclass(frozen=True)
class RunReport:
    mesh: DeviceMesh
    devices: tuple[str, ...]
    """The devices used (`cpu:0`, ...)."""
    verify: VerifyReport | None
    """ok, and per output its max absolute and relative error."""
    fidelity: FidelityReport
    step: Timing
    single_device_step: Timing | None
    memory: MemoryReport
    predicted_step_s: float
    """The plan's estimate for its cluster (the search's objective)."""
    kernels: int
    """Kernels XLA's compiled program launches per step (`fidelity.kernel_launches`):
    what the fixed cost per kernel, which the estimate leaves out, multiplies."""
    partitioner: str
    """The partitioner that compiled the program ("shardy" or "gspmd": the one asked
    for, or "gspmd" after Shardy's fall-back, which `notes` then explain)."""
    notes: tuple[str, ...] = field(default=())
    process_index: int = 0
    """This process's index in a job of several (`--process-id`); 0 when alone."""
    process_count: int = 1
    """Processes in the job; `step`, `single_device_step` and `verify` are this process's."""
    local_partitions: tuple[int, ...] = ()
    """The partitions (indices into `devices`) this process fed, verified and timed."""

    @property
    def ok(self) -> bool:
        return self.verify is None or self.verify.ok

    def to_json(self) -> dict[str, Any]:
        """The report as `rhino run --json` prints it."""
        return {
            "mesh": self.mesh.to_json(),
            "devices": list(self.devices),
            "verify": None if self.verify is None else self.verify.to_json(),
            "fidelity": self.fidelity.to_dict(),
            "step": asdict(self.step),
            "single_device_step": None
            if self.single_device_step is None
            else asdict(self.single_device_step),
            "memory": asdict(self.memory),
            "predicted_step_s": self.predicted_step_s,
            "kernels": self.kernels,
            "partitioner": self.partitioner,
            "notes": list(self.notes),
            "process_index": self.process_index,
            "process_count": self.process_count,
            "local_partitions": list(self.local_partitions),
        }


def predicted_collectives(plan: Plan) -> list[PredictedCollective]:
    return [
        PredictedCollective(
            c.kind, tuple(c.axes), c.nbytes, c.instruction, c.note, max(1, round(c.count))
        )
        for c in plan.collectives
    ]


def run_plan(module: Module, plan: Plan, options: RunOptions) -> RunReport:
    """Execute `plan` on the job's devices; verify and measure it (see module doc)."""
    mesh = plan.mesh
    process = xb.process_info()
    devices = _mesh_devices(options.platform, mesh, process)
    original = print_module(planned_module(module))
    annotated_module, realized_notes = realized_program(module, plan)
    annotated = print_module(annotated_module)
    digest = hashlib.sha256(f"{annotated}\n{options!r}".encode()).hexdigest()[:16]
    xb.check_agreement("plan and run options (digest)", digest)
    notes = list(realized_notes)
    inputs = entry_inputs(annotated_module, options.seed)
    sharded, partitioner, compile_notes = compile_realized(
        annotated_module, mesh, devices, partitioner=options.partitioner
    )
    notes += compile_notes
    reference = None
    verify_report: VerifyReport | None = None
    if options.verify:
        reference = xb.compile_reference(original, xb.local_devices(options.platform, 1)[0])
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
    memory = MemoryReport(
        argument_bytes=stats.argument_bytes,
        output_bytes=stats.output_bytes,
        temp_bytes=stats.temp_bytes,
        peak_bytes=stats.peak_bytes,
        total_bytes=stats.argument_bytes
        + stats.output_bytes
        - stats.alias_bytes
        + stats.temp_bytes,
        plan_peak_bytes=plan.peak_memory_bytes,
    )
    return RunReport(
        mesh=mesh,
        devices=tuple(str(d) for d in devices),
        verify=verify_report,
        fidelity=fidelity,
        step=step,
        single_device_step=single,
        memory=memory,
        predicted_step_s=plan.objective_s,
        kernels=kernel_launches(partitioned),
        partitioner=partitioner,
        notes=tuple(notes),
        process_index=process.index,
        process_count=process.count,
        local_partitions=sharded.addressable,
    )


SHARDY_REFUSAL = "expected CustomCallOp with a sharding attribute"
"""What jax 0.12.0.1's Shardy pipeline says of some programs 0.10.2 compiles: sharding
constraints inside a while loop whose body the StableHLO export outlines as a function
(jax.random's threefry loop; BRIDGE_NOTES.md). `compile_realized` then goes through GSPMD."""


def compile_realized(
    annotated: Module,
    mesh: DeviceMesh,
    devices: tuple[Any, ...],
    *,
    partitioner: str = "shardy",
    optimize: bool = True,
) -> tuple[xb.Compiled, str, list[str]]:
    """An annotated program (`realized_program`'s) compiled for `mesh` on `devices` by the
    partitioner asked for; returns it, the partitioner that compiled it, and notes.

    Shardy (the default, jax's) gets the program as `shardy_program` writes it; it falls
    back to GSPMD, with notes saying why, when a sharding of the program has no Shardy
    form on `mesh` (none of rhino's own layouts has none; a sharding the input module
    brought may). "gspmd" compiles the annotated HLO as it is (`xla_bridge.compile_spmd`).
    """
    notes: list[str] = []
    if partitioner == "shardy":
        converted = shardy_program(annotated, mesh)
        if not converted.dropped:
            try:
                compiled = xb.compile_shardy(converted.text, devices, optimize=optimize)
                return compiled, "shardy", notes
            except ExecutionError as exc:
                if SHARDY_REFUSAL not in str(exc):
                    raise
                notes.append(
                    "this jax's Shardy pipeline refused the program (constraints in a while "
                    f"loop's body called as a function: {SHARDY_REFUSAL!r}): compiled "
                    "through GSPMD instead (as --partitioner gspmd)"
                )
        else:
            notes.extend(dropped_notes(converted.dropped))
            notes.append(
                f"{len(converted.dropped)} sharding(s) have no Shardy form: compiled through "
                "GSPMD instead (as --partitioner gspmd), which takes them all"
            )
    text = print_module(annotated)
    compiled = xb.compile_spmd(text, devices, num_partitions=mesh.size, optimize=optimize)
    return compiled, "gspmd", notes


def _mesh_devices(
    platform: str | None, mesh: DeviceMesh, process: xb.ProcessInfo
) -> tuple[Any, ...]:
    """The mesh's devices: the first mesh-size ones of this process, or, in a job of
    several processes, all of the job's (each process must drive some partitions)."""
    if process.count > 1:
        total = xb.device_count(platform)
        if total != mesh.size:
            raise ExecutionError(
                f"the plan's mesh {mesh} has {mesh.size} devices "
                f"but the {process.count} processes of this job have {total} in all; a job "
                f"of several processes runs on all of its devices"
            )
    return xb.global_devices(platform, mesh.size)
