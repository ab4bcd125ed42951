"""`rhino run`: execute a plan through XLA, verify it, and measure it."""

from __future__ import annotations

import os
import sys

import click
from rich.table import Table

from rhino.cli.common import (
    debug_option,
    emit_json,
    handle_errors,
    human_bytes,
    json_option,
    status,
    stdout,
)
from rhino.hlo.errors import ConfigError, VerificationFailed

EPILOG = """
\b
Examples:
  rhino run examples/mlp.hlo --mesh 2x4                 # plan (O3), then run on 8 devices
  rhino run model.hlo --plan plan.json --steps 20
  rhino run model.hlo --plan plan.json --platform cpu --devices 8 --json
\b
Exit codes: 0 ok, 1 the sharded outputs differ from the single-device run,
2 bad input (a plan for another module or mesh, too few devices, XLA rejected it).
"""


@click.command("run", epilog=EPILOG)
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--plan", "plan_file", type=click.Path(dir_okay=False), help="A plan from `rhino plan --out`."
)
@click.option("--mesh", "mesh_text", help="Plan first, on this mesh (when no --plan).")
@click.option(
    "--opt", "level", default="O3", show_default=True, help="Search level when planning first."
)
@click.option(
    "--cluster", default="m8", show_default=True, help="Cluster model when planning first."
)
@click.option(
    "--platform", type=click.Choice(["cpu", "gpu"]), help="Run on this platform (default: jax's)."
)
@click.option(
    "--devices",
    type=click.IntRange(min=1),
    help="Simulate this many CPU devices (implies --platform cpu).",
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
@json_option
@debug_option
@handle_errors
def run_command(file: str, plan_file: str | None, mesh_text: str | None, level: str, cluster: str,
                platform: str | None, devices: int | None, seed: int, verify: bool, steps: int, warmup: int,
                as_json: bool, debug: bool) -> None:  # fmt: skip
    """Write the plan's shardings into the HLO, compile it with XLA's SPMD partitioner,
    run it on local devices, check it computes what the single-device program computes,
    and compare the collectives XLA inserted with the ones the plan predicted."""
    if (plan_file is None) == (mesh_text is None):
        raise ConfigError("give either --plan FILE or --mesh (to plan first)")
    if devices is not None:
        if platform not in (None, "cpu"):
            raise ConfigError(
                "--devices simulates CPU devices; it cannot be combined with --platform gpu"
            )
        _simulate_cpu_devices(devices)
        platform = "cpu"
    from rhino.hlo.parser import parse_file
    from rhino.hlo.verify import verify as verify_module
    from rhino.runtime.runner import RunOptions, run_plan
    from rhino.search.plan import Plan

    with status(f"running {file}", enabled=not as_json) as update:
        module = parse_file(file)
        verify_module(module)
        if plan_file is not None:
            plan = Plan.read(plan_file)
        else:
            from rhino.search.cluster import load_cluster
            from rhino.search.mesh import parse_mesh
            from rhino.search.planner import PlanRequest, make_plan

            plan = make_plan(
                module,
                PlanRequest(parse_mesh(mesh_text or ""), load_cluster(cluster), level),
                update,
            )
        update("compiling and running")
        report = run_plan(module, plan, RunOptions(platform, seed, verify, steps, warmup))
    if as_json:
        emit_json("run", report.__dict__)
    else:
        render(report)
    if not report.ok:
        raise VerificationFailed(
            report.verify["summary"] if report.verify else "verification failed"
        )


def _simulate_cpu_devices(n: int) -> None:
    """Ask XLA for n host devices; only possible before jax is first imported."""
    if "jax" in sys.modules:
        import jax

        have = len(jax.devices("cpu"))
        if have < n:
            raise ConfigError(
                f"jax is already initialised with {have} CPU devices; run rhino in a fresh process"
            )
        return
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


def render(report) -> None:  # type: ignore[no-untyped-def]
    out = stdout
    mesh = "x".join(map(str, report.mesh))
    out.print(f"mesh {mesh} on {len(report.devices)} devices ({report.devices[0]}, ...)")
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
            row["kind"], str(row["axes"]), human_bytes(predicted), human_bytes(measured), ratio
        )
    out.print(t)
    for message in report.fidelity["messages"][:20]:
        out.print(f"  {message}")
    step = report.step
    line = f"step time: median {_time(step.median_s)} (min {_time(step.min_s)}, max {_time(step.max_s)}, {step.steps} steps)"
    if report.single_device_step is not None:
        line += f"; single device {_time(report.single_device_step.median_s)}"
    out.print(line)
    m = report.memory
    out.print(f"memory per device (XLA): peak {human_bytes(m['peak_bytes'])}, arguments {human_bytes(m['argument_bytes'])}, "
              f"temporaries {human_bytes(m['temp_bytes'])}; plan estimate {human_bytes(m['plan_peak_bytes'])}")  # fmt: skip
    for note in report.notes:
        out.print(f"[yellow]note:[/] {note}")
