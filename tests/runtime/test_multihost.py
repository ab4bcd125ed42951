"""A plan runs through jax's distributed runtime as it runs on one host: two processes of
four simulated CPU devices each, on loopback, run a small GPT's 2x4 plan with
`rhino run --coordinator ... --num-processes 2 --process-id i`, and each verifies its own
partitions against the single-device program."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from rhino.hlo.errors import ExecutionError
from rhino.runtime import xla_bridge as xb
from rhino.runtime.verify import EXACT, Tolerance, check_shards
from tests.compile_flags import FAST_COMPILE
from tests.hlo.corpus import ROOT

GPT = ROOT / "examples" / "gpt_tiny.hlo"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fresh_env() -> dict[str, str]:
    """The children choose their own device count (pytest's conftest asked for 8), and
    compile fast (the same partitioning and collectives, tests/compile_flags.py)."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = FAST_COMPILE
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _command(
    plan: Path, port: int, process: int, *, hlo: Path = GPT, devices: int | None = 4
) -> list[str]:
    """`rhino run` as process `process` of 2; `devices=None`: XLA's one CPU device."""
    flags = (
        f"--platform cpu --coordinator 127.0.0.1:{port} --num-processes 2 "
        f"--process-id {process} --steps 1 --warmup 0 --json"
    )
    run = [sys.executable, "-m", "rhino.cli", "run", str(hlo), "--plan", str(plan)]
    simulate = [] if devices is None else ["--devices", str(devices)]
    return [*run, *flags.split(), *simulate]


def _run_all(commands: list[list[str]]) -> list[tuple[int, str, str]]:
    """Start every command at once; exit code, stdout and stderr of each (all killed
    after 240 s)."""
    procs = [
        subprocess.Popen(
            c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_fresh_env(), cwd=ROOT
        )
        for c in commands
    ]
    return finish(procs)


def finish(procs: list[subprocess.Popen[str]], timeout: float = 240) -> list[tuple[int, str, str]]:
    """Exit code, stdout and stderr of each (all killed once `timeout` has passed)."""
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


def test_two_processes_run_a_gpt_plan_and_verify(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    made = CliRunner().invoke(cli, ["plan", str(GPT), "--mesh", "2x4", "--out", str(plan)])
    assert made.exit_code == 0, made.output
    shardings = [i["sharding"] or "" for i in json.loads(plan.read_text())["instructions"]]
    assert any("devices=" in s for s in shardings), "the plan shards nothing"

    port = _free_port()
    results = _run_all([_command(plan, port, i) for i in range(2)])
    for i, (code, _, err) in enumerate(results):
        assert code == 0, f"process {i} exited {code}:\n{err[-3000:]}"
    docs = [json.loads(out) for _, out, _ in results]  # stdout is the report only (no gloo lines)

    for i, doc in enumerate(docs):
        assert doc["schema"] == "rhino.run/1"
        assert (doc["process_index"], doc["process_count"]) == (i, 2)
        assert doc["partitioner"] == "shardy"  # rhino run's default, across processes too
        assert doc["local_partitions"] == [4 * i + k for k in range(4)]
        assert doc["verify"]["ok"], doc["verify"]["summary"]
        assert len(doc["verify"]["outputs"]) > 100  # loss, parameters, Adam state
    assert docs[0]["devices"] == docs[1]["devices"] and len(docs[0]["devices"]) == 8
    assert docs[0]["fidelity"] == docs[1]["fidelity"]  # one partitioned module
    assert docs[0]["fidelity"]["measured_bytes"] > 0
    assert docs[0]["memory"] == docs[1]["memory"]


def _shards(want: np.ndarray, pieces: int, *, copies: int = 1) -> list[xb.Shard]:
    """`want` cut in `pieces` along dim 0, each piece held by `copies` partitions."""
    n = len(want) // pieces
    where = [(slice(k * n, (k + 1) * n),) for k in range(pieces)]
    return [
        xb.Shard(c * pieces + k, w, want[w].copy())
        for c in range(copies)
        for k, w in enumerate(where)
    ]


def test_check_shards_uses_the_whole_outputs_scale() -> None:
    want = np.array([100.0, 0.0, 0.0, 0.0], dtype=np.float32)
    shards = _shards(want, 2)[1:]  # this process holds only the zeros
    shards[0] = xb.Shard(1, shards[0].index, np.array([0.005, 0.0], dtype=np.float32))
    check = check_shards(0, want, shards, Tolerance(1e-4, 1e-5))
    # 0.005 <= 1e-5 + 1e-4 * 100: right for the whole output, though not for its piece
    assert check.ok and check.scale == 100.0 and check.max_abs_error == np.float32(0.005)


def test_check_shards_checks_every_replicated_copy() -> None:
    want = np.arange(8, dtype=np.int32)
    shards = _shards(want, 2, copies=2)
    assert check_shards(0, want, shards, EXACT).ok
    bad = shards[3]
    shards[3] = xb.Shard(bad.partition, bad.index, bad.data + 1)  # a replica, not the first
    check = check_shards(0, want, shards, EXACT)
    assert not check.ok and check.max_abs_error == 1.0


def test_joining_a_job_after_jax_started_is_refused() -> None:
    xb.local_devices("cpu", 1)  # starts jax's backends
    assert xb.process_info() == xb.ProcessInfo(0, 1)
    xb.check_agreement("anything", "alone")  # nothing to agree with
    with pytest.raises(ExecutionError, match="already initialised"):
        xb.init_distributed("127.0.0.1:1", 2, 0)


def test_misconfigured_jobs_stop_with_a_message(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    mlp = ROOT / "examples" / "mlp.hlo"
    made = CliRunner().invoke(cli, ["plan", str(mlp), "--mesh", "2x4", "--out", str(plan)])
    assert made.exit_code == 0, made.output

    port = _free_port()
    seeds_differ = [[*_command(plan, port, i, hlo=mlp), "--seed", str(i)] for i in range(2)]
    for i, (code, _, err) in enumerate(_run_all(seeds_differ)):
        assert code == 2, err[-3000:]
        assert f"process {i} and process {1 - i} differ in their run options (" in err

    port = _free_port()
    one_device_each = [_command(plan, port, i, hlo=mlp, devices=None) for i in range(2)]
    for code, _, err in _run_all(one_device_each):
        assert code == 2, err[-3000:]
        assert "mesh 2x4 has 8 devices but the 2 processes of this job have 2 in all" in err
