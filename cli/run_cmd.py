"""`rhino run`: execute a plan through XLA, verify it, and measure it."""

from __future__ import annotations

import math
import os
import re

import click
from rich.table import Table

from rhino.cli.common import (
    cluster_option,
    debug_option,
    emit_json,
    handle_errors,
    json_option,
    mesh_option,
    opt_option,
    prepare_output,
    status,
    stdout,
)
from rhino.hlo.errors import ConfigError, VerificationFailed
from rhino.runtime import xla_bridge as xb
from rhino.runtime.job import Job
from rhino.search.spmd.plan import Plan
from rhino.search.units import format_bytes, format_seconds

EPILOG = """
\b
Examples:
  rhino run examples/mlp.hlo --mesh 2x4                 # plan (O2), then run on 8 devices
  rhino run model.hlo --plan plan.json --steps 20
  rhino run model.hlo --plan plan.json --platform cpu --devices 8 --json
\b
A stage plan (`rhino pipeline --out stages.json`) runs stage s on device s, one
program per stage for forward, backward and update, over --microbatches micro-batches;
with --mesh (or the mesh of `rhino pipeline --mesh`), the pipeline is mesh axis 0 and
each stage's programs are planned (--opt, --cluster) and sharded over the other axes
(hybrid: here 2 stages x 4 devices); with --coordinator ..., on this machine only:
  rhino run examples/gpt_tiny.hlo --plan stages.json --devices 4 --microbatches 8
  rhino run examples/gpt_tiny.hlo --plan stages.json --devices 4 --schedule gpipe --json
  rhino run examples/gpt_tiny.hlo --plan stages.json --mesh 2x4 --devices 8 --cluster cpu
  for i in 0 1; do rhino run examples/gpt_tiny.hlo --plan stages.json --mesh 2x4 \\
      --devices 4 --coordinator 127.0.0.1:1234 --num-processes 2 --process-id $i & done
\b
Several hosts: the same command on each, with its own --process-id (process 0 serves
at --coordinator); the plan's mesh spans all their devices. Two hosts of 4 GPUs, then
two processes of 4 simulated CPU devices on this machine (plan made for --mesh 2x4):
  rhino run model.hlo --plan plan.json --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0
  for i in 0 1; do rhino run model.hlo --plan plan.json --devices 4 \\
      --coordinator 127.0.0.1:1234 --num-processes 2 --process-id $i & done; wait
\b
Exit codes (`rhino --help` has the table): 0 ok, 1 the sharded outputs differ from the
single-device run, 2 bad input (a plan for another module or mesh, too few devices, XLA
rejected it).
"""


_HOST_PORT = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>[0-9]{1,5})")


def job_of(
    coordinator: str | None, num_processes: int | None, process_id: int | None
) -> Job | None:
    """The job the three options describe (None when none is given).

    Raises ConfigError when only some are given, or a value is out of range."""
    if coordinator is None and num_processes is None and process_id is None:
        return None
    if coordinator is None or num_processes is None or process_id is None:
        given = {
            "--coordinator": coordinator,
            "--num-processes": num_processes,
            "--process-id": process_id,
        }
        missing = [name for name, value in given.items() if value is None]
        raise ConfigError(
            f"--coordinator, --num-processes and --process-id go together; missing "
            f"{', '.join(missing)}"
        )
    if num_processes < 1:
        raise ConfigError(f"--num-processes must be at least 1, got {num_processes}")
    if not 0 <= process_id < num_processes:
        raise ConfigError(
            f"--process-id must be in 0..{num_processes - 1} for --num-processes "
            f"{num_processes}, got {process_id}"
        )
    match = _HOST_PORT.fullmatch(coordinator)
    if match is None or not 1 <= int(match.group("port")) <= 65535:
        raise ConfigError(
            f"--coordinator must be HOST:PORT with a port in 1..65535 (e.g. 10.0.0.1:1234 "
            f"or [::1]:1234), got {coordinator!r}"
        )
    return Job(coordinator, num_processes, process_id)


@click.command("run", epilog=EPILOG)
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--plan", "plan_file", type=click.Path(dir_okay=False), help="A plan from `rhino plan --out`."
)
@mesh_option("Plan first, on this mesh (when no --plan).")
@opt_option("Search level when planning first (`rhino plan --help`).")
@cluster_option("Cluster name (configs/clusters) or YAML file, when planning first.")
@click.option(
    "--platform", type=click.Choice(["cpu", "gpu"]), help="Run on this platform (default: jax's)."
)
@click.option(
    "--devices",
    type=click.IntRange(min=1),
    help="Simulate this many CPU devices (implies --platform cpu); in a job of several "
    "processes, this many per process: together they must make the plan's mesh.",
)
@click.option("--seed", default=0, show_default=True, help="Seed of the inputs.")
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="Compare with the single-device run.",
)
@click.option(
    "--steps", default=5, show_default=True, type=click.IntRange(min=1), help="Timed steps."
)
@click.option(
    "--warmup",
    default=1,
    show_default=True,
    type=click.IntRange(min=0),
    help="Untimed steps first.",
)
@click.option(
    "--coordinator",
    metavar="HOST:PORT",
    help="Run as one process of a job of several (one per host): process 0 serves here.",
)
@click.option("--num-processes", type=int, help="Processes in the job (with --coordinator).")
@click.option("--process-id", type=int, help="This process's index in the job, 0..num-processes-1.")
@click.option(
    "--schedule",
    type=click.Choice(["1f1b", "gpipe"]),
    help="Pipeline schedule of a stage plan [default: 1f1b].",
)
@click.option(
    "--microbatches",
    type=click.IntRange(min=1),
    help="Micro-batches per step of a stage plan [default: the plan's].",
)
@click.option(
    "--gantt",
    type=click.Path(dir_okay=False, writable=True),
    callback=prepare_output,
    help="Draw a stage plan's simulated and measured timelines to this .svg file.",
)
@json_option
@debug_option
@handle_errors
def run_command(
    file: str,
    plan_file: str | None,
    mesh_text: str | None,
    level: str,
    cluster: str,
    platform: str | None,
    devices: int | None,
    seed: int,
    verify: bool,
    steps: int,
    warmup: int,
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    schedule: str | None,
    microbatches: int | None,
    gantt: str | None,
    as_json: bool,
    debug: bool,
) -> None:
    """Write the plan's shardings into the HLO, compile it with XLA's SPMD partitioner,
    run it on local devices, check it computes what the single-device program computes,
    and compare the collectives XLA inserted with the ones the plan predicted.

    With --coordinator, --num-processes and --process-id, every process (host) runs the
    same command with its own --process-id; the plan's mesh spans all of their devices,
    and each process verifies and times its own partitions and prints its own report."""
    from rhino.runtime.stage_programs import is_stage_plan

    if reason := xb.untested_jax():
        click.echo(f"warning: {reason}; `rhino --version` says what it runs on", err=True)
    staged = plan_file is not None and is_stage_plan(plan_file)
    if (plan_file is None) == (mesh_text is None) and not staged:
        raise ConfigError("give either --plan FILE or --mesh (to plan first)")
    job = job_of(coordinator, num_processes, process_id)
    if job is not None and job.num_processes > 1 and plan_file is None:
        raise ConfigError(
            "a job of several processes runs a plan made beforehand: give --plan FILE "
            "(from `rhino plan FILE --mesh ... --out plan.json`), not --mesh"
        )
    early: Plan | None = None  # a plan read for its mesh before jax starts, read once
    if devices is not None:
        if platform not in (None, "cpu"):
            raise ConfigError(
                "--devices simulates CPU devices; it cannot be combined with --platform gpu"
            )
        _simulate_cpu_devices(devices, exactly=job is not None)
        platform = "cpu"
    elif job is None and platform in (None, "cpu") and not xb.jax_plugins():
        # no accelerator here: simulate the mesh's devices on the CPU, as --devices would
        if plan_file is not None and not staged and mesh_text is None:
            early = Plan.read(plan_file)
        needed = _devices_needed(early, plan_file if staged else None, mesh_text)
        if needed > 1:
            if not as_json:
                click.echo(
                    f"note: no accelerator plugin for jax here: running on {needed} "
                    f"simulated CPU devices (as --devices {needed})",
                    err=True,
                )
            _simulate_cpu_devices(needed, exactly=False)
            platform = "cpu"
    from rhino.hlo.parser import parse_file
    from rhino.hlo.verify import verify as verify_module
    from rhino.runtime.runner import RunOptions, run_plan

    if not staged and (schedule is not None or microbatches is not None or gantt is not None):
        raise ConfigError(
            "--schedule, --microbatches and --gantt apply to a stage plan (from "
            "`rhino pipeline --out`)"
        )
    if gantt is not None and not gantt.lower().endswith(".svg"):
        raise ConfigError(f"--gantt {gantt}: expected a .svg file name")
    with status(
        f"reading {file}" if not staged else f"running {file}", enabled=not as_json
    ) as update:
        module = parse_file(file)
        verify_module(module)
        if staged:
            from rhino.cli.run_pipeline import run_stage_plan, show_stage_run
            from rhino.runtime.pipeline_run import PipelineOptions

            assert plan_file is not None
            update("compiling the stage programs and running the schedule")
            staged_options = PipelineOptions(
                platform, seed, verify, schedule or "1f1b", microbatches, steps, warmup
            )
            staged_report = run_stage_plan(
                module, plan_file, staged_options, devices, mesh_text, cluster, level, job
            )
    if staged:
        show_stage_run(staged_report, as_json, gantt)
        return
    with status(f"running {file}", enabled=not as_json) as update:
        if plan_file is not None:
            plan = early if early is not None else Plan.read(plan_file)
        else:
            from rhino.search.cluster import load_cluster
            from rhino.search.mesh import parse_mesh
            from rhino.search.spmd.planner import PlanRequest, make_plan

            plan = make_plan(
                module,
                PlanRequest(parse_mesh(mesh_text or ""), load_cluster(cluster), level),
                update,
            )
            if not as_json:  # what `rhino plan` would have said of the plan
                for warning in plan.warnings:
                    click.echo(f"warning: {warning}", err=True)
        options = RunOptions(platform, seed, verify, steps, warmup)
        if job is None:
            update("compiling and running")
            report = run_plan(module, plan, options)
        else:
            _check_job_devices(job, devices, plan.mesh)
            update(f"joining {job.coordinator} as process {job.process_id} of {job.num_processes}")
            with xb.native_stdout_to_stderr():
                xb.init_distributed(job.coordinator, job.num_processes, job.process_id)
                try:
                    update("compiling and running")
                    report = run_plan(module, plan, options)
                finally:
                    xb.shutdown_distributed()
    if as_json:
        emit_json("run", report.__dict__)
    else:
        render(report)
    if not report.ok:
        raise VerificationFailed(
            report.verify["summary"] if report.verify else "verification failed"
        )


def _check_job_devices(job: Job, devices: int | None, mesh: tuple[int, ...]) -> None:
    """--devices is per process: together the processes must make the plan's mesh."""
    size = math.prod(mesh)
    if devices is not None and devices * job.num_processes != size:
        raise ConfigError(
            f"--devices {devices} per process x {job.num_processes} processes = "
            f"{devices * job.num_processes} devices, but the plan's mesh "
            f"{'x'.join(map(str, mesh))} has {size}"
        )


def _devices_needed(plan: Plan | None, stage_file: str | None, mesh_text: str | None) -> int:
    """The devices a run uses: of --mesh, else of the plan, else of the stage plan."""
    from rhino.runtime.stage_programs import StagePlan
    from rhino.search.mesh import parse_mesh

    if mesh_text is not None:
        return math.prod(parse_mesh(mesh_text).shape)
    if plan is not None:
        return math.prod(plan.mesh)
    assert stage_file is not None
    stages = StagePlan.read(stage_file)
    return math.prod(stages.mesh) if stages.mesh else stages.stages


def _simulate_cpu_devices(n: int, *, exactly: bool) -> None:
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
    flag = "--xla_force_host_platform_device_count"
    flags = os.environ.get("XLA_FLAGS", "")
    asked = re.search(rf"{flag}=(\d+)", flags)
    if exactly or asked is None or int(asked.group(1)) < n:
        flags = re.sub(rf"{flag}=\S*", "", flags).strip()
        os.environ["XLA_FLAGS"] = f"{flags} {flag}={n}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def render(report) -> None:  # type: ignore[no-untyped-def]
    out = stdout
    mesh = "x".join(map(str, report.mesh))
    found = xb.versions()
    out.print(
        f"mesh {mesh} on {len(report.devices)} devices ({report.devices[0]}, ...), "
        f"jax {found['jax']}"
    )
    if report.process_count > 1:
        parts = report.local_partitions
        out.print(
            f"process {report.process_index} of {report.process_count}: partitions "
            f"{', '.join(map(str, parts))} ({report.devices[parts[0]]}, ...); verification "
            f"and step times below are this process's"
        )
    if report.verify is not None:
        mark = "[green]ok[/]" if report.verify["ok"] else "[red]FAILED[/]"
        out.print(f"verification: {mark}: {report.verify['summary']}")
        worst = max(report.verify["outputs"], key=lambda o: o["max_rel_error"], default=None)
        if worst is not None:
            out.print(
                f"  largest errors: abs {worst['max_abs_error']:.3g}, rel {worst['max_rel_error']:.3g} (output {worst['index']})"
            )
    t = Table(
        title="collectives: predicted vs measured (bytes per device per step)", title_justify="left"
    )
    for col in ("kind", "axes", "predicted", "measured", "ratio"):
        t.add_column(col, justify="left" if col in ("kind", "axes") else "right")
    for row in report.fidelity["by_kind_axes"]:
        predicted, measured = row["predicted_bytes"], row["measured_bytes"]
        ratio = f"{measured / predicted:.2f}" if predicted else "-"
        t.add_row(
            row["kind"], str(row["axes"]), format_bytes(predicted), format_bytes(measured), ratio
        )
    if report.fidelity["by_kind_axes"]:
        out.print(t)
    else:
        out.print("collectives: none predicted, none measured")
    for message in report.fidelity["messages"][:20]:
        out.print(f"  {message}")
    step = report.step
    line = f"step time: median {format_seconds(step.median_s)} (min {format_seconds(step.min_s)}, max {format_seconds(step.max_s)}, {step.steps} steps)"
    if report.single_device_step is not None:
        line += f"; single device {format_seconds(report.single_device_step.median_s)}"
    line += (
        f"; the plan's estimate {format_seconds(report.predicted_step_s)} (its cluster, "
        f"no fixed cost per kernel; XLA runs {report.kernels} kernels a step)"
    )
    out.print(line)
    m = report.memory
    out.print(
        f"memory per device (XLA): total {format_bytes(m['total_bytes'])} (arguments {format_bytes(m['argument_bytes'])}, "
        f"outputs {format_bytes(m['output_bytes'])}, temporaries {format_bytes(m['temp_bytes'])}; reported peak "
        f"{format_bytes(m['peak_bytes'])}); plan estimate {format_bytes(m['plan_peak_bytes'])}"
    )
    for note in report.notes:
        out.print(f"[yellow]note:[/] {note}")
