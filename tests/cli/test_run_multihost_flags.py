"""`rhino run --coordinator HOST:PORT --num-processes P --process-id I`: the options are
checked before any process joins a job (exit code 2 and a message naming the option)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from rhino.cli.run_cmd import Job, job_of
from tests.hlo.corpus import ROOT

MLP = ROOT / "tests" / "data" / "mlp_step.hlo"
JOB = ["--coordinator", "127.0.0.1:1234", "--num-processes", "2", "--process-id", "0"]


@pytest.fixture(autouse=True)
def _keep_xla_flags(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`--devices` may set XLA_FLAGS and jax_num_cpu_devices for a jax not yet started;
    undo it after each test."""
    import jax

    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    before = jax.config.jax_num_cpu_devices
    yield
    if jax.config.jax_num_cpu_devices != before:  # set by this test: jax not started
        jax.config.update("jax_num_cpu_devices", before)


def invoke(*args: str):
    return CliRunner().invoke(cli, ["run", str(MLP), *args])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--coordinator", "127.0.0.1:1234"], "missing --num-processes, --process-id"),
        (["--num-processes", "2", "--process-id", "1"], "missing --coordinator"),
        (JOB[:-2] + ["--num-processes", "0", "--process-id", "0"], "at least 1, got 0"),
        (
            JOB[:-2] + ["--process-id", "2"],
            "--process-id must be in 0..1 for --num-processes 2, got 2",
        ),
        (JOB[:-2] + ["--process-id", "-1"], "got -1"),
        (["--coordinator", "127.0.0.1", *JOB[2:]], "HOST:PORT"),
        (["--coordinator", "host:99999", *JOB[2:]], "got 'host:99999'"),
        (["--coordinator", ":1234", *JOB[2:]], "HOST:PORT"),
        (["--coordinator", "a b:1234", *JOB[2:]], "HOST:PORT"),
        ([*JOB, "--address", "10.0.0.2:0"], "--address must be HOST or HOST:PORT"),
        ([*JOB, "--address", "a b"], "got 'a b'"),
        (["--address", "10.0.0.2"], "--address belongs to a job of several processes"),
    ],
)
def test_bad_job_options_exit_2(args: list[str], message: str) -> None:
    r = invoke("--plan", "plan.json", *args)
    assert r.exit_code == 2, r.output
    assert message in r.output


def test_several_processes_need_a_plan_file() -> None:
    r = invoke("--mesh", "2x4", *JOB)
    assert r.exit_code == 2 and "give --plan FILE" in r.output


def test_devices_per_process_must_make_the_mesh(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    made = CliRunner().invoke(cli, ["plan", str(MLP), "--mesh", "1x4", "--out", str(plan)])
    assert made.exit_code == 0, made.output
    r = invoke("--plan", str(plan), "--devices", "4", *JOB)
    assert r.exit_code == 2
    assert "--devices 4 per process x 2 processes = 8 devices, but the plan's mesh 1x4 has 4" in (
        r.output
    )


def test_job_of() -> None:
    assert job_of(None, None, None) is None
    assert job_of("[::1]:8476", 4, 3) == Job("[::1]:8476", 4, 3)
    assert job_of("node-0.cluster:1", 1, 0) == Job("node-0.cluster:1", 1, 0)
    assert job_of("10.0.0.1:1", 2, 1, "10.0.0.2", 5) == Job("10.0.0.1:1", 2, 1, "10.0.0.2", 5)
