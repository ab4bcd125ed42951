from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from tests.hlo.corpus import ROOT

MLP = ROOT / "tests" / "data" / "mlp_step.hlo"


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_plan_then_run_verifies_and_measures(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    assert invoke("plan", str(MLP), "--mesh", "1x4", "--out", str(plan)).exit_code == 0
    r = invoke("run", str(MLP), "--plan", str(plan), "--devices", "4", "--steps", "2", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["schema"] == "rhino.run/1"
    assert doc["verify"]["ok"] and len(doc["verify"]["outputs"]) == 3
    assert doc["step"]["steps"] == 2 and doc["single_device_step"] is not None
    assert {"predicted_bytes", "measured_bytes", "by_kind_axes"} <= set(doc["fidelity"])
    assert doc["memory"]["peak_bytes"] > 0


def test_a_plan_for_another_module_is_refused(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    other = ROOT / "tests" / "data" / "strided_reshape.hlo"
    assert invoke("plan", str(other), "--mesh", "1x4", "--out", str(plan)).exit_code == 0
    r = invoke("run", str(MLP), "--plan", str(plan), "--devices", "4")
    assert r.exit_code == 2 and "another module" in r.output


def test_failed_verification_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    import rhino.runtime.request as request

    real = request.run_plan
    outputs: list[int] = []

    def broken(*args, **kwargs):
        report = real(*args, **kwargs)
        assert report.verify is not None
        failed = tuple(dataclasses.replace(o, ok=False) for o in report.verify.outputs)
        outputs.append(len(failed))
        return dataclasses.replace(
            report, verify=dataclasses.replace(report.verify, outputs=failed)
        )

    monkeypatch.setattr(request, "run_plan", broken)
    r = invoke("run", str(MLP), "--mesh", "1x4", "--devices", "4", "--steps", "1")
    assert r.exit_code == 1 and f"0/{outputs[0]} outputs match" in r.output
    assert "verification: FAILED" in r.output


def test_plan_or_mesh_is_needed() -> None:
    r = invoke("run", str(MLP))
    assert r.exit_code == 2 and "--plan" in r.output


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda doc: doc.update(version=99), "plan version 99; this rhino reads version 1"),
        (
            lambda doc: doc.update(instructions=doc["instructions"][:10]),
            "the plan covers 10 instructions but not",
        ),
        (lambda doc: doc.update(instructions=[]), "the plan covers 0 instructions but not"),
        (lambda doc: doc["instructions"][3].update(name="nowhere"), "does not have: %nowhere"),
        (lambda doc: doc["instructions"][3].update(outs=["S0S0S1"]), "the plan's layout of"),
    ],
)
def test_a_hand_edited_plan_is_refused(edit, message: str, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    assert invoke("plan", str(MLP), "--mesh", "1x4", "--out", str(plan)).exit_code == 0
    doc = json.loads(plan.read_text())
    edit(doc)
    plan.write_text(json.dumps(doc))
    r = invoke("run", str(MLP), "--plan", str(plan), "--devices", "4", "--steps", "1")
    assert r.exit_code == 2 and message in r.output, r.output


def _run_mlp_subprocess(*extra: str) -> str:
    """`rhino run` of the MLP on 2 devices in a fresh process, without
    TF_CPP_MIN_LOG_LEVEL: its stderr."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rhino.cli",
            "run",
            str(MLP),
            "--mesh",
            "2",
            "--devices",
            "2",
            "--steps",
            "1",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


GSPMD_WARNING = "GSPMD sharding propagation is going to be deprecated"


def test_xla_log_noise_stays_off_the_terminal_unless_debug() -> None:
    for extra, shown in (([], False), (["--debug"], True)):
        stderr = _run_mlp_subprocess("--partitioner", "gspmd", *extra)
        assert (GSPMD_WARNING in stderr) is shown


def test_by_default_xla_partitions_with_shardy_and_gspmd_says_nothing() -> None:
    """Even with XLA's warnings shown (--debug), the default path logs no GSPMD deprecation:
    nothing in it goes through GSPMD's propagation."""
    assert GSPMD_WARNING not in _run_mlp_subprocess("--debug")


@pytest.mark.parametrize("partitioner", [None, "shardy", "gspmd"])
def test_the_report_says_which_partitioner_compiled_the_plan(partitioner: str | None) -> None:
    extra = ["--partitioner", partitioner] if partitioner else []
    args = ("run", str(MLP), "--mesh", "1x4", "--devices", "4", "--steps", "1", *extra)
    r = invoke(*args, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["partitioner"] == (partitioner or "shardy")
    assert doc["verify"]["ok"] and doc["fidelity"]["ok"], doc["fidelity"]["messages"]
    human = invoke(*args)
    assert f"partitioned by {partitioner or 'shardy'}" in human.stdout.splitlines()[0]


def test_an_unknown_partitioner_is_refused() -> None:
    r = invoke("run", str(MLP), "--mesh", "1x4", "--partitioner", "auto")
    assert r.exit_code == 2 and "'auto' is not one of 'shardy', 'gspmd'" in r.output


def test_a_run_without_collectives_says_none() -> None:
    r = invoke("run", str(MLP), "--mesh", "1", "--devices", "1", "--steps", "1")
    assert r.exit_code == 0
    assert "collectives: none predicted, none measured" in r.stdout
    assert "predicted vs measured (bytes" not in r.stdout


def test_helps_first_example_runs_on_a_machine_without_an_accelerator() -> None:
    """`rhino run examples/mlp.hlo --mesh 2x4` with no XLA_FLAGS: 8 simulated devices."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rhino.cli",
            "run",
            "examples/mlp.hlo",
            "--mesh",
            "2x4",
            "--steps",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "running on 8 simulated CPU devices (as --devices 8)" in done.stderr
    assert (
        done.stdout.startswith("mesh 2x4 on 8 devices (TFRT_CPU_0") or "on 8 devices" in done.stdout
    )


def test_opt_mesh_and_cluster_are_the_same_options_everywhere() -> None:
    r = invoke("run", str(MLP), "--mesh", "2", "--opt", "O9")
    assert r.exit_code == 2 and "'--opt': 'O9' is not one of 'O2', 'O3'" in r.output
    for command in ("plan", "pipeline", "run"):
        text = invoke(command, "--help").output
        assert "--mesh AxB" in text and "--cluster TEXT" in text
        assert "[default: m8]" in " ".join(text.split())


def test_planning_first_says_what_plan_would_warn_of() -> None:
    r = CliRunner().invoke(
        cli,
        [
            "run",
            str(ROOT / "examples" / "mlp.hlo"),
            "--mesh",
            "1x7",
            "--devices",
            "7",
            "--steps",
            "1",
        ],
    )
    assert r.exit_code == 0
    assert "warning: mesh 1x7: nothing is split along axis 1 (7 devices)" in r.stderr
