#!/usr/bin/env python
"""Does rhino work on this machine's jax and device? Plan, run and pipeline the examples on
one device, and check what rhino predicts against what XLA does there.

    bash scripts/gpu_check.sh                          # a GPU machine's own jax (see there)
    python scripts/gpu_check.py                        # rhino installed already
    python scripts/gpu_check.py --platform cpu --examples mlp,gpt_tiny --out check.json

The same command runs on a GPU or, where jax has none, on the CPU. Steps:

    calibrate  this device's achievable rates, measured with jax: an f32 and a bf16
               matrix product (FLOP/s), a streaming multiply (memory bytes/s), and the
               fixed cost of one kernel (a chain of small dependent products: the time
               per kernel XLA's compiled program launches, counted by rhino's parser).
               They make the cluster file `this_device.yaml` the plans are made for.
    plan, run  each example: `rhino plan --mesh 1 --cluster this_device.yaml`, then
               `rhino run --plan` on one device of the platform.
    pipeline   one example (--pipeline): `rhino pipeline --stages 1 --microbatches 2`, then
               `rhino run` of that stage plan (forward, backward and update programs run
               by the 1F1B controller).

Checks; any that fails prints FAILED with the numbers and the script exits 1:

    verify     the outputs equal the single-device program's (rhino run's own check;
               for a stage plan, the micro-batched programs against the whole step)
    bytes      collective bytes per step predicted == measured (none on one device); for
               the stage plan, bytes between stages predicted == planned == measured, and
               every stage ran its tasks in the planned order
    memory     XLA's bytes per device (arguments + outputs + temporaries) within
               [1/2, 2] x the plan's estimate of its peak
    time       the measured median step within [1/8, 8] x the prediction: the plan's
               estimate for this device plus XLA's kernels x the fixed cost of one (the
               plan's own estimate, a roofline per instruction, leaves that cost out;
               both parts are reported); for the stage plan, the step simulated from the
               measured task times within [2/3, 3/2] x the measured step

It prints a table of predicted against measured per example and writes JSON (--out).
Exit codes: 0 every check passed, 1 a check failed, 2 bad arguments or no device.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import ROOT, revision

from rhino.search.units import format_bytes, format_seconds

EXAMPLES = ("mlp", "gpt_tiny", "vgg19_tiny", "moe_tiny", "wresnet_tiny", "unet_tiny")
MEMORY_BAND = (0.5, 2.0)
TIME_BAND = (1 / 8, 8.0)
SCHEDULE_BAND = (2 / 3, 1.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--platform",
        choices=["cpu", "gpu"],
        help="Run on this platform (default: jax's default backend).",
    )
    parser.add_argument(
        "--examples",
        default=",".join(EXAMPLES),
        help="Comma-separated names from examples/ (default: %(default)s).",
    )
    parser.add_argument(
        "--pipeline",
        default="gpt_tiny",
        help="The example run as a one-stage pipeline (default: %(default)s).",
    )
    parser.add_argument("--steps", type=int, default=10, help="Timed steps of each run.")
    parser.add_argument("--out", type=Path, help="Write the results as JSON here.")
    args = parser.parse_args()
    names = [n.strip() for n in args.examples.split(",") if n.strip()]
    missing = [n for n in [*names, args.pipeline] if not (ROOT / "examples" / f"{n}.hlo").is_file()]
    if not names or missing:
        print(
            f"gpu_check: no example {', '.join(missing) or '(none named)'} in examples/",
            file=sys.stderr,
        )
        return 2

    import jax

    platform = args.platform or jax.default_backend()
    try:
        device = jax.devices(platform)[0]
    except RuntimeError as exc:
        print(f"gpu_check: jax has no {platform} device here: {exc}", file=sys.stderr)
        return 2
    versions = _rhino_versions()
    print(
        f"rhino {versions['rhino']} on jax {versions['jax']}, jaxlib {versions['jaxlib']}, "
        f"Python {versions['python']}; {platform}: {device.device_kind}",
        flush=True,
    )

    work = Path(tempfile.mkdtemp(prefix="rhino-gpu-check-"))
    rates = calibrate(device)
    cluster = work / "this_device.yaml"
    cluster.write_text(cluster_yaml(rates, device.device_kind))
    print(
        f"calibrated: f32 {_rate(rates['f32'], 'FLOP/s')}, bf16 {_rate(rates['bf16'], 'FLOP/s')}, "
        f"memory {_rate(rates['memory_bandwidth'], 'B/s')}, per kernel "
        f"{format_seconds(rates['kernel_s'])}",
        flush=True,
    )

    rows = [check_example(n, platform, cluster, rates, args.steps, work) for n in names]
    rows.append(check_pipeline(args.pipeline, platform, cluster, args.steps, work))
    failures = [f"{r['name']}: {f}" for r in rows for f in r["failures"]]
    print_table(rows)
    for line in failures:
        print(f"FAILED {line}", file=sys.stderr)
    print(
        f"{len(rows) - len({f.split(':')[0] for f in failures})}/{len(rows)} runs passed "
        f"every check",
        flush=True,
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "revision": revision("hlo", "search", "runtime", "cli"),
                    "versions": versions,
                    "platform": platform,
                    "device": device.device_kind,
                    "calibration": rates,
                    "bands": {"memory": MEMORY_BAND, "time": TIME_BAND, "schedule": SCHEDULE_BAND},
                    "rows": rows,
                    "ok": not failures,
                },
                indent=2,
            )
        )
        print(f"wrote {args.out}")
    return 1 if failures else 0


# -- calibration -------------------------------------------------------------------------


def calibrate(device: Any) -> dict[str, float]:
    """Achievable rates of `device`, measured with jax (best of several runs each)."""
    import jax
    import jax.numpy as jnp

    gpu = device.platform != "cpu"
    n = 8192 if gpu else 1024
    rates: dict[str, float] = {}
    for dtype in ("f32", "bf16"):
        a = jax.device_put(
            jnp.ones((n, n), jnp.float32 if dtype == "f32" else jnp.bfloat16), device
        )
        rates[dtype] = 2 * n**3 / _best(jax.jit(lambda x: x @ x), a)
    x = jax.device_put(jnp.ones(((256 if gpu else 16) * 2**20,), jnp.float32), device)
    rates["memory_bandwidth"] = 2 * x.nbytes / _best(jax.jit(lambda v: v * 1.0001), x)
    rates["kernel_s"] = _kernel_cost(device)
    rates["memory_bytes"] = _device_memory(device)
    return rates


def _kernel_cost(device: Any) -> float:
    """Seconds per kernel: two chains of small dependent products, timed, over the
    difference of their kernel counts in XLA's compiled programs."""
    import jax
    import jax.numpy as jnp

    from rhino.hlo.parser import parse_module
    from rhino.runtime.fidelity import kernel_launches

    def chain(k: int) -> Any:
        def f(x: Any, w: Any) -> Any:
            for _ in range(k):
                x = jnp.tanh(x @ w)
            return x

        return jax.jit(f)

    x = jax.device_put(jnp.ones((8, 8), jnp.float32), device)
    w = jax.device_put(jnp.full((8, 8), 0.1, jnp.float32), device)
    timed = {}
    for k in (4, 260):
        fn = chain(k)
        kernels = kernel_launches(parse_module(fn.lower(x, w).compile().as_text()))
        timed[kernels] = _best(fn, x, w, repeats=30)
    (k0, t0), (k1, t1) = sorted(timed.items())
    return max(t1 - t0, 0.0) / max(k1 - k0, 1)


def _device_memory(device: Any) -> float:
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return float(stats["bytes_limit"])
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _best(fn: Any, *args: Any, repeats: int = 5) -> float:
    fn(*args).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args).block_until_ready()
        times.append(time.perf_counter() - start)
    return min(times)


def cluster_yaml(rates: dict[str, float], name: str) -> str:
    """A one-device cluster file with the calibrated rates (links unused on one device)."""
    return (
        f"name: this_device\ndevices_per_node: 1\ndevice:\n  name: {json.dumps(name)}\n"
        f"  memory: {rates['memory_bytes']:.0f}\n"
        f"  memory_bandwidth: {rates['memory_bandwidth']:.6g}\n"
        f"  flops:\n    f32: {rates['f32']:.6g}\n    bf16: {rates['bf16']:.6g}\n"
        f"    f16: {rates['bf16']:.6g}\n"
        "links:\n  intra_node: {bandwidth: 100 GB/s, latency: 5 us}\n"
        "  inter_node: {bandwidth: 100 Gb/s, latency: 10 us}\n"
    )


# -- the checks --------------------------------------------------------------------------


def check_example(
    name: str, platform: str, cluster: Path, rates: dict[str, float], steps: int, work: Path
) -> dict[str, Any]:
    """`rhino plan` + `rhino run` of one example on one device, and its checks."""
    hlo = ROOT / "examples" / f"{name}.hlo"
    plan = work / f"{name}.plan.json"
    row: dict[str, Any] = {"name": name, "kind": "spmd", "failures": []}
    report = _made_and_run(
        row, hlo, plan, platform, steps, "plan", "--mesh", "1", "--cluster", cluster
    )
    if report is None:
        return row
    estimate = report["predicted_step_s"]
    predicted = estimate + report["kernels"] * rates["kernel_s"]
    measured = report["step"]["median_s"]
    memory = report["memory"]
    row.update(
        {
            "verify": report["verify"]["ok"],
            "bytes": {
                "predicted": report["fidelity"]["predicted_bytes"],
                "measured": report["fidelity"]["measured_bytes"],
            },
            "memory": {"predicted": memory["plan_peak_bytes"], "measured": memory["total_bytes"]},
            "time": {
                "predicted": predicted,
                "estimate": estimate,
                "kernels": report["kernels"],
                "measured": measured,
            },
        }
    )
    if not report["verify"]["ok"]:
        row["failures"].append(f"verification: {report['verify']['summary']}")
    if not report["fidelity"]["ok"] or row["bytes"]["predicted"] != row["bytes"]["measured"]:
        row["failures"].append(
            f"collective bytes predicted {row['bytes']['predicted']} != "
            f"measured {row['bytes']['measured']}"
        )
    _band(row, "memory", memory["total_bytes"], memory["plan_peak_bytes"], MEMORY_BAND, "B")
    _band(row, "time", measured, predicted, TIME_BAND, "s")
    return row


def check_pipeline(
    name: str, platform: str, cluster: Path, steps: int, work: Path
) -> dict[str, Any]:
    """A one-stage pipeline of one example: `rhino pipeline` + `rhino run` of its stage
    plan, and its checks."""
    hlo = ROOT / "examples" / f"{name}.hlo"
    stages = work / f"{name}.stages.json"
    row: dict[str, Any] = {"name": f"{name} (1 stage)", "kind": "pipeline", "failures": []}
    report = _made_and_run(
        row,
        hlo,
        stages,
        platform,
        steps,
        "pipeline",
        "--stages",
        "1",
        "--microbatches",
        "2",
        "--cluster",
        cluster,
    )
    if report is None:
        return row
    sent = report["bytes"]
    step = report["predicted_step_s"]
    row.update(
        {
            "verify": report["verify"]["ok"],
            "bytes": {k: sent[f"{k}_total"] for k in ("predicted", "planned", "measured")},
            "order": report["order"]["same"],
            "time": {
                "predicted": step["simulated"],
                "estimate": step["plan"],
                "measured": step["measured"],
            },
        }
    )
    if not report["verify"]["ok"]:
        row["failures"].append(f"verification: {report['verify']['summary']}")
    if len(set(row["bytes"].values())) != 1:
        row["failures"].append(f"bytes between stages differ: {row['bytes']}")
    if not report["order"]["same"]:
        row["failures"].append("a stage ran its tasks out of the planned order")
    _band(
        row,
        "step (simulated on the measured task times)",
        step["measured"],
        step["simulated"],
        SCHEDULE_BAND,
        "s",
    )
    return row


def _band(
    row: dict[str, Any],
    what: str,
    measured: float,
    predicted: float,
    band: tuple[float, float],
    unit: str,
) -> None:
    ratio = measured / predicted if predicted > 0 else math.inf
    if not band[0] <= ratio <= band[1]:
        row["failures"].append(
            f"{what}: measured {_shown(measured, unit)} is {ratio:.3g} x the predicted "
            f"{_shown(predicted, unit)}, outside [{band[0]:.3g}, {band[1]:.3g}]"
        )


def _made_and_run(
    row: dict[str, Any],
    hlo: Path,
    plan: Path,
    platform: str,
    steps: int,
    command: str,
    *options: object,
) -> dict[str, Any] | None:
    """`rhino COMMAND HLO OPTIONS --out PLAN`, then `rhino run HLO --plan PLAN`: the run's
    report, or None (the failure recorded in the row)."""
    if _rhino(row, command, hlo, *options, "--out", plan) is None:
        return None
    return _rhino(row, "run", hlo, "--plan", plan, "--platform", platform, "--steps", steps)


def _rhino(row: dict[str, Any], command: str, *args: object) -> dict[str, Any] | None:
    """Run `rhino COMMAND ARGS --json` with this Python; its JSON, or None (a failure
    recorded in the row) when it exits with an error."""
    argv = [sys.executable, "-m", "rhino.cli", command, *map(str, args), "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if done.returncode not in (0, 1) or not done.stdout.strip():
        tail = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        row["failures"].append(f"rhino {command} exited {done.returncode}: {tail}")
        return None
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _rhino_versions() -> dict[str, str]:
    from rhino.runtime.environment import versions

    return versions()


# -- output ------------------------------------------------------------------------------


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="predicted against measured, one device", title_justify="left")
    for col in (
        "run",
        "verify",
        "bytes pred/meas",
        "memory pred",
        "memory meas",
        "ratio",
        "time pred",
        "time meas",
        "ratio",
        "result",
    ):
        table.add_column(col, justify="left" if col == "run" else "right", no_wrap=True)
    for r in rows:
        mem, tim = r.get("memory"), r.get("time")
        table.add_row(
            r["name"],
            "-" if "verify" not in r else ("ok" if r["verify"] else "FAILED"),
            "-" if "bytes" not in r else "/".join(_shown(v, "B") for v in r["bytes"].values()),
            *(_pair(mem, "B") if mem else ("-",) * 3),
            *(_pair(tim, "s") if tim else ("-",) * 3),
            "ok" if not r["failures"] else "FAILED",
        )
    Console(width=200 if not sys.stdout.isatty() else None).print(table)


def _pair(d: dict[str, float], unit: str) -> tuple[str, str, str]:
    ratio = d["measured"] / d["predicted"] if d["predicted"] else math.inf
    return _shown(d["predicted"], unit), _shown(d["measured"], unit), f"{ratio:.2f}"


def _shown(value: float, unit: str) -> str:
    """Bytes and seconds as every rhino report shows them (`rhino.search.units`)."""
    return format_bytes(value) if unit == "B" else format_seconds(value)


def _rate(value: float, unit: str) -> str:
    """A rate with an SI prefix: 1.95e11 FLOP/s -> "195 GFLOP/s"."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


if __name__ == "__main__":
    sys.exit(main())
