"""scripts/bench_run.py in quick mode writes a report with every field (a subprocess, so
that the script's own simulated-device setting applies)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.hlo.corpus import ROOT


def test_quick_run_reports_both_plans_and_one_device(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_run.py"),
            "--quick",
            "--models",
            "examples/mlp.hlo",
            "--meshes",
            "1x4",
            "--steps",
            "2",
            "--time-limit",
            "3600",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,  # a guard against a hang only
    )
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "run" and doc["devices"] == 8 and doc["failures"] == []
    (row,) = doc["rows"]
    assert (row["model"], row["mesh"]) == ("mlp", "1x4")
    for name in ("o3", "dp"):
        plan = row[name]
        assert plan["verify_ok"] is True and plan["status"] == "optimal"
        for key in ("predicted_bytes", "measured_bytes", "bytes_ratio", "objective_s", "search_s"):
            assert isinstance(plan[key], float), (name, key)
        assert set(plan["memory"]) >= {
            "peak_bytes",
            "argument_bytes",
            "temp_bytes",
            "plan_peak_bytes",
        }
        assert plan["step"]["steps"] == 2 and plan["step"]["median_s"] > 0
    assert row["single"]["step"]["median_s"] > 0
    # the data-parallel plan all-reduces the gradients of every weight (64x64, 64x16 ...)
    assert row["dp"]["measured_bytes"] >= 64 * 64 * 4
    assert set(row["speedup"]) == {"o3_vs_dp", "o3_vs_single", "dp_vs_single", "predicted_o3_vs_dp"}
    assert row["speedup"]["predicted_o3_vs_dp"] >= 1.0  # O3 searches a superset of DP plans
