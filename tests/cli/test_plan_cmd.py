from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from rhino.hlo.parser import parse_file
from rhino.runtime.xla_bridge import xla_parse
from rhino.search.spmd.plan import Plan
from tests.hlo.corpus import ROOT

MLP = ROOT / "tests" / "data" / "mlp_step.hlo"


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_human_report() -> None:
    r = invoke("plan", str(MLP), "--mesh", "1x4", "--time-limit", "3600")  # runs to the end
    assert r.exit_code == 0, r.output
    for fragment in (
        "estimated step",
        "compute",
        "memory per device",
        "solver optimal",
        "%params_0_.1",
        "%dot_general.5",
    ):
        assert fragment in r.output


def test_json_out_and_emitted_hlo(tmp_path: Path) -> None:
    out, hlo = tmp_path / "plan.json", tmp_path / "annotated.hlo"
    r = invoke(
        "plan", str(MLP), "--mesh", "1x4", "--json", "--out", str(out), "--emit-hlo", str(hlo)
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["schema"] == "rhino.plan/1"
    assert {
        "objective_s",
        "compute_s",
        "comm_by_kind",
        "peak_memory_bytes",
        "solver",
        "instructions",
    } <= set(doc)
    assert doc["level"] == "O2"  # the default
    assert doc["solver"]["merge_level"] in (1, 2)
    assert {"nodes", "backbone", "critical", "cones", "core_nodes"} <= set(doc["solver"]["sizes"])
    assert {"build", "solve", "plan", "solve.critical", "solve.merge"} <= set(
        doc["solver"]["phases_s"]
    )
    assert Plan.read(out).module == "jit_step"
    text = hlo.read_text()
    xla_parse(text)  # XLA's parser accepts the annotated module
    annotated = parse_file(hlo)
    for inst in annotated.entry:
        if inst.opcode_text not in ("tuple", "get-tuple-element"):
            assert "sharding" in inst.attrs, inst.name


def test_human_output_names_the_merging_level_and_phases() -> None:
    for level, words in (
        ("O2", "level 2 (one ILP over the merged graph)"),
        ("O3", "level 0 (whole graph)"),
    ):
        r = invoke("plan", str(MLP), "--mesh", "1x4", "--opt", level)
        assert r.exit_code == 0, r.output
        assert words in r.output and "critical" in r.output and "phases" in r.output


def test_bad_inputs_exit_2(tmp_path: Path) -> None:
    cases = [
        (["--mesh", "2x"], "mesh"),
        (["--mesh", "1x4", "--memory", "lots"], "--memory"),
        (["--mesh", "1x4", "--memory", "1KiB"], "smallest possible peak"),
        (["--mesh", "1x4", "--memory", "1KiB"], "set --memory to"),
        (["--mesh", "1x4", "--pin", "nowhere=RS0"], "nowhere"),
        (["--mesh", "1x4", "--pin", "params_0_.1=XYZ"], "sharding spec"),
        (["--mesh", "1x4", "--opt", "O9"], "O9"),
        (["--mesh", "1x4", "--cluster", "nonexistent"], "nonexistent"),
    ]
    for args, fragment in cases:
        r = invoke("plan", str(MLP), *args)
        assert r.exit_code == 2, (args, r.output)
        assert fragment in r.output and "Traceback" not in r.output, (args, r.output)


def test_unknown_opcode_gets_a_replicated_plan_and_a_warning(tmp_path: Path) -> None:
    f = tmp_path / "new.hlo"
    f.write_text(
        "HloModule m\n\nENTRY e {\n  p = f32[8,8]{1,0} parameter(0)\n"
        "  q = f32[8,8]{1,0} fancy-new-op(p)\n  ROOT r = f32[8,8]{1,0} add(q, q)\n}\n"
    )
    r = invoke("plan", str(f), "--mesh", "1x4", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert any("fancy-new-op" in w for w in doc["warnings"])
    q = next(i for i in doc["instructions"] if i["name"] == "q")
    assert q["outs"] == ["RR"]


def test_devices_tries_every_mesh_and_keeps_the_best() -> None:
    r = invoke("plan", str(MLP), "--devices", "4", "--json", "--jobs", "2")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    tried = {tuple(t["mesh"]): t["objective_s"] for t in doc["meshes_tried"]}
    assert set(tried) == {(4,), (2, 2)}
    assert doc["objective_s"] == min(tried.values())
    assert tuple(doc["mesh"]) == min(tried, key=lambda m: (tried[m], m != (4,)))
    # each mesh's own time: reading the module in its worker, then its search
    took = {tuple(t["mesh"]): t["search_time_s"] for t in doc["meshes_tried"]}
    assert took[tuple(doc["mesh"])] >= doc["search_time_s"] > 0
    assert all(seconds > 0 for seconds in took.values())


def test_the_meshes_tried_table_marks_the_best_and_times_each() -> None:
    r = invoke("plan", str(MLP), "--devices", "4", "--jobs", "1")
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if line.startswith("│ ") and " s " in line]
    assert len(rows) == 2, r.output  # 4 and 2x2
    cells = [[c[1:].rstrip() for c in row.strip("│").split("│")] for row in rows]  # 1 pad
    assert sorted(c[3] for c in cells) == ["", "(best)"]
    assert all(re.fullmatch(r"\d+\.\d s", c[2]) for c in cells)


def test_mesh_or_devices_not_both() -> None:
    for args in ([], ["--mesh", "1x4", "--devices", "4"]):
        r = invoke("plan", str(MLP), *args)
        assert r.exit_code == 2 and "--mesh" in r.output and "--devices" in r.output


@pytest.mark.parametrize(
    ("mesh", "idle"),
    [("3x3", "axis 0 (3 devices) and axis 1 (3 devices)"), ("1x7", "axis 1 (7 devices)")],
)
def test_a_mesh_that_splits_nothing_is_said(mesh: str, idle: str) -> None:
    r = CliRunner().invoke(cli, ["plan", str(ROOT / "examples" / "mlp.hlo"), "--mesh", mesh])
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert (
        f"warning: mesh {mesh}: nothing is split along {idle}: no dimension of any tensor divides"
        in text
    )
    devices = 9 if mesh == "3x3" else 7
    assert f"{round(100 / devices)}% of the devices' compute is useful work" in text


def test_a_mesh_put_to_work_has_no_warning_and_an_empty_mesh_is_refused() -> None:
    gpt = str(ROOT / "examples" / "gpt_tiny.hlo")
    r = CliRunner().invoke(cli, ["plan", gpt, "--mesh", "2x4", "--json"])
    assert not [w for w in json.loads(r.output)["warnings"] if w.startswith("mesh ")]
    for command in (["plan", gpt], ["pipeline", gpt], ["run", gpt]):
        r = CliRunner().invoke(cli, [*command, "--mesh", ""])
        assert r.exit_code == 2 and "mesh '': expected AxB" in r.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["plan", "--mesh", "2x4", "--time-limit", "-5"],
            "'--time-limit': -5.0 is not in the range x>0",
        ),
        (
            ["plan", "--mesh", "2x4", "--time-limit", "0"],
            "'--time-limit': 0.0 is not in the range x>0",
        ),
        (["plan", "--devices", "4", "--jobs", "0"], "'--jobs': 0 is not in the range x>=1"),
        (
            ["pipeline", "--stages", "2", "--time-limit", "0"],
            "'--time-limit': 0.0 is not in the range",
        ),
    ],
)
def test_limits_out_of_range_are_refused(args: list[str], message: str) -> None:
    r = CliRunner().invoke(cli, [args[0], str(ROOT / "examples" / "mlp.hlo"), *args[1:]])
    assert r.exit_code == 2 and message in r.output


def test_a_limit_that_cuts_the_search_short_is_said_and_o3_is_no_worse_than_o2() -> None:
    gpt = str(ROOT / "examples" / "gpt_tiny.hlo")
    plans = {}
    for level in ("O2", "O3"):
        r = CliRunner().invoke(
            cli, ["plan", gpt, "--mesh", "2x8", "--opt", level, "--time-limit", "0.5", "--json"]
        )
        assert r.exit_code == 0
        plans[level] = json.loads(r.output)
        assert plans[level]["solver"]["status"] == "feasible"
        assert any(w.startswith("the time limit (0.5 s) was hit") for w in plans[level]["warnings"])
    assert plans["O3"]["objective_s"] <= plans["O2"]["objective_s"]
    r = CliRunner().invoke(
        cli, ["plan", str(ROOT / "examples" / "mlp.hlo"), "--mesh", "2x4", "--json"]
    )
    assert not [w for w in json.loads(r.output)["warnings"] if "time limit" in w]


def test_state_paired_by_shape_is_a_note_not_a_warning() -> None:
    r = CliRunner().invoke(cli, ["plan", str(ROOT / "examples" / "mlp.hlo"), "--mesh", "2x4"])
    assert "note: the module has no input_output_alias" in r.stdout
    assert "warning:" not in r.stdout


def test_phases_add_up_to_the_search_time() -> None:
    r = CliRunner().invoke(
        cli, ["plan", str(ROOT / "examples" / "mlp.hlo"), "--mesh", "2x4", "--json"]
    )
    doc = json.loads(r.stdout)
    phases = doc["solver"]["phases_s"]
    top = sum(v for k, v in phases.items() if "." not in k)
    assert {"build", "solve", "combine", "plan"} <= set(phases)
    assert abs(top - doc["search_time_s"]) <= 0.05 * doc["search_time_s"] + 0.05
    inner = sum(v for k, v in phases.items() if k.startswith("solve."))
    assert inner <= phases["solve"] + 0.01
