from __future__ import annotations

import csv
import io
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from rhino.hlo.errors import ConfigError, InfeasibleError
from rhino.runtime import sweep as sweep_module
from rhino.runtime.sweep import (
    COLUMNS,
    SWEEP_SCHEMA,
    SweepEntry,
    SweepRow,
    load_sweep,
    load_sweep_text,
    output_format,
    rows_csv,
    rows_document,
    run_sweep,
    write_rows,
)
from rhino.search.cluster import load_cluster
from tests.hlo.corpus import ROOT

MLP_STEP = ROOT / "tests" / "data" / "mlp_step.hlo"
MLP = ROOT / "examples" / "mlp.hlo"
GiB = 2.0**30


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path (the working directory) with models/mlp.hlo and models/mlp_step.hlo."""
    (tmp_path / "models").mkdir()
    shutil.copy(MLP, tmp_path / "models" / "mlp.hlo")
    shutil.copy(MLP_STEP, tmp_path / "models" / "mlp_step.hlo")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def key(e: SweepEntry) -> tuple[str, str, str, str, str]:
    return e.model, "x".join(map(str, e.mesh.shape)), e.level, e.cluster.name, e.memory


# -- reading ------------------------------------------------------------------------------------


def test_product_is_model_outermost_and_globs_are_sorted(models: Path) -> None:
    f = write(
        models / "s.yaml", 'models: ["models/*.hlo"]\nmeshes: ["1x2", 4]\nmemory: [null, 16GiB]\n'
    )
    s = load_sweep(f)
    assert s.source == str(f)
    assert [key(e) for e in s.entries] == [
        (f"models/{m}", mesh, "O2", "m8", mem)
        for m in ("mlp.hlo", "mlp_step.hlo")
        for mesh in ("1x2", "4")
        for mem in ("device", "16GiB")
    ]
    m8 = load_cluster("m8")
    assert [e.budget_bytes for e in s.entries[:2]] == [m8.memory_bytes, 16 * GiB]
    assert {(e.time_limit_s, e.threads) for e in s.entries} == {(60.0, 2)}


def test_paths_are_relative_to_the_sweep_file(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = models / "configs"
    sub.mkdir()
    shutil.copy(ROOT / "configs" / "clusters" / "cpu.yaml", sub / "mine.yaml")
    f = write(
        sub / "s.yaml", "models: [../models/mlp.hlo]\nmeshes: [2]\nclusters: [mine.yaml, m8]\n"
    )
    monkeypatch.chdir(sub)  # shown relative to the working directory, found relative to the file
    assert [(e.model, e.cluster.name) for e in load_sweep("s.yaml").entries] == [
        (str(models / "models" / "mlp.hlo"), "cpu"),  # outside the working directory
        (str(models / "models" / "mlp.hlo"), "m8"),
    ]
    monkeypatch.chdir(models)
    assert load_sweep(f).entries[0].model == "models/mlp.hlo"


def test_entries_come_after_the_product_and_inherit_the_top_level(models: Path) -> None:
    text = """
models: [models/mlp.hlo]
meshes: ["1x2"]
memory: [unlimited]
time_limit: 7
entries:
  - {model: models/mlp_step.hlo}
  - model: "models/mlp*.hlo"
    mesh: ["1x4", "2x2"]
    memory: 1GiB
    time_limit: 3
    threads: 1
  - {model: models/not_yet.hlo, mesh: "8", level: O3, cluster: h100x8}
"""
    s = load_sweep_text(text, "s.yaml", models)
    assert [key(e) + (e.budget_bytes, e.time_limit_s) for e in s.entries] == [
        ("models/mlp.hlo", "1x2", "O2", "m8", "unlimited", None, 7.0),
        ("models/mlp_step.hlo", "1x2", "O2", "m8", "unlimited", None, 7.0),
        ("models/mlp.hlo", "1x4", "O2", "m8", "1GiB", GiB, 3.0),
        ("models/mlp.hlo", "2x2", "O2", "m8", "1GiB", GiB, 3.0),
        ("models/mlp_step.hlo", "1x4", "O2", "m8", "1GiB", GiB, 3.0),
        ("models/mlp_step.hlo", "2x2", "O2", "m8", "1GiB", GiB, 3.0),
        ("models/not_yet.hlo", "8", "O3", "h100x8", "unlimited", None, 7.0),
    ]
    assert [e.threads for e in s.entries] == [2, 2, 1, 1, 1, 1, 2]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("models: [a.hlo\n", "s.yaml:2:1: not valid YAML: expected ',' or ']'"),
        (
            "models: [a.hlo]\nmeshes: [1x2]\nmodles: [b]\n",
            "s.yaml:3:1: key 'modles': unknown key; expected one of models, meshes",
        ),
        ("models: [a.hlo]\n", "s.yaml:1:1: key 'meshes': missing"),
        ("models: [a.hlo]\nmeshes: []\n", "s.yaml:2:9: key 'meshes': empty list"),
        ("models: [a.hlo]\nmeshes: [1x2, 1x0]\n", "s.yaml:2:15: key 'meshes[1]': mesh '1x0'"),
        (
            'models: ["models/*.nope"]\nmeshes: [2]\n',
            "s.yaml:1:10: key 'models[0]': 'models/*.nope' matches no file",
        ),
        (
            "models: [{a: 1}]\nmeshes: [2]\n",
            "s.yaml:1:10: key 'models[0]': expected a string, got a mapping",
        ),
        (
            "models: [a.hlo]\nmeshes: [2]\nlevels: [O9]\n",
            "s.yaml:3:10: key 'levels[0]': level 'O9' is not available",
        ),
        (
            "models: [a.hlo]\nmeshes: [2]\nclusters: [m9]\n",
            "s.yaml:3:12: key 'clusters[0]': cluster 'm9': not a file",
        ),
        (
            "models: [a.hlo]\nmeshes: [2]\nmemory: [null, 3 parsecs]\n",
            "s.yaml:3:16: key 'memory[1]': expected a number like",
        ),
        (
            "models: [a.hlo]\nmeshes: [2]\ntime_limit: 0\n",
            "s.yaml:3:13: key 'time_limit': expected seconds greater than 0, got 0",
        ),
        ("entries:\n  - {mesh: 2}\n", "s.yaml:2:5: key 'entries[0].model': missing"),
        (
            "entries:\n  - {model: a.hlo}\n",
            "s.yaml:2:5: key 'entries[0].mesh': missing (and no top-level `meshes`)",
        ),
        (
            "entries:\n  - {model: a.hlo, mesh: 2, threads: 0}\n",
            "s.yaml:2:38: key 'entries[0].threads': expected a positive integer",
        ),
        ("meshes: [2]\nmeshes: [4]\n", "s.yaml:2:1: key 'meshes': given twice"),
        ("meshes: [2]\n", "s.yaml:1:1: top level: no entries"),
        ("- 1\n", "s.yaml:1:1: top level: expected a mapping"),
        ("# nothing\n", "s.yaml: empty sweep file"),
    ],
)
def test_bad_sweep_files_name_file_line_col_and_key(models: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_sweep(write(models / "s.yaml", text).name)
    assert str(err.value).startswith(expected), str(err.value)


def test_an_unreadable_sweep_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope.yaml: cannot read the sweep file"):
        load_sweep(tmp_path / "nope.yaml")


def test_shipped_sweeps_parse() -> None:
    examples = load_sweep(ROOT / "configs" / "sweeps" / "examples.yaml").entries
    assert len(examples) == 2 * len(list((ROOT / "examples").glob("*.hlo")))
    assert {"x".join(map(str, e.mesh.shape)) for e in examples} == {"1x8", "2x4"}
    gpt = load_sweep(ROOT / "configs" / "sweeps" / "gpt.yaml").entries
    assert all("generated" in e.model and e.cluster.name == "m8" for e in gpt)


# -- running ------------------------------------------------------------------------------------


SWEEP = """
models: [models/mlp_step.hlo]
meshes: ["1x2"]
time_limit: 3600  # the outcome, not the speed: runs to the end
entries:
  - {model: models/missing.hlo, mesh: "1x2"}
  - {model: models/mlp_step.hlo, mesh: "1x4", memory: 1KiB}
  - {model: models/mlp.hlo, mesh: "1x2"}
"""


def check_rows(rows: list[SweepRow]) -> None:
    assert [(r.model, r.mesh, r.status) for r in rows] == [
        ("models/mlp_step.hlo", "1x2", "ok"),
        ("models/missing.hlo", "1x2", "error"),
        ("models/mlp_step.hlo", "1x4", "error"),
        ("models/mlp.hlo", "1x2", "ok"),
    ]
    ok = rows[0]
    assert ok.message == "" and ok.solver_status == "optimal" and ok.solver_gap == 0.0
    assert ok.step_ms == pytest.approx(ok.compute_ms + ok.comm_ms)
    assert ok.nodes and ok.nodes > 0 and ok.peak_memory_bytes and ok.peak_memory_bytes > 0
    assert "models/missing.hlo: cannot read" in rows[1].message
    assert "memory budget" in rows[2].message and rows[2].budget_bytes == 1024
    assert rows[2].step_ms is None and rows[2].nodes is None
    assert rows[3].nodes and rows[3].nodes > ok.nodes


def test_failing_entries_in_the_middle_keep_the_others_in_process(models: Path) -> None:
    entries = load_sweep(write(models / "s.yaml", SWEEP)).entries
    seen: list[int] = []
    rows = run_sweep(entries, jobs=1, on_row=lambda i, _row: seen.append(i))
    check_rows(rows)
    assert seen == [0, 1, 2, 3]


def test_two_workers_give_the_same_rows_in_input_order(models: Path) -> None:
    entries = load_sweep(write(models / "s.yaml", SWEEP)).entries
    seen: dict[int, SweepRow] = {}
    rows = run_sweep(entries, jobs=2, on_row=lambda i, row: seen.setdefault(i, row))
    check_rows(rows)
    assert sorted(seen) == [0, 1, 2, 3] and [seen[i] for i in range(4)] == rows
    alone = run_sweep(entries[:1], jobs=1)[0]
    assert replace(rows[0], search_s=None) == replace(alone, search_s=None)


def test_an_internal_error_is_reported_in_its_row(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = sweep_module.make_plan

    def flaky(module, request, progress=None):
        if request.mesh.shape == (1, 4):
            raise ZeroDivisionError("boom")
        if request.mesh.shape == (4,):
            raise InfeasibleError("no plan fits")
        return real(module, request, progress)

    monkeypatch.setattr(sweep_module, "make_plan", flaky)
    text = "models: [models/mlp_step.hlo]\nmeshes: [1x4, 4, 1x2]\n"
    rows = run_sweep(load_sweep_text(text, "s.yaml", models).entries, tracebacks=True)
    assert [r.status for r in rows] == ["error", "error", "ok"]
    assert rows[0].message.startswith("internal error: ZeroDivisionError: boom\nTraceback")
    assert rows[1].message == "no plan fits"


# -- writing ------------------------------------------------------------------------------------


ROWS = [
    SweepRow(
        "a.hlo",
        "1x2",
        "O3",
        "m8",
        "device",
        32 * GiB,
        "ok",
        "",
        1.5,
        1.0,
        0.5,
        1e6,
        0.25,
        "optimal",
        0.0,
        44,
        0,
    ),
    SweepRow("b.hlo", "2x4", "O3", "m8", "1KiB", 1024.0, "error", 'no plan fits, "quoted"\nline 2'),
]


def test_csv_and_json_have_the_same_stable_columns(tmp_path: Path) -> None:
    assert COLUMNS[:8] == (
        "model",
        "mesh",
        "level",
        "cluster",
        "memory",
        "budget_bytes",
        "status",
        "message",
    )
    write_rows(ROWS, tmp_path / "r.csv")
    table = list(csv.DictReader(io.StringIO((tmp_path / "r.csv").read_text())))
    assert tuple(table[0]) == COLUMNS
    assert table[0]["step_ms"] == "1.5" and table[0]["nodes"] == "44"
    assert table[1]["message"] == ROWS[1].message and table[1]["step_ms"] == ""
    assert (tmp_path / "r.csv").read_text() == rows_csv(ROWS)
    write_rows(ROWS, tmp_path / "r.JSON")
    doc = json.loads((tmp_path / "r.JSON").read_text())
    assert doc == rows_document(ROWS) and doc["schema"] == SWEEP_SCHEMA == "rhino.sweep/1"
    assert [tuple(r) for r in doc["rows"]] == [COLUMNS, COLUMNS]
    assert doc["rows"][1]["step_ms"] is None


def test_out_must_be_csv_or_json() -> None:
    assert output_format("x/results.csv") == "csv"
    with pytest.raises(ConfigError, match=r"^out results.txt: expected a .csv or .json") as e:
        output_format("results.txt")
    assert e.value.option == "out"  # the CLI shows it as --out (tests/cli/test_sweep_cmd.py)
