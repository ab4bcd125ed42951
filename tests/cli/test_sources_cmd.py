"""Every command reads every kind of input (rhino.runtime.sources): HLO text, StableHLO
text, a serialized HloModuleProto, an XLA dump folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from rhino.cli.main import cli
from tests.runtime import jax_inputs

pytestmark = pytest.mark.jax_surface


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("inputs")
    found = jax_inputs.write_inputs(folder)
    jax_inputs.write_dump(folder / "dump")
    found["xla-dump"] = folder / "dump"
    return found


@pytest.mark.parametrize("kind", ["hlo", "stablehlo", "stablehlo-debug", "hlo-proto", "xla-dump"])
def test_parse_json_reports_the_input(files: dict[str, Path], kind: str) -> None:
    r = run("parse", str(files[kind]), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    got = doc["input"]
    assert got["kind"] == kind.removesuffix("-debug") and got["file"] == str(files[kind])
    reference = json.loads(run("parse", str(files["hlo"]), "--json").stdout)
    assert (doc["name"], doc["parameters"]) == (reference["name"], reference["parameters"])
    assert doc["opcode_histogram"]["dot"] == reference["opcode_histogram"]["dot"]
    if kind != "xla-dump":  # (jax 0.12's dump text is re-printed by XLA: converted)
        assert got["converted"] == (kind != "hlo")
        assert doc["instructions"] == reference["instructions"]
    if kind == "xla-dump":
        assert got["source"].endswith("jit_step.before_optimizations.txt")
        assert [c["name"] for c in got["candidates"]][0] == "jit_step"
        assert len(got["candidates"]) == 3
        assert "note: " + str(files[kind]) + ": read module_" in r.stderr
    else:
        assert got["source"] == str(files[kind])
    if kind == "stablehlo-debug":
        assert [p["path"] for p in got["parameters"]] == jax_inputs.PARAMETER_PATHS
        assert [o["path"] for o in got["outputs"]] == jax_inputs.OUTPUT_PATHS


def test_module_picks_another_module_of_a_dump(files: dict[str, Path]) -> None:
    r = run("parse", str(files["xla-dump"]), "--module", "jit_noise", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["input"]["source"].endswith("jit_noise.before_optimizations.txt")
    r = run("parse", str(files["xla-dump"]), "--module", "nope")
    assert r.exit_code == 2 and "error: --module 'nope': no such module" in r.output
    r = run("parse", str(files["hlo"]), "--module", "jit_step")
    assert r.exit_code == 2 and "is not an XLA dump folder" in r.output


def test_a_stablehlo_error_is_file_line_col_and_exit_2(
    files: dict[str, Path], tmp_path: Path
) -> None:
    lines = files["stablehlo"].read_text().splitlines()
    n = next(i for i, t in enumerate(lines) if "stablehlo.tanh" in t)
    bad = tmp_path / "bad.mlir"
    bad.write_text("\n".join([*lines[:n], lines[n].replace("tanh", "tanhh"), *lines[n + 1 :]]))
    r = run("parse", str(bad))
    assert r.exit_code == 2
    col = lines[n].index("stablehlo.tanh") + 1
    assert f"{bad}:{n + 1}:{col}: error: custom op 'stablehlo.tanhh' is unknown" in r.output
    assert "Traceback" not in r.output


def test_garbage_is_exit_2_with_what_and_where(tmp_path: Path) -> None:
    bad = tmp_path / "model.pb"
    bad.write_bytes(b"\x08\x96\x01garbage\x00")
    r = run("plan", str(bad), "--mesh", "2")
    assert r.exit_code == 2
    assert f"error: {bad}: not HLO text, StableHLO/MLIR text or a serialized HloModuleProto" in (
        r.output
    )
    assert "Traceback" not in r.output


def test_plan_pipeline_and_sweep_read_stablehlo_and_dumps(
    files: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = run("plan", str(files["stablehlo-debug"]), "--mesh", "2", "--cluster", "cpu", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["input"]["kind"] == "stablehlo" and doc["module"] == "jit_step"
    r = run("pipeline", str(files["xla-dump"]), "--stages", "2", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["input"]["source"].endswith("jit_step.before_optimizations.txt")
    monkeypatch.chdir(files["hlo"].parent)
    (tmp_path / "sweep.yaml").write_text(
        f"models: [{files['stablehlo']}, {files['hlo-proto']}, {files['xla-dump']}]\n"
        'meshes: ["2"]\nclusters: [cpu]\n'
    )
    r = run("sweep", str(tmp_path / "sweep.yaml"), "--jobs", "1", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    assert [row["status"] for row in rows] == ["ok"] * 3, rows
    assert len({row["step_ms"] for row in rows}) == 1  # one step, three forms


def test_a_plan_of_a_stablehlo_file_runs_in_a_fresh_process(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """`--devices` still simulates devices after the conversion has called into XLA, and
    the plan's module hash does not depend on how the path is spelled."""
    plan = tmp_path / "plan.json"
    r = run("plan", str(files["stablehlo"]), "--mesh", "2", "--cluster", "cpu", "--out", str(plan))
    assert r.exit_code == 0, r.output
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run(
        [sys.executable, "-m", "rhino.cli", "run", "./step.mlir", "--plan", str(plan)]
        + ["--devices", "2", "--steps", "1", "--warmup", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=files["stablehlo"].parent,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["verify"]["ok"] and doc["input"]["kind"] == "stablehlo"
