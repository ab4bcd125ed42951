"""`rhino run`: execute a plan through XLA, verify it, and measure it."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.markup import escape
from rich.table import Table

from rhino.cli.common import (
    cluster_option,
    debug_option,
    emit_json,
    gantt_option,
    handle_errors,
    input_argument,
    job_options,
    json_option,
    load_input,
    mesh_option,
    opt_option,
    status,
    stdout,
)
from rhino.cli.flags import in_flags
from rhino.hlo.errors import ConfigError, VerificationFailed
from rhino.hlo.verify import verify as verify_module
from rhino.runtime.environment import untested_jax, versions
from rhino.runtime.job import JOIN_TIMEOUT_S, Job
from rhino.search.mesh import parse_mesh
from rhino.search.spmd.plan import Plan
from rhino.search.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from rhino.runtime.fidelity import KindAxesTotal
    from rhino.runtime.spmd.runner import RunReport

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
(hybrid: here 2 stages x 4 devices), on one host or several (--coordinator ...):
  rhino run examples/gpt_tiny.hlo --plan stages.json --devices 4 --microbatches 8
  rhino run examples/gpt_tiny.hlo --plan stages.json --devices 4 --schedule gpipe --json
  rhino run examples/gpt_tiny.hlo --plan stages.json --mesh 2x4 --devices 8 --cluster cpu
  for i in 0 1; do rhino run examples/gpt_tiny.hlo --plan stages.json --mesh 2x4 \\
      --devices 4 --coordinator 127.0.0.1:1234 --num-processes 2 --process-id $i & done
\b
Several hosts: the same command on each, with its own --process-id (process 0 serves
at --coordinator); the plan's mesh spans all their devices. Each host is reached at the
address it reaches the coordinator from (--address HOST[:PORT] to choose another: its
collectives listen there, and a stage plan's transfer server at PORT). Two hosts of 4 GPUs, then
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
_HOST = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)")


def job_of(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    address: str | None = None,
    join_timeout_s: int = JOIN_TIMEOUT_S,
) -> Job | None:
    """The job the options describe (None when none of the first three is given).

    Raises ConfigError when only some are given, or a value is out of range."""
    if coordinator is None and num_processes is None and process_id is None:
        if address is not None:
            raise ConfigError("--address belongs to a job of several processes (--coordinator)")
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
    if address is not None:
        match = _HOST_PORT.fullmatch(address) or _HOST.fullmatch(address)
        port = match.groupdict().get("port") if match else None
        if match is None or (port is not None and not 1 <= int(port) <= 65535):
            raise ConfigError(
                f"--address must be HOST or HOST:PORT with a port in 1..65535 (e.g. "
                f"10.0.0.2 or 10.0.0.2:1240), got {address!r}"
            )
    return Job(coordinator, num_processes, process_id, address, join_timeout_s)


@click.command("run", epilog=EPILOG)
@input_argument
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
@job_options
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
    "--partitioner",
    type=click.Choice(["shardy", "gspmd"]),
    help="XLA's SPMD partitioner for an SPMD plan and a hybrid pipeline's stages [default: "
    "shardy, as jax's; gspmd: the annotated HLO through GSPMD, which logs its "
    "deprecation]. Shardy falls back to GSPMD, with a note, for a sharding it cannot take.",
)
@click.option(
    "--processes",
    type=click.IntRange(min=2),
    help="Start every process of a job of this many on this machine (a simulated "
    "multi-host job, each with --devices devices, on a free loopback port) and wait for "
    "them all.",
)
@click.option(
    "--logs",
    type=click.Path(file_okay=False),
    help="With --processes: the folder for each process's output (process-I.out, "
    "process-I.err) [default: a new temporary folder].",
)
@gantt_option("Draw a stage plan's simulated and measured timelines to this .svg file.")
@json_option
@debug_option
@handle_errors
def run_command(
    file: str,
    module_name: str | None,
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
    address: str | None,
    join_timeout: int,
    schedule: str | None,
    microbatches: int | None,
    partitioner: str | None,
    processes: int | None,
    logs: str | None,
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
    # the runtime is imported here, not with the CLI: every other command starts faster
    from rhino.cli.run_pipeline import show_stage_run
    from rhino.runtime.pipeline.programs import StagePlan, is_stage_plan
    from rhino.runtime.pipeline.report import PipelineReport
    from rhino.runtime.request import RunRequest, execute, prepare_devices

    if reason := untested_jax():
        click.echo(f"warning: {reason}; `rhino --version` says what it runs on", err=True)
    staged = plan_file is not None and is_stage_plan(plan_file)
    if (plan_file is None) == (mesh_text is None) and not staged:
        raise ConfigError("give either --plan FILE or --mesh (to plan first)")
    if processes is not None or logs is not None:
        _launch(file, plan_file, processes, logs, job_of(coordinator, num_processes, process_id))
        return
    job = job_of(coordinator, num_processes, process_id, address, join_timeout)
    _check_options(plan_file, job, platform, devices)
    if not staged and (schedule is not None or microbatches is not None or gantt is not None):
        raise ConfigError(
            "--schedule, --microbatches and --gantt apply to a stage plan (from "
            "`rhino pipeline --out`)"
        )
    if gantt is not None and not gantt.lower().endswith(".svg"):
        raise ConfigError(f"--gantt {gantt}: expected a .svg file name")
    plan: Plan | StagePlan | None = None
    if plan_file is not None:
        plan = StagePlan.read(plan_file) if staged else Plan.read(plan_file)
    with status(f"reading {file}", enabled=not as_json):
        loaded = load_input(file, module_name)
        module = loaded.module
        verify_module(module)
    request = RunRequest(
        module,
        plan,
        mesh=parse_mesh(mesh_text) if mesh_text is not None else None,
        cluster=cluster,
        level=level,
        platform=platform,
        devices=devices,
        seed=seed,
        verify=verify,
        steps=steps,
        warmup=warmup,
        job=job,
        schedule=schedule or "1f1b",
        microbatches=microbatches,
        partitioner=partitioner or "shardy",
    )
    setup = prepare_devices(request)
    if setup.implied is not None and not as_json:
        click.echo(
            f"note: no accelerator plugin for jax here: running on {setup.implied} "
            f"simulated CPU devices (as --devices {setup.implied})",
            err=True,
        )
    with status(f"running {file}", enabled=not as_json) as update:
        report = execute(setup.request, update, None if as_json else _warn)
    if isinstance(report, PipelineReport):
        show_stage_run(report, as_json, gantt, loaded.to_json() if as_json else None)
        return
    if as_json:
        emit_json("run", {**report.to_json(), "input": loaded.to_json()})
    else:
        render(report)
    if not report.ok:
        raise VerificationFailed(
            report.verify.summary() if report.verify else "verification failed"
        )


def _launch(
    file: str, plan_file: str | None, processes: int | None, logs: str | None, job: Job | None
) -> None:
    """--processes: this same command as every process of a job on this machine."""
    from rhino.runtime.launch import job_exit_code, launch_local, log_folder

    if processes is None:
        raise ConfigError("--logs goes with --processes (the processes it keeps the logs of)")
    if job is not None:
        raise ConfigError(
            "--processes starts the processes of a job itself: leave out --coordinator, "
            "--num-processes and --process-id"
        )
    if plan_file is None:
        raise ConfigError("a job of several processes runs a plan made beforehand: give --plan")
    context = click.get_current_context()
    as_json = bool(context.params["as_json"])
    command = ["run", file, *_forwarded(context), "--json"]
    folder = log_folder(logs)
    with status(f"running {file} as {processes} processes", enabled=not as_json) as update:
        ended = launch_local(command, processes, folder, progress=update)
    reports = [_report_of(e.stdout) for e in ended]
    if as_json:
        emit_json(
            "run.local_job",
            {
                "logs": str(folder),
                "processes": [
                    {**e.to_json(), "report": r} for e, r in zip(ended, reports, strict=True)
                ],
            },
        )
    else:
        t = Table(title=f"{processes} processes; logs in {folder}", title_justify="left")
        for col in ("process", "exit", "seconds", "verification", "log"):
            t.add_column(col, justify="right" if col in ("exit", "seconds") else "left")
        for e, r in zip(ended, reports, strict=True):
            verified = (r or {}).get("verify") or {}
            summary = str(verified.get("summary", "-")) if verified else "-"
            ended_as = f"{e.exit_code}" + (" (killed)" if e.killed else "")
            t.add_row(str(e.process), ended_as, f"{e.seconds:.1f}", summary, e.stderr.name)
        stdout.print(t)
        for e in ended:
            if e.exit_code != 0:
                lines = [ln for ln in _tail(e.stderr) if ln.startswith("error:")]
                if lines:
                    click.echo(f"process {e.process}: {lines[-1]}", err=True)
    code = job_exit_code(ended)
    if code:
        sys.exit(code)  # each failed process's message is above


_NOT_FORWARDED = ("file", "processes", "logs", "as_json", "debug", "gantt", "join_timeout")


def _forwarded(context: click.Context) -> list[str]:
    """The command's options as given (those that differ from their defaults), as
    arguments for each process."""
    found = []
    for param in context.command.params:
        if not isinstance(param, click.Option) or param.name in _NOT_FORWARDED:
            continue
        value = context.params.get(param.name)
        if value is None or value == param.default or value == ():
            continue
        if param.is_flag and param.secondary_opts:  # --verify/--no-verify
            found.append(param.opts[0] if value else param.secondary_opts[0])
        elif param.is_flag:
            found.append(param.opts[0])
        else:
            found.append(f"{param.opts[0]}={value}")
    return found


def _report_of(path: Path) -> dict[str, Any] | None:
    """A process's --json report, if it wrote a whole one."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _tail(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-50:]
    except OSError:
        return []


def _check_options(
    plan_file: str | None, job: Job | None, platform: str | None, devices: int | None
) -> None:
    """Refuse a job that plans first, and simulated devices on a GPU."""
    if job is not None and job.num_processes > 1 and plan_file is None:
        raise ConfigError(
            "a job of several processes runs a plan made beforehand: give --plan FILE "
            "(from `rhino plan FILE --mesh ... --out plan.json`), not --mesh"
        )
    if devices is not None and platform not in (None, "cpu"):
        raise ConfigError(
            "--devices simulates CPU devices; it cannot be combined with --platform gpu"
        )


def _warn(warning: str) -> None:
    click.echo(f"warning: {in_flags(warning)}", err=True)


def render(report: RunReport) -> None:
    out = stdout
    found = versions()
    out.print(
        f"mesh {report.mesh} on {len(report.devices)} devices ({report.devices[0]}, ...), "
        f"jax {found['jax']}, partitioned by {report.partitioner}"
    )
    if report.process_count > 1:
        parts = report.local_partitions
        out.print(
            f"process {report.process_index} of {report.process_count}: partitions "
            f"{', '.join(map(str, parts))} ({report.devices[parts[0]]}, ...); verification "
            f"and step times below are this process's"
        )
    if report.verify is not None:
        mark = "[green]ok[/]" if report.verify.ok else "[red]FAILED[/]"
        out.print(f"verification: {mark}: {report.verify.summary()}")
        worst = max(report.verify.outputs, key=lambda o: o.max_rel_error, default=None)
        if worst is not None:
            out.print(
                f"  largest errors: abs {worst.max_abs_error:.3g}, rel "
                f"{worst.max_rel_error:.3g} (output {worst.index})"
            )
    t = Table(
        title="collectives: predicted vs measured (bytes per device per step)", title_justify="left"
    )
    for col in ("kind", "axes", "predicted", "measured", "ratio"):
        t.add_column(col, justify="left" if col in ("kind", "axes") else "right")
    fidelity = report.fidelity
    for row in fidelity.by_kind_axes:
        predicted, measured = row.predicted_bytes, row.measured_bytes
        ratio = f"{measured / predicted:.2f}" if predicted else "-"
        t.add_row(row.kind, _axes(row), format_bytes(predicted), format_bytes(measured), ratio)
    if fidelity.by_kind_axes:
        out.print(t)
    else:
        out.print("collectives: none predicted, none measured")
    for message in fidelity.messages()[:20]:
        out.print(f"  {message}")
    step = report.step
    line = (
        f"step time: median {format_seconds(step.median_s)} (min {format_seconds(step.min_s)}, "
        f"max {format_seconds(step.max_s)}, {step.steps} steps)"
    )
    if report.single_device_step is not None:
        line += f"; single device {format_seconds(report.single_device_step.median_s)}"
    line += (
        f"; the plan's estimate {format_seconds(report.predicted_step_s)} (its cluster, "
        f"no fixed cost per kernel; XLA runs {report.kernels} kernels a step)"
    )
    out.print(line)
    m = report.memory
    out.print(
        f"memory per device (XLA): total {format_bytes(m.total_bytes)} (arguments "
        f"{format_bytes(m.argument_bytes)}, outputs {format_bytes(m.output_bytes)}, "
        f"temporaries {format_bytes(m.temp_bytes)}; reported peak "
        f"{format_bytes(m.peak_bytes)}); plan estimate {format_bytes(m.plan_peak_bytes)}"
    )
    for note in report.notes:
        out.print(f"[yellow]note:[/] {escape(note)}")


def _axes(row: KindAxesTotal) -> str:
    """A row's mesh axes as the JSON report writes them: `[0, 1]`, or "unmatched"."""
    return str(list(row.axes)) if row.axes is not None else "unmatched"
