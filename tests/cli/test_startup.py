"""`rhino` imports a command's module only when the command runs: `rhino --help` and
`rhino parse` load no solver, no jax, no plotting library, no numpy; `rhino run` of a
plan made before loads no solver."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from rhino.cli.main import COMMANDS, cli
from tests.hlo.corpus import ROOT

HEAVY = (
    "ortools",
    "highspy",
    "pytoulbar2",
    "scipy",
    "jax",
    "jaxlib",
    "matplotlib",
    "pandas",
    "numpy",  # no array is needed to parse (replica groups of collectives aside)
)

PROBE = """
import sys
from click.testing import CliRunner
from rhino.cli.main import cli
result = CliRunner().invoke(cli, sys.argv[2:])
assert result.exit_code == 0, result.output
print(" ".join(sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1].split(",")))))
"""


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_loads_under_its_name(name: str) -> None:
    command = cli.get_command(click.Context(cli), name)
    assert isinstance(command, click.Command) and command.name == name


def test_help_lists_every_command_with_its_line() -> None:
    text = CliRunner().invoke(cli, ["--help"]).output
    for name, (_, _, line) in COMMANDS.items():
        assert f"{name}" in text and line in text
    assert cli.get_command(click.Context(cli), "nope") is None


def loaded_by(*args: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """The `heavy` libraries `rhino ARGS` imports (run in a fresh interpreter)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(heavy), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["parse", str(ROOT / "examples" / "mlp.hlo")],
        ["parse", str(ROOT / "examples" / "gpt_scan_tiny.hlo"), "--json"],
    ],
)
def test_help_and_parse_import_no_heavy_library(args: list[str]) -> None:
    assert loaded_by(*args) == []


def test_json_of_parse_imports_no_rich_and_its_table_does() -> None:
    """The consoles are made at their first use (`rhino.cli.common.__getattr__`)."""
    example = str(ROOT / "examples" / "mlp.hlo")
    assert loaded_by("parse", example, "--json", heavy=("rich",)) == []
    assert loaded_by("parse", example, heavy=("rich",)) == ["rich"]


def test_the_probe_sees_a_heavy_import_and_plan_loads_cp_sat_only_to_run_it() -> None:
    """`rhino plan` needs the LP solver (HiGHS) to start; CP-SAT (and the pandas it
    pulls in, 0.4 s) only where an LP is not integral."""
    loaded = loaded_by("plan", "--help")
    assert "highspy" in loaded
    assert "ortools" not in loaded and "pandas" not in loaded


SOLVERS = ("ortools", "highspy", "pytoulbar2", "pandas", "scipy")


@pytest.mark.parametrize("kind", ["spmd", "stages"])
def test_run_of_a_plan_made_before_loads_no_solver(kind: str, tmp_path: Path) -> None:
    """`rhino run --plan FILE` compiles and runs what the file says: the planners'
    solvers (HiGHS; CP-SAT and the pandas it pulls in, half a second) load only where
    it plans first (--mesh, or a stage plan's hybrid stages)."""
    example = str(ROOT / "examples" / "mlp.hlo")
    plan = str(tmp_path / "plan.json")
    make = ["plan", "--mesh", "2x2"] if kind == "spmd" else ["pipeline", "--stages", "2"]
    made = CliRunner().invoke(cli, [make[0], example, *make[1:], "--out", plan])
    assert made.exit_code == 0, made.output
    devices = "4" if kind == "spmd" else "2"
    assert loaded_by("run", example, "--plan", plan, "--devices", devices, heavy=SOLVERS) == []


def test_a_plan_loads_neither_scipy_nor_jax() -> None:
    """The LP's matrix is laid out by rhino itself (`rhino.search.spmd.lp.columns`):
    importing scipy cost every planning process a tenth of a second."""
    loaded = loaded_by("plan", "examples/mlp.hlo", "--mesh", "2x2")
    assert "highspy" in loaded  # the probe sees what the plan loaded
    assert "scipy" not in loaded and "jax" not in loaded
