"""`rhino run --processes N`: every process of a simulated multi-host job started on this
machine with one command, each with its own log files, and the job's outcome."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from rhino.runtime.launch import Ended, job_exit_code
from tests.compile_flags import FAST_COMPILE
from tests.hlo.corpus import ROOT

MLP = ROOT / "examples" / "mlp.hlo"


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    made = CliRunner().invoke(cli, ["plan", str(MLP), "--mesh", "2x4", "--out", str(path)])
    assert made.exit_code == 0, made.output
    return path


def _launch(plan: Path, logs: Path, *more: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XLA_FLAGS": FAST_COMPILE}
    argv = [sys.executable, "-m", "rhino.cli", "run", str(MLP), "--plan", str(plan)]
    argv += ["--processes", "2", "--logs", str(logs), "--steps", "1", "--warmup", "0", *more]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_a_local_job_runs_every_process_and_keeps_their_logs_apart(
    plan: Path, tmp_path: Path
) -> None:
    done = _launch(plan, tmp_path / "logs", "--devices", "4", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(done.stdout)
    assert doc["schema"] == "rhino.run.local_job/1" and doc["logs"] == str(tmp_path / "logs")
    for i, process in enumerate(doc["processes"]):
        assert (process["process"], process["exit_code"], process["killed"]) == (i, 0, False)
        assert process["report"]["process_index"] == i
        assert process["report"]["verify"]["ok"]
        out = Path(process["stdout"])
        assert out == tmp_path / "logs" / f"process-{i}.out"
        assert json.loads(out.read_text())["process_index"] == i  # its own report only
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "process-0.err",
        "process-0.out",
        "process-1.err",
        "process-1.out",
    ]


def test_a_local_job_that_fails_says_which_process_and_why(plan: Path, tmp_path: Path) -> None:
    done = _launch(plan, tmp_path / "logs", "--devices", "2")  # 2 x 2 devices: not 2x4
    assert done.returncode == 2
    assert "devices 2 per process x 2 processes = 4 devices" in done.stderr
    assert "process 0: error:" in done.stderr and "process 1: error:" in done.stderr


def test_a_bad_log_folder_stops_the_job_before_it_starts(plan: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    r = CliRunner().invoke(
        cli,
        ["run", str(MLP), "--plan", str(plan), "--processes", "2", "--logs", str(blocked / "logs")],
    )
    assert r.exit_code == 2 and "cannot write there" in r.output
    r = CliRunner().invoke(cli, ["run", str(MLP), "--plan", str(plan), "--logs", str(tmp_path)])
    assert r.exit_code == 2 and "--logs goes with --processes" in r.output
    r = CliRunner().invoke(cli, ["run", str(MLP), "--mesh", "2x4", "--processes", "2"])
    assert r.exit_code == 2 and "give --plan" in r.output


def test_the_job_s_exit_code_is_its_first_failure_s() -> None:
    def ended(process: int, code: int, seconds: float) -> Ended:
        return Ended(process, code, seconds, Path("o"), Path("e"))

    assert job_exit_code([ended(0, 0, 1.0), ended(1, 0, 1.0)]) == 0
    assert job_exit_code([ended(0, 4, 9.0), ended(1, 2, 3.0)]) == 2  # 0 stopped because of 1
    assert job_exit_code([ended(0, -11, 2.0), ended(1, 4, 8.0)]) == 3  # a crash
