"""`rhino run FILE --plan stages.json`: a stage plan from `rhino pipeline --out` runs,
verifies and reports; bad combinations exit 2 with a message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from rhino.cli.main import cli
from tests.hlo.corpus import ROOT

MLP = ROOT / "examples" / "mlp.hlo"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def stages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plans") / "stages.json"
    r = invoke(
        "pipeline",
        str(MLP),
        "--stages",
        "2",
        "--epsilon",
        "0.6",
        "--time-limit",
        "10",
        "--out",
        str(path),
    )
    assert r.exit_code == 0, r.output
    return path


def test_a_stage_plan_runs_verifies_and_reports(stages: Path) -> None:
    r = invoke(
        "run",
        str(MLP),
        "--plan",
        str(stages),
        "--devices",
        "2",
        "--microbatches",
        "4",
        "--schedule",
        "gpipe",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--json",
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["schema"] == "rhino.run.pipeline/1"
    assert doc["verify"]["ok"] and len(doc["verify"]["outputs"]) == 14
    assert (doc["stages"], doc["microbatches"], doc["schedule"]) == (2, 4, "gpipe")
    assert doc["bytes"]["measured"] == doc["bytes"]["planned"] == doc["bytes"]["predicted"]
    assert doc["bytes"]["measured_total"] > 0
    assert doc["order"]["same"]
    assert set(doc["task_seconds"]) == {"0", "1"} and "U" in doc["task_seconds"]["0"]
    kinds = {e["kind"] for e in doc["measured_timeline"]["events"]}
    assert kinds == {"F", "B", "U"} and doc["simulated_timeline"]["step_s"] > 0


def test_the_human_report_shows_the_timelines(stages: Path, tmp_path: Path) -> None:
    svg = tmp_path / "timelines.svg"
    r = invoke(
        "run",
        str(MLP),
        "--plan",
        str(stages),
        "--devices",
        "2",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--no-verify",
        "--gantt",
        str(svg),
    )
    assert r.exit_code == 0, r.output
    assert "stage 1 sim |" in r.output and "stage 1 run |" in r.output
    assert "task order as planned on every stage: yes" in r.output
    picture = svg.read_text()
    assert "simulated on the measured task times" in picture and "measured</text>" in picture
    assert picture.count('id="stage ') >= 2 * (2 * 8 * 2 + 2)  # F and B of 8 micro-batches, U


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--microbatches", "3"], "3 micro-batches do not divide the batch"),
        (["--devices", "1"], "need 2 devices"),
        (["--mesh", "4x2"], "mesh axis 0, which has 4 devices, not 2 stages"),
        (["--mesh", "2x4"], "need 8 devices"),
    ],
)
def test_bad_requests_exit_2(stages: Path, extra: list[str], message: str) -> None:
    r = invoke("run", str(MLP), "--plan", str(stages), "--devices", "2", *extra)
    assert r.exit_code == 2, r.output
    assert message in r.output


def test_a_stage_plan_for_another_module_is_refused(stages: Path) -> None:
    gpt = ROOT / "examples" / "gpt_tiny.hlo"
    r = invoke("run", str(gpt), "--plan", str(stages), "--devices", "2")
    assert r.exit_code == 2 and "another module" in r.output


def test_schedule_needs_a_stage_plan() -> None:
    r = invoke("run", str(MLP), "--mesh", "1x2", "--devices", "2", "--schedule", "gpipe")
    assert r.exit_code == 2 and "apply to a stage plan" in r.output


def test_gantt_must_be_svg(stages: Path) -> None:
    r = invoke("run", str(MLP), "--plan", str(stages), "--devices", "2", "--gantt", "t.png")
    assert r.exit_code == 2 and "expected a .svg file name" in r.output


def test_a_hybrid_stage_plan_records_its_mesh(tmp_path: Path) -> None:
    """(tests/runtime/test_pipeline_multiprocess.py runs such a plan)"""
    path = tmp_path / "hybrid.json"
    r = invoke(
        "pipeline",
        str(MLP),
        "--mesh",
        "2x2",
        "--epsilon",
        "0.6",
        "--time-limit",
        "10",
        "--out",
        str(path),
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(path.read_text())
    assert doc["mesh"] == [2, 2] and doc["stages"] == 2


def test_pipeline_mesh_must_match_the_stages() -> None:
    r = invoke("pipeline", str(MLP), "--mesh", "3x2", "--stages", "2")
    assert r.exit_code == 2 and "mesh axis 0, which has 3 devices, not 2 stages" in r.output
