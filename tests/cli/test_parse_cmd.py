from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from rhino.hlo.parser import parse_file
from tests.hlo.corpus import ROOT

MLP = ROOT / "tests" / "data" / "mlp_step.hlo"
SCAN = ROOT / "examples" / "gpt_scan_tiny.hlo"


def run(*args: str, input: str | None = None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def test_human_summary() -> None:
    r = run("parse", str(MLP))
    assert r.exit_code == 0
    for fragment in ("jit_step", "instructions", "48", "opcodes", "largest tensors", "FLOPs"):
        assert fragment in r.output


def test_json_schema_is_stable() -> None:
    r = run("parse", str(SCAN), "--json")
    assert r.exit_code == 0
    doc = json.loads(r.output)
    assert doc["schema"] == "rhino.parse/1"
    expected_keys = {
        "schema",
        "versions",
        "file",
        "input",
        "name",
        "computations",
        "instructions",
        "entry_instructions",
        "opcode_histogram",
        "parameters",
        "parameter_bytes",
        "output_bytes",
        "total_flops",
        "total_bytes",
        "largest_tensors",
        "while_loops",
        "fusions",
        "unknown_opcodes",
    }
    assert set(doc) == expected_keys
    assert [lp["trip_count"] for lp in doc["while_loops"]] == [2, 2]
    assert (doc["input"]["kind"], doc["input"]["source"]) == ("hlo", str(SCAN))
    assert doc["instructions"] == parse_file(SCAN).instruction_count
    assert r.output.count("\n") == 1  # piped: one line (indented only at a terminal)


def test_json_is_indented_at_a_terminal(monkeypatch) -> None:
    import rhino.cli.common as common

    monkeypatch.setattr(common, "stdout_is_terminal", lambda: True)
    r = run("parse", str(SCAN), "--json")
    assert r.exit_code == 0
    assert '\n  "schema": "rhino.parse/1",\n' in r.output
    assert json.loads(r.output)["schema"] == "rhino.parse/1"


def test_emit_dot_stdin_and_gzip(tmp_path: Path) -> None:
    emitted, dot = tmp_path / "out.hlo", tmp_path / "entry.dot"
    assert run("parse", str(MLP), "--emit", str(emitted), "--dot", str(dot)).exit_code == 0
    assert emitted.read_text() == MLP.read_text()
    assert dot.read_text().startswith('digraph "jit_step"') and "->" in dot.read_text()
    assert (
        json.loads(run("parse", "-", "--json", input=MLP.read_text()).output)["instructions"] == 48
    )
    gz = tmp_path / "m.hlo.gz"
    gz.write_bytes(gzip.compress(MLP.read_bytes()))
    assert json.loads(run("parse", str(gz), "--json").output)["instructions"] == 48


def test_bad_input_is_a_message_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hlo"
    bad.write_text(MLP.read_text().replace("dot(x.1, params_0_.1)", "dot(x.1, nowhere)"))
    r = CliRunner().invoke(cli, ["parse", str(bad)])
    assert r.exit_code == 2
    assert f"{bad}:12:" in r.output and "undefined instruction %nowhere" in r.output
    assert "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["parse", str(tmp_path / "missing.hlo")])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\n")
    r = CliRunner().invoke(cli, ["parse", str(bad), "--debug"])
    assert r.exit_code != 0 and r.exception is not None
    assert type(r.exception).__name__ == "HloParseError"


def test_unknown_opcode_is_reported_not_fatal(tmp_path: Path) -> None:
    f = tmp_path / "new.hlo"
    f.write_text(
        "HloModule m\n\nENTRY e {\n  p = f32[4]{0} parameter(0)\n  ROOT q = f32[4]{0} fancy-new-op(p)\n}\n"
    )
    doc = json.loads(run("parse", str(f), "--json").output)
    assert doc["unknown_opcodes"] == ["fancy-new-op"]


def test_help_has_examples() -> None:
    r = run("parse", "--help")
    assert "Examples:" in r.output and "rhino parse" in r.output


def test_a_malformed_program_shape_in_the_header_is_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hlo"
    header, rest = MLP.read_text().split("\n", 1)
    bad.write_text(header.split(",")[0] + ", entry_computation_layout={(f32[x...)->f32[]}\n" + rest)
    r = CliRunner().invoke(cli, ["parse", str(bad)])
    assert r.exit_code == 2, r.output
    assert f"{bad}:1:" in r.output and "bad dimension" in r.output and "Traceback" not in r.output


@pytest.mark.jax_surface
def test_stablehlo_text_is_read_through_the_bridge(tmp_path: Path) -> None:
    mlir = tmp_path / "f.mlir"
    mlir.write_text(
        "module @jit_f attributes {mhlo.num_partitions = 1 : i32} {\n"
        "  func.func public @main(%arg0: tensor<4xf32>) -> (tensor<4xf32>) {\n"
        "    return %arg0 : tensor<4xf32>\n  }\n}\n"
    )
    r = run("parse", str(mlir), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["name"], doc["instructions"], doc["parameters"]) == ("jit_f", 1, 1)
    assert (doc["input"]["kind"], doc["input"]["converted"]) == ("stablehlo", True)


def test_the_garbage_collector_is_as_it_was_after_the_command(tmp_path: Path) -> None:
    import gc

    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\nENTRY e {\n  ROOT x = f32[] add(p)\n}\n")
    assert gc.isenabled()
    assert run("parse", str(MLP)).exit_code == 0
    assert gc.isenabled()
    assert run("parse", str(bad)).exit_code == 2
    assert gc.isenabled()
    gc.disable()
    try:
        assert run("parse", str(MLP)).exit_code == 0
        assert not gc.isenabled()
    finally:
        gc.enable()
