"""`rhino plan --emit-hlo`: the file a user takes away realizes the plan. Compiled on its
own by XLA's SPMD partitioner (no rhino in between), it moves the bytes the plan predicts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from rhino.hlo.parser import parse_file
from rhino.runtime import xla_bridge as xb
from rhino.runtime.fidelity import compare, measure_collectives
from rhino.runtime.spmd.runner import predicted_collectives
from rhino.search.mesh import parse_mesh
from rhino.search.spmd.plan import Plan
from tests.hlo.corpus import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import zoo  # noqa: E402

# the two MLPs of issue 9: a big batch of small layers, a small batch of wide ones
CASES = {"batch4096_hidden64": {"batch": 4096}, "batch16_hidden4096": {"batch": 16, "hidden": 4096}}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_emitted_hlo_moves_what_the_plan_predicts(case: str, tmp_path: Path) -> None:
    source = tmp_path / "step.hlo"
    source.write_text(zoo.hlo_text(zoo.model_spec("mlp", "tiny", CASES[case])))
    emitted, plan_file = tmp_path / "out.hlo", tmp_path / "plan.json"
    result = CliRunner().invoke(
        cli,
        [
            "plan",
            str(source),
            "--mesh",
            "1x4",
            "--emit-hlo",
            str(emitted),
            "--out",
            str(plan_file),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["emitted_hlo"]["path"] == str(emitted)
    plan = Plan.read(plan_file)
    mesh = parse_mesh("1x4")
    compiled = xb.compile_spmd(emitted.read_text(), xb.local_devices("cpu", 4), num_partitions=4)
    root = parse_file(emitted).entry.root
    measured = measure_collectives(
        compiled.partitioned_hlo(), mesh, root=root.name if root else None
    )
    report = compare(predicted_collectives(plan), measured)
    assert report.predicted_bytes > 0  # both cases communicate
    assert report.measured_bytes == pytest.approx(report.predicted_bytes, rel=0.05), report


@pytest.mark.jax_surface
def test_the_emitted_stablehlo_moves_what_the_plan_predicts_through_shardy(
    tmp_path: Path,
) -> None:
    """`--emit-stablehlo`: the plan for Shardy. The file alone (its sdy.mesh and
    shardings, no GSPMD attribute left) compiles through XLA's Shardy partitioner and moves
    the bytes the plan predicts, as the --emit-hlo file does through GSPMD."""
    source = tmp_path / "step.hlo"
    source.write_text(zoo.hlo_text(zoo.model_spec("mlp", "tiny", CASES["batch4096_hidden64"])))
    emitted, plan_file, hlo = tmp_path / "out.mlir", tmp_path / "plan.json", tmp_path / "out.hlo"
    args = ["plan", str(source), "--mesh", "2x2", "--out", str(plan_file)]
    result = CliRunner().invoke(
        cli, [*args, "--emit-stablehlo", str(emitted), "--emit-hlo", str(hlo), "--json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["emitted_stablehlo"] == {"path": str(emitted), "notes": []}
    text = emitted.read_text()
    assert 'sdy.mesh @mesh = <["axis_0"=2, "axis_1"=2]>' in text
    assert "mhlo.sharding" not in text and "sdy.sharding_constraint" in text
    plan = Plan.read(plan_file)
    compiled = xb.compile_shardy(text, xb.local_devices("cpu", 4))
    root = parse_file(hlo).entry.root
    measured = measure_collectives(
        compiled.partitioned_hlo(), parse_mesh("2x2"), root=root.name if root else None
    )
    report = compare(predicted_collectives(plan), measured)
    assert report.predicted_bytes > 0
    assert report.measured_bytes == pytest.approx(report.predicted_bytes, rel=0.05), report


@pytest.mark.jax_surface
def test_the_emitted_stablehlo_lists_what_shardy_cannot_carry(tmp_path: Path) -> None:
    strided = ROOT / "tests" / "data" / "strided_reshape.hlo"
    emitted = tmp_path / "out.mlir"
    args = ["plan", str(strided), "--mesh", "1x4", "--pin", "p=RS1", "--pin", "out=RS1"]
    result = CliRunner().invoke(cli, [*args, "--emit-stablehlo", str(emitted), "--json"])
    assert result.exit_code == 0, result.output
    notes = json.loads(result.output)["emitted_stablehlo"]["notes"]
    assert any(n.startswith("%r: layout RS0[s=1]") and "non-maximal stride" in n for n in notes)
    human = CliRunner().invoke(cli, [*args, "--emit-stablehlo", str(emitted)])
    assert human.exit_code == 0
    assert "note: %r: layout RS0[s=1]" in human.stderr
