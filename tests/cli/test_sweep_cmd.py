from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from rhino.cli.main import cli
from rhino.runtime.sweep import COLUMNS
from tests.hlo.corpus import ROOT

MLP_STEP = ROOT / "tests" / "data" / "mlp_step.hlo"

SWEEP = """
models: [mlp_step.hlo]
meshes: ["1x2", "1x4"]
time_limit: 3600  # the outcome, not the speed: runs to the end
"""
FAILING = "entries:\n  - {model: missing.hlo, mesh: 2}\n"


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    shutil.copy(MLP_STEP, tmp_path / "mlp_step.hlo")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.yaml").write_text(SWEEP)
    (tmp_path / "failing.yaml").write_text(SWEEP + FAILING)
    return tmp_path


def test_table_lists_every_entry_and_exit_0(sweep: Path) -> None:
    r = run("sweep", "ok.yaml", "--jobs", "1", "--out", "rows.json")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    header = next(line for line in lines if "model" in line)
    for col in (
        "mesh",
        "level",
        "cluster",
        "memory",
        "status",
        "step",
        "compute",
        "comm",
        "peak mem",
        "search s",
        "gap",
        "nodes",
    ):
        assert col in header
    rows = [line for line in lines if "mlp_step.hlo" in line]
    assert len(rows) == 2 and "1x2" in rows[0] and "1x4" in rows[1]
    assert all("32 GiB" in row and " ok " in row for row in rows)
    assert "2 entries: 2 ok, 0 failed" in r.output
    doc = json.loads((sweep / "rows.json").read_text())
    assert doc["schema"] == "rhino.sweep/1" and [row["mesh"] for row in doc["rows"]] == [
        "1x2",
        "1x4",
    ]


def test_json_with_a_failing_row_exits_1_and_writes_csv(sweep: Path) -> None:
    r = run("sweep", "failing.yaml", "--json", "--jobs", "2", "--out", "rows.csv")
    assert r.exit_code == 1
    doc = json.loads(r.output)  # nothing but the document on stdout
    assert list(doc) == ["schema", "versions", "rows"] and doc["schema"] == "rhino.sweep/1"
    assert [tuple(row) for row in doc["rows"]] == [COLUMNS] * 3
    assert [(row["mesh"], row["status"]) for row in doc["rows"]] == [
        ("1x2", "ok"),
        ("1x4", "ok"),
        ("2", "error"),
    ]
    assert doc["rows"][2]["message"] == "missing.hlo: cannot read: No such file or directory"
    assert doc["rows"][0]["step_ms"] > 0 and doc["rows"][0]["solver_status"] == "optimal"
    table = list(csv.DictReader(io.StringIO((sweep / "rows.csv").read_text())))
    assert tuple(table[0]) == COLUMNS
    assert [row["status"] for row in table] == ["ok", "ok", "error"]
    assert float(table[0]["step_ms"]) == doc["rows"][0]["step_ms"]


def test_failing_row_in_the_table_says_why(sweep: Path) -> None:
    r = run("sweep", "failing.yaml", "--jobs", "1")
    assert r.exit_code == 1
    assert "error in row 3 (missing.hlo 2 O2 m8 memory=device):" in r.output
    assert "  missing.hlo: cannot read: No such file or directory" in r.output
    assert "3 entries: 2 ok, 1 failed" in r.output


def test_bad_sweep_file_or_out_is_exit_2_without_running(sweep: Path) -> None:
    (sweep / "bad.yaml").write_text("models: [mlp_step.hlo]\nmeshes: [1x2, 2y4]\n")
    r = CliRunner().invoke(cli, ["sweep", "bad.yaml"])
    assert r.exit_code == 2
    assert "error: bad.yaml:2:15: key 'meshes[1]': mesh '2y4'" in r.output
    assert "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["sweep", "ok.yaml", "--out", "rows.txt"])
    assert r.exit_code == 2 and "--out rows.txt: expected a .csv or .json file name" in r.output
    r = CliRunner().invoke(cli, ["sweep", "nope.yaml"])
    assert r.exit_code == 2 and "nope.yaml: cannot read the sweep file" in r.output


def test_an_interrupted_sweep_keeps_its_finished_rows(
    sweep: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rhino.cli.sweep_cmd as sweep_cmd

    real = sweep_cmd.run_sweep

    def interrupted(entries, jobs, on_row, tracebacks):
        real(entries[:1], jobs=1, on_row=on_row, tracebacks=tracebacks)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_cmd, "run_sweep", interrupted)
    r = CliRunner().invoke(cli, ["sweep", "ok.yaml", "--out", "rows.csv"])
    assert r.exit_code == 130
    assert "interrupted: 1 of 2 entries had finished; their rows are in rows.csv" in r.output
    assert "Traceback" not in r.output
    (row,) = csv.DictReader(io.StringIO((sweep / "rows.csv").read_text()))
    assert (row["mesh"], row["status"]) == ("1x2", "ok")


def test_ctrl_c_ends_a_running_sweep_cleanly(sweep: Path) -> None:
    """A real SIGINT to the process group, as a terminal sends it: the workers leave it
    to the parent, which keeps the finished rows and exits 130 without a traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time

    many = "models: [mlp_step.hlo]\nmeshes: [2, 4, 8, 1x2, 1x4, 2x2, 2x4, 4x2, 1x8]\n"
    (sweep / "many.yaml").write_text(many)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rhino.cli",
            "sweep",
            "many.yaml",
            "--jobs",
            "2",
            "--out",
            "rows.json",
        ],
        cwd=sweep,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not (sweep / "rows.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "interrupted: " in err
    rows = json.loads((sweep / "rows.json").read_text())["rows"]
    assert 1 <= len(rows) < 9


def test_several_sweep_files_make_one_table(sweep: Path) -> None:
    (sweep / "more.yaml").write_text('models: [mlp_step.hlo]\nmeshes: ["2x2"]\n')
    r = run("sweep", "ok.yaml", "more.yaml", "--jobs", "1", "--json")
    assert r.exit_code == 0
    assert [row["mesh"] for row in json.loads(r.stdout)["rows"]] == ["1x2", "1x4", "2x2"]
    r = CliRunner().invoke(cli, ["sweep", "ok.yaml", "missing.yaml"])
    assert r.exit_code == 2 and "missing.yaml" in r.output
