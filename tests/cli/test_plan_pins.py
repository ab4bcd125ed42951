"""`rhino plan --pins FILE`: user-pinned layouts from YAML, and the plan made around them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from tests.hlo.corpus import ROOT

MEGATRON = ROOT / "tests" / "data" / "mlp_megatron.hlo"  # x [8, 8192] @ w0 [8192, 8192] @ w1
W0 = "params_0___w__.1"
ACTIVATION_BYTES = 8 * 8192 * 4


def plan_json(*args: str) -> dict:
    r = CliRunner().invoke(cli, ["plan", str(MEGATRON), "--mesh", "1x4", "--json", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def outs(doc: dict, name: str) -> str:
    return next(i["outs"][0] for i in doc["instructions"] if i["name"] == name)


def test_pins_file_is_honoured_and_the_rest_planned_around_it(tmp_path: Path) -> None:
    free = plan_json()
    assert outs(free, W0) == "RS1"  # unpinned: Megatron's column split
    pins = tmp_path / "pins.yaml"
    pins.write_text(f"# row-split the first weight instead\n{W0}: RS0\n")
    doc = plan_json("--pins", str(pins))
    assert outs(doc, W0) == "RS0"
    dot = next(i for i in doc["instructions"] if i["name"] == "dot_general.5")
    assert dot["ins"] == ["RS1", "RS0"]  # x arrives split by columns to meet the row split
    for state in ("adam_m_0___w__.1", "adam_v_0___w__.1"):
        assert outs(doc, state) == "RS0"  # its optimizer state follows it
    assert all(c["nbytes"] <= ACTIVATION_BYTES for c in doc["collectives"])  # w0 never moves
    assert free["objective_s"] <= doc["objective_s"]


def test_pin_flag_wins_over_the_file_and_percent_names_work(tmp_path: Path) -> None:
    pins = tmp_path / "pins.yaml"
    pins.write_text(f'"%{W0}": RS0\nparams_1___w__.1: RR\n')
    doc = plan_json("--pins", str(pins), "--pin", f"{W0}=RR")
    assert outs(doc, W0) == "RR"
    assert outs(doc, "params_1___w__.1") == "RR"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{W0}: RS0\n  nested: RS1\n", "pins.yaml:2:9: not valid YAML"),
        ("", "pins.yaml: expected a mapping of instruction name to layout"),
        (f"- {W0}\n", "pins.yaml:1:1: expected a mapping"),
        (f"{W0}: [RS0]\n", f"pins.yaml:1:1: key '{W0}': expected a layout such as RS1, got a list"),
        (f"{W0}: RQ\n", f"pins.yaml:1:1: key '{W0}': sharding spec 'RQ'"),
        (f"{W0}: S0\n", f"pins.yaml:1:1: key '{W0}': sharding spec 'S0': expected 2 tokens"),
        (f"{W0}: RS2\n", f"pins.yaml:1:1: key '{W0}': spec RS2 splits dim 2 of a rank-2 tensor"),
        (
            f"{W0}: RR\nparams_0___w_.1: RR\n",
            "pins.yaml:2:1: key 'params_0___w_.1': no instruction",
        ),
        (f"{W0}: RR\n{W0}: RS0\n", f"pins.yaml:2:1: key '{W0}': given twice (first on line 1)"),
    ],
)
def test_bad_pins_file_names_file_line_and_key(tmp_path: Path, text: str, message: str) -> None:
    pins = tmp_path / "pins.yaml"
    pins.write_text(text)
    r = CliRunner().invoke(cli, ["plan", str(MEGATRON), "--mesh", "1x4", "--pins", str(pins)])
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert message in r.output.replace(str(tmp_path) + "/", ""), r.output


def test_unknown_name_suggests_close_ones(tmp_path: Path) -> None:
    pins = tmp_path / "pins.yaml"
    pins.write_text("params_0___w_.1: RR\n")
    r = CliRunner().invoke(cli, ["plan", str(MEGATRON), "--mesh", "1x4", "--pins", str(pins)])
    assert r.exit_code == 2 and f"did you mean {W0}" in r.output, r.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mesh", "1x4", "--pins", "no/such/pins.yaml"], "no/such/pins.yaml: cannot read"),
        (["--devices", "4", "--pins", str(MEGATRON)], "--pins needs a fixed --mesh"),
    ],
)
def test_pins_misuse_exits_2(args: list[str], message: str) -> None:
    r = CliRunner().invoke(cli, ["plan", str(MEGATRON), *args])
    assert r.exit_code == 2 and message in r.output, r.output


def test_help_shows_a_pins_example() -> None:
    r = CliRunner().invoke(cli, ["plan", "--help"])
    assert r.exit_code == 0
    assert "rhino plan model.hlo --mesh 1x8 --pins pins.yaml" in r.output
