"""What `rhino run` runs, and running it: one request, one entry.

    request = RunRequest(module, plan, ...)
    prepare_devices(request) -> DeviceSetup      before jax starts its backends
    execute(request, progress, warn) -> RunReport | PipelineReport

A request runs an SPMD plan (`Plan`: one program sharded over the plan's mesh,
`spmd.runner.run_plan`), or makes one first on `mesh`; or it runs a stage plan (`StagePlan`:
stage s on device s, or on the s-th block of devices of mesh axis 0 with each stage's
programs sharded over the other axes, `pipeline.run.run_pipeline`). Either runs alone
or as one process of a `job` of several.

The devices are chosen through the environment (`XLA_FLAGS`, `JAX_PLATFORMS`), which jax
reads once, when it starts its backends: `prepare_devices` runs before anything starts
them, and afterwards only checks that there are enough.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NoReturn

from rhino.hlo.errors import ConfigError, JobLost, RhinoError
from rhino.hlo.ir import Module
from rhino.hlo.printer import print_module
from rhino.runtime import xla_bridge as xb
from rhino.runtime.environment import jax_plugins, versions
from rhino.runtime.job import HEARTBEAT_S, LOST_S, Job
from rhino.runtime.pipeline.programs import StagePlan
from rhino.runtime.pipeline.report import PipelineReport
from rhino.runtime.pipeline.run import PipelineOptions, run_pipeline
from rhino.runtime.spmd.runner import RunOptions, RunReport, run_plan
from rhino.search.cluster import load_cluster
from rhino.search.mesh import DeviceMesh
from rhino.search.pipeline import check_pipeline_mesh
from rhino.search.spmd.plan import Plan, module_hash

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
"""The XLA flag that makes the CPU platform show this many devices."""


@dataclass(frozen=True)
class RunRequest:
    """A program, the plan to run it by, and how to run, verify and time it."""

    module: Module
    plan: Plan | StagePlan | None
    """An SPMD plan or a stage plan; None: make an SPMD plan first, on `mesh`."""
    mesh: DeviceMesh | None = None
    """Without a plan, the mesh to plan on; with a stage plan, the mesh whose axis 0 the
    stages are (None: the stage plan's own, if it has one)."""
    cluster: str = "m8"
    """Cluster name or YAML file of the plans made here (the SPMD plan made first, or
    each stage's programs' in a hybrid run)."""
    level: str = "O2"
    """Search level of those plans."""
    platform: str | None = None
    """"cpu", "gpu", or None for jax's default."""
    devices: int | None = None
    """CPU devices to simulate (in a job, per process); None: the platform's own."""
    seed: int = 0
    verify: bool = True
    steps: int = 5
    warmup: int = 1
    job: Job | None = None
    """The job of several processes this process is one of; None: alone."""
    schedule: str = "1f1b"
    """A stage plan's schedule: "1f1b" or "gpipe"."""
    microbatches: int | None = None
    """A stage plan's micro-batches per step; None: the plan's."""
    partitioner: str = "shardy"
    """XLA's partitioner for an SPMD plan: "shardy" or "gspmd" (`RunOptions.partitioner`)."""

    def __post_init__(self) -> None:
        if self.plan is None and self.mesh is None:
            raise ConfigError("mesh: a run without a plan needs a mesh to plan on", "mesh")
        if isinstance(self.plan, Plan) and self.mesh not in (None, self.plan.mesh):
            raise ConfigError(
                f"mesh {self.mesh}: the plan is for mesh {self.plan.mesh}; a plan runs on "
                "its own mesh",
                "mesh",
            )


@dataclass(frozen=True)
class DeviceSetup:
    """The request to execute once the devices are chosen, and how they were."""

    request: RunRequest
    """The request, its platform "cpu" where CPU devices are simulated."""
    implied: int | None
    """CPU devices simulated for want of an accelerator (no `devices` asked): what the
    user should be told; None when none were, or `devices` chose them."""


def prepare_devices(request: RunRequest) -> DeviceSetup:
    """Choose the devices before jax starts: `devices` simulated CPU devices (exactly
    that many in a job, whose processes' devices together make the mesh); or, alone on
    a machine without an accelerator plugin for jax, as many as the run needs."""
    if request.devices is not None:
        simulate_cpu_devices(request.devices, exactly=request.job is not None)
        return DeviceSetup(dataclasses.replace(request, platform="cpu"), None)
    if request.job is None and request.platform in (None, "cpu") and not jax_plugins():
        needed = devices_needed(request)
        if needed > 1:
            simulate_cpu_devices(needed, exactly=False)
            return DeviceSetup(dataclasses.replace(request, platform="cpu"), needed)
    return DeviceSetup(request, None)


def devices_needed(request: RunRequest) -> int:
    """The devices a run uses: of `mesh`, else of the plan's mesh, else one a stage."""
    if request.mesh is not None:
        return request.mesh.size
    plan = request.plan
    if isinstance(plan, Plan):
        return plan.mesh.size
    assert plan is not None, "RunRequest refuses a request without a plan or a mesh"
    return plan.mesh.size if plan.mesh else plan.stages


def simulate_cpu_devices(n: int, *, exactly: bool) -> None:
    """Ask XLA for at least n host devices (the run uses the first n), or exactly n in a
    job of several processes, whose devices together make the mesh. Only possible before
    jax starts its backends; afterwards, check that there are enough."""
    if xb.backends_started():  # too late to choose (a job then fails to join, and says why)
        have = xb.device_count("cpu")
        if have < n and not exactly:
            raise ConfigError(
                f"jax is already initialised with {have} CPU devices; run rhino in a fresh process"
            )
        return
    flags = os.environ.get("XLA_FLAGS", "")
    asked = re.search(rf"{DEVICE_COUNT_FLAG}=(\d+)", flags)
    if exactly or asked is None or int(asked.group(1)) < n:
        flags = re.sub(rf"{DEVICE_COUNT_FLAG}=\S*", "", flags).strip()
        os.environ["XLA_FLAGS"] = f"{flags} {DEVICE_COUNT_FLAG}={n}".strip()
        if "jax" in sys.modules:  # XLA may have read its flags already (sources.load)
            xb.set_cpu_device_count(n)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def execute(
    request: RunRequest,
    progress: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> RunReport | PipelineReport:
    """Run the request (module docstring): a `PipelineReport` for a stage plan, else a
    `RunReport`. `progress` hears the phase, `warn` the warnings of a plan made first."""
    say = progress or (lambda _text: None)
    if isinstance(request.plan, StagePlan):
        return _run_stages(request, request.plan, say)
    return _run_spmd(request, say, warn or (lambda _text: None))


def _run_spmd(
    request: RunRequest, say: Callable[[str], None], warn: Callable[[str], None]
) -> RunReport:
    plan = request.plan
    if plan is None:
        assert request.mesh is not None, "RunRequest refuses a request without a plan or a mesh"
        from rhino.search.spmd.planner import PlanRequest, make_plan  # the solvers, to plan

        wanted = PlanRequest(request.mesh, load_cluster(request.cluster), request.level)
        plan = make_plan(request.module, wanted, say)
        for warning in plan.warnings:  # what `rhino plan` would have said of the plan
            warn(warning)
    assert isinstance(plan, Plan)
    options = RunOptions(
        request.platform,
        request.seed,
        request.verify,
        request.steps,
        request.warmup,
        partitioner=request.partitioner,
    )
    job = request.job
    if job is None:
        say("compiling and running")
        return run_plan(request.module, plan, options)
    _check_job_devices(job, request.devices, plan.mesh)
    say(f"joining {job.coordinator} as process {job.process_id} of {job.num_processes}")
    with _joined(job, job_identity(request)):
        say("compiling and running")
        return run_plan(request.module, plan, options)


def _check_job_devices(job: Job, devices: int | None, mesh: DeviceMesh) -> None:
    """`devices` is per process: together the processes must make the plan's mesh."""
    if devices is not None and devices * job.num_processes != mesh.size:
        raise ConfigError(
            f"devices {devices} per process x {job.num_processes} processes = "
            f"{devices * job.num_processes} devices, but the plan's mesh "
            f"{mesh} has {mesh.size}",
            "devices",
        )


def _run_stages(request: RunRequest, plan: StagePlan, say: Callable[[str], None]) -> PipelineReport:
    """Stage s on device s, or, with a mesh (the request's, else the plan's), on the s-th
    block of the devices of mesh axis 0, its programs sharded over the other axes by
    plans made for them. In a job of several processes (on one machine) the stages span
    all of their devices, and arrays move between processes through jax's transfer
    servers (`Job.transfer_address`)."""
    say("compiling the stage programs and running the schedule")
    spmd = None
    per_stage = 1
    mesh = request.mesh or plan.mesh
    if mesh is not None:
        check_pipeline_mesh(mesh, plan.stages)
        if mesh.ndim > 1 and mesh.size > plan.stages:
            rest = DeviceMesh(mesh.shape[1:])
            from rhino.search.spmd.planner import PlanRequest

            spmd = PlanRequest(rest, load_cluster(request.cluster), request.level)
            per_stage = rest.size
    need = plan.stages * per_stage
    job = request.job
    processes = job.num_processes if job else 1
    if request.devices is not None and request.devices * processes < need:
        raise ConfigError(
            f"the stage plan has {plan.stages} stages of {per_stage} device(s), "
            f"but `devices` {request.devices} x {processes} process(es): need {need} "
            "devices"
        )
    options = PipelineOptions(
        request.platform,
        request.seed,
        request.verify,
        request.schedule,
        request.microbatches,
        request.steps,
        request.warmup,
        request.partitioner,
    )
    if job is None:
        return run_pipeline(request.module, plan, options, spmd)
    with _joined(job, job_identity(request), job.transfer_address()):
        return run_pipeline(request.module, plan, options, spmd)


@contextmanager
def _joined(
    job: Job, identity: dict[str, str], transfer_address: str | None = None
) -> Iterator[None]:
    """This process in `job`'s distributed runtime (and out of it again afterwards);
    XLA's own prints go to stderr meanwhile, keeping stdout for the report.

    Once joined, the processes check they were given the same `identity` (versions,
    module, plan, options), before anything compiles; then each watches the others
    (`xla_bridge.JobWatch`): a job that loses a process ends everywhere within about
    `LOST_S`, and a process that fails tells the others, who stop too."""
    with xb.native_stdout_to_stderr():
        try:
            xb.init_distributed(
                job.coordinator,
                job.num_processes,
                job.process_id,
                timeout_s=job.join_timeout_s,
                heartbeat_s=HEARTBEAT_S,
                address=job.host(),
                transfer_address=transfer_address,
            )
        except xb.JoinFailed as exc:
            _stop(str(exc), exc.exit_code)
        watch = xb.JobWatch(job.host(), LOST_S, lambda message: _stop(message, JobLost.exit_code))
        try:
            xb.check_same_job(identity, timeout_s=job.join_timeout_s)
            yield
        except BaseException as exc:
            if not isinstance(exc, RhinoError | KeyboardInterrupt):
                # XLA's error when a peer dies inside a collective ("connection closed"):
                # named as what it is where the watch finds the peer gone
                watch.confirm(LOST_S + 1)
            watch.stop(failure=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            raise
        watch.stop()
        xb.shutdown_distributed()


def job_identity(request: RunRequest) -> dict[str, str]:
    """What every process of a job must share: the versions it runs, the module, the
    plan and the run options (digests where long)."""
    found = versions()
    plan = request.plan
    plan_text = plan.text() if isinstance(plan, Plan) else repr(plan)
    options = {
        f.name: getattr(request, f.name)
        for f in dataclasses.fields(request)
        if f.name not in ("module", "plan", "job")
    }
    return {
        "rhino version": found["rhino"],
        "jax version": f"jax {found['jax']}, jaxlib {found['jaxlib']}",
        "HLO module (sha256)": module_hash(print_module(request.module)),
        "plan (sha256)": hashlib.sha256(plan_text.encode()).hexdigest()[:16],
        "run options": repr(options),
    }


def _stop(message: str, code: int) -> NoReturn:
    """End this process of a job at once, saying why: its main thread may be blocked in
    a collective that will never return, or jax's client still joining."""
    sys.stdout.flush()
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.flush()
    xb.release_service()
    os._exit(code)
