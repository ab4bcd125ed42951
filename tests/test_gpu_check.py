"""scripts/gpu_check.py: on the CPU it runs every example and passes every check of what
rhino computes (outputs, bytes, memory, task order) and writes them all; a failed check is
recorded with its numbers. Its timing checks are judged here only on made-up reports: two
test workers share the machine's two cores, so the times of one run are not the machine's
(`.ci/run` runs the script alone afterwards, every check counting)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.hlo.corpus import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402


def test_check_on_cpu_passes_and_reports_predicted_against_measured(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "gpu_check.py"),
            "--platform",
            "cpu",
            "--examples",
            "mlp",
            "--pipeline",
            "mlp",
            "--steps",
            "3",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,  # a guard against a hang only
    )
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads(out.read_text())
    timing = ("time: measured", "step (simulated on the measured task times)")
    assert all(f.startswith(timing) for r in doc["rows"] for f in r["failures"]), doc["rows"]
    assert doc["ok"] is (done.returncode == 0) and doc["platform"] == "cpu"
    assert doc["versions"]["jax"] == __import__("jax").__version__
    for key in ("f32", "bf16", "memory_bandwidth", "kernel_s", "memory_bytes"):
        assert doc["calibration"][key] > 0
    spmd, pipeline = doc["rows"]
    assert (spmd["name"], spmd["verify"]) == ("mlp", True)
    assert spmd["bytes"] == {"predicted": 0, "measured": 0}
    assert spmd["time"]["kernels"] > 0 and spmd["memory"]["measured"] > 0
    assert spmd["time"]["predicted"] > spmd["time"]["estimate"] > 0
    assert pipeline["kind"] == "pipeline" and pipeline["order"] is True
    assert pipeline["verify"] is True and len(set(pipeline["bytes"].values())) == 1
    assert pipeline["time"]["measured"] > 0 and pipeline["time"]["predicted"] > 0


def report(**changes: Any) -> dict[str, Any]:
    """A `rhino run --json` report of one device, with `changes`."""
    doc: dict[str, Any] = {
        "verify": {"ok": True, "summary": "3/3 outputs match"},
        "fidelity": {"ok": True, "predicted_bytes": 0, "measured_bytes": 0},
        "memory": {"plan_peak_bytes": 1000.0, "total_bytes": 900},
        "predicted_step_s": 1e-3,
        "kernels": 100,
        "step": {"median_s": 2e-3},
    }
    return {**doc, **changes}


@pytest.mark.parametrize(
    ("changes", "failure"),
    [
        ({}, None),
        ({"verify": {"ok": False, "summary": "0/3 outputs match"}}, "0/3 outputs match"),
        (
            {"fidelity": {"ok": True, "predicted_bytes": 0, "measured_bytes": 64}},
            "collective bytes predicted 0 != measured 64",
        ),
        ({"memory": {"plan_peak_bytes": 1000.0, "total_bytes": 2500}}, "memory: measured"),
        ({"step": {"median_s": 0.5}}, "time: measured 500.000 ms is 250 x the predicted 2.000 ms"),
        ({"step": {"median_s": 1e-4}}, "outside [0.125, 8]"),
    ],
)
def test_each_check_fails_with_its_numbers(
    changes: dict[str, Any], failure: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(gpu_check, "_rhino", lambda row, command, *args: report(**changes))
    rates = {"kernel_s": 1e-5}  # 100 kernels: the prediction is 1 ms + 1 ms
    row = gpu_check.check_example("mlp", "cpu", tmp_path / "c.yaml", rates, 3, tmp_path)
    assert row["time"]["predicted"] == pytest.approx(2e-3)
    if failure is None:
        assert row["failures"] == []
    else:
        (found,) = row["failures"]
        assert failure in found


def test_a_stage_plan_run_fails_on_bytes_order_and_schedule(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    staged = {
        "verify": {"ok": True, "summary": "3/3 outputs match"},
        "bytes": {"predicted_total": 8, "planned_total": 8, "measured_total": 16},
        "order": {"same": False},
        "predicted_step_s": {"plan": 1e-3, "simulated": 2e-3, "measured": 4e-3},
    }
    monkeypatch.setattr(gpu_check, "_rhino", lambda row, command, *args: staged)
    row = gpu_check.check_pipeline("mlp", "cpu", tmp_path / "c.yaml", 3, tmp_path)
    assert [f.split(":")[0].split(" (")[0] for f in row["failures"]] == [
        "bytes between stages differ",
        "a stage ran its tasks out of the planned order",
        "step",
    ]
    assert "measured 4.000 ms is 2 x the predicted 2.000 ms" in row["failures"][2]
