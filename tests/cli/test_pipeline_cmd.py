from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner

from rhino.cli import flags
from rhino.cli.main import cli
from tests.hlo.corpus import ROOT

GPT = str(ROOT / "examples" / "gpt_tiny.hlo")
MLP = str(ROOT / "examples" / "mlp.hlo")


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_human_report() -> None:
    r = invoke("pipeline", GPT, "--stages", "2")
    assert r.exit_code == 0, r.output
    for fragment in (
        "2 stages",
        "cut (forward)",
        "step (1f1b)",
        "step (gpipe)",
        "bubble",
        "equal_count",
        "best_split",
        "rhino (ILP)",
    ):
        assert fragment in r.output


def test_a_start_plan_that_meets_the_least_receipts_needs_no_ilp() -> None:
    unet = str(ROOT / "examples" / "unet_tiny.hlo")
    r = invoke("pipeline", unet, "--stages", "4", "--epsilon", "0.2")
    assert r.exit_code == 0, r.output
    assert "no ILP run" in " ".join(r.output.split())
    doc = json.loads(invoke("pipeline", unet, "--stages", "4", "--epsilon", "0.2", "--json").output)
    assert doc["status"] == "optimal" and doc["method"] == "hint"
    assert doc["solver"]["receipt_bound"] == doc["cut_bytes"] == doc["bound_bytes"]
    assert doc["solver"]["cpsat_s"] == 0.0


def test_json_and_plan_file(tmp_path: Path) -> None:
    out = tmp_path / "stages.json"
    r = invoke("pipeline", GPT, "--stages", "4", "--microbatches", "4", "--json", "--out", str(out))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["schema"] == "rhino.pipeline/1"
    plan = json.loads(out.read_text())
    assert plan["schema"] == "rhino.pipeline/1" and "format" not in plan
    assert plan["cut_bytes"] == doc["cut_bytes"]
    assert len(plan["stage_reports"]) == 4
    assert {i["stage"] for i in plan["instructions"]} == {0, 1, 2, 3}
    assert plan["schedules"]["1f1b"]["bubble_fraction"] == pytest.approx(3 / 7)


def test_gantt_svg_and_dot(tmp_path: Path) -> None:
    svg, dot = tmp_path / "g.svg", tmp_path / "g.dot"
    r = invoke(
        "pipeline",
        GPT,
        "--stages",
        "2",
        "--microbatches",
        "3",
        "--gantt",
        str(svg),
        "--dot",
        str(dot),
    )
    assert r.exit_code == 0, r.output
    tree = ET.parse(svg)
    tasks = [e.get("id", "") for e in tree.iter() if e.get("id", "").startswith("stage ")]
    assert len(tasks) == 2 * 3 * 2 + 2  # F and B per stage and micro-batch, one update each
    assert {"stage 0 F0", "stage 1 B2", "stage 1 U"} <= set(tasks)
    texts = [e.text or "" for e in tree.iter() if e.tag.endswith("text")]
    assert {"F forward", "B backward", "U update"} <= set(texts)  # the legend
    assert {"F0", "F1", "F2", "B0"} <= set(texts) or {"0", "1", "2"} <= set(texts)  # micro-batches
    ticks = [t for t in texts if t.endswith(("s", "us", "ms")) and not t.startswith("step")]
    assert len(ticks) >= 4 and ticks[0].startswith("0")  # a time axis from 0
    text = dot.read_text()
    assert text.startswith("digraph") and "->" in text and "#f28e2b" in text  # stage 1's colour


def test_gantt_svg_is_the_same_bytes_every_time_and_png_is_the_same_chart(tmp_path: Path) -> None:
    """One matplotlib figure drawn as SVG and PNG; SVG without the date, its element ids
    salted the same, so that two runs write the same file."""
    first, second, png = tmp_path / "a.svg", tmp_path / "b.svg", tmp_path / "g.png"
    for path in (first, second, png):
        r = invoke("pipeline", GPT, "--stages", "2", "--microbatches", "3", "--gantt", str(path))
        assert r.exit_code == 0, r.output
    assert first.read_bytes() == second.read_bytes()
    assert "<dc:date>" not in first.read_text()
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stages", "0"], "--stages 0: need at least 1 stage"),
        (["--stages", "500"], "more stages than the 23 forward instructions"),
        (["--stages", "2", "--epsilon", "-0.5"], "--epsilon -0.5: expected a tolerance"),
        (["--stages", "2", "--microbatches", "0"], "--microbatches 0: need at least 1"),
        (["--stages", "2", "--gantt", "g.pdf"], "expected a .svg or .png"),
        (["--stages", "2", "--loss", "nope"], "no instruction %nope"),
        (
            ["--stages", "2", "--epsilon", "0.1"],
            "%dot_general.5 alone is 78.5% of the compute (raise --epsilon",
        ),
    ],
)
def test_bad_input_exits_2_with_a_message(args: list[str], message: str) -> None:
    r = invoke("pipeline", MLP, *args)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output


def test_an_unnamed_epsilon_widens_to_the_least_that_has_a_plan() -> None:
    # one dot is 78.5% of the MLP's forward: 2 stages need epsilon >= 2 * 0.785 - 1
    r = invoke("pipeline", MLP, "--stages", "2")
    assert r.exit_code == 0, r.output
    assert "widened: no plan has 0.1" in r.output
    doc = json.loads(invoke("pipeline", MLP, "--stages", "2", "--json").output)
    assert 0.57 <= doc["epsilon"] <= 0.8
    assert doc["imbalance"] <= doc["epsilon"] + 1e-9


def test_malformed_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\nENTRY e {\n  p = f32[2 parameter(0)\n}\n")
    r = invoke("pipeline", str(bad), "--stages", "2")
    assert r.exit_code == 2
    assert "bad.hlo:3:" in r.output


def test_help_has_examples() -> None:
    r = invoke("pipeline", "--help")
    assert r.exit_code == 0
    assert "Examples:" in r.output and "--stages 4" in r.output


def test_a_graph_without_a_loss_exits_2(tmp_path: Path) -> None:
    hlo = tmp_path / "inference.hlo"
    hlo.write_text(
        "HloModule m\n\nENTRY e {\n  p = f32[4]{0} parameter(0)\n"
        "  ROOT n = f32[4]{0} negate(p)\n}\n"
    )
    r = invoke("pipeline", str(hlo), "--stages", "2")
    assert r.exit_code == 2, r.output
    assert "cannot find the loss of %n" in r.output and "--loss" in r.output


def test_a_stage_plan_written_before_the_schema_key_still_runs(tmp_path: Path) -> None:
    """Stage plans once said `"format": "rhino.pipeline", "version": 1`; now `"schema":
    "rhino.pipeline/1"` like every rhino document. Both read the same."""
    from rhino.runtime.pipeline.programs import StagePlan

    out = tmp_path / "stages.json"
    assert (
        CliRunner()
        .invoke(cli, ["pipeline", str(MLP), "--stages", "2", "--out", str(out)])
        .exit_code
        == 0
    )
    doc = json.loads(out.read_text())
    old = {
        "format": "rhino.pipeline",
        "version": 1,
        **{k: v for k, v in doc.items() if k != "schema"},
    }
    assert StagePlan.from_json(old) == StagePlan.from_json(doc)
    with pytest.raises(Exception, match="has version 2"):
        StagePlan.from_json({**doc, "schema": "rhino.pipeline/2"})


def test_each_schedule_reports_its_own_simulated_bubble() -> None:
    r = CliRunner().invoke(
        cli, ["pipeline", str(ROOT / "examples" / "gpt_tiny.hlo"), "--stages", "4", "--json"]
    )
    schedules = json.loads(r.stdout)["schedules"]
    simulated = {name: s["simulated_bubble_fraction"] for name, s in schedules.items()}
    assert simulated["1f1b"] != simulated["gpipe"]
    for s in schedules.values():
        assert s["simulated_bubble_fraction"] == pytest.approx(1 - s["busy_fraction"])
    r = CliRunner().invoke(
        cli, ["pipeline", str(ROOT / "examples" / "gpt_tiny.hlo"), "--stages", "4"]
    )
    assert "1F1B is slower than GPipe here" in r.stdout
    assert f"bubble {simulated['1f1b']:.1%} simulated" in r.stdout


def test_library_errors_name_the_parameter_and_the_cli_its_flag() -> None:
    from rhino.hlo.errors import ConfigError
    from rhino.search.pipeline import PipelineRequest, check_request

    with pytest.raises(ConfigError) as caught:
        check_request(PipelineRequest(0), 10)
    assert (
        str(caught.value) == "stages 0: need at least 1 stage" and caught.value.option == "stages"
    )
    assert flags.shown(caught.value) == "--stages 0: need at least 1 stage"
    r = invoke("pipeline", MLP, "--stages", "0")
    assert r.exit_code == 2 and "error: --stages 0: need at least 1 stage" in r.output


def test_time_ticks_are_in_one_unit_with_the_digits_they_need() -> None:
    from rhino.cli.pipeline_draw import _tick_labels, _ticks

    assert _tick_labels(_ticks(0.0897)) == [f"{k} ms" for k in range(0, 81, 10)]
    assert _tick_labels(_ticks(49.57e-6)) == [f"{k} us" for k in range(0, 46, 5)]
    assert _tick_labels([0.0, 0.5, 1.0, 1.5]) == ["0 s", "0.5 s", "1 s", "1.5 s"]
