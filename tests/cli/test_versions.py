"""`rhino --version` and the "versions" of every --json output: the jax in use."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import jax
import jaxlib
import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from rhino.runtime import environment
from tests.hlo.corpus import ROOT


def test_version_names_the_jax_and_jaxlib_in_use() -> None:
    r = CliRunner().invoke(cli, ["--version"], catch_exceptions=False)
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert lines[0] == f"rhino {metadata.version('rhino')}"
    assert lines[1].startswith(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, Python 3.")
    assert (
        f"tested with jax {environment.SUPPORTED_JAX[0]} to {environment.SUPPORTED_JAX[1]}"
        in r.output
    )
    assert "warning" not in r.output  # CI runs both ends of the tested range


@pytest.mark.parametrize(
    "args",
    [
        ["parse", "examples/mlp.hlo"],
        ["plan", "examples/mlp.hlo", "--mesh", "2"],
        ["pipeline", "examples/mlp.hlo", "--stages", "2"],
    ],
)
def test_json_outputs_carry_the_versions(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    r = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert r.exit_code == 0
    doc = json.loads(r.output)
    assert list(doc)[:2] == ["schema", "versions"]
    assert doc["versions"]["jax"] == jax.__version__
    assert doc["versions"]["jaxlib"] == jaxlib.__version__
    assert set(doc["versions"]) == {"rhino", "jax", "jaxlib", "python"}


def test_versions_outside_the_tested_range_are_named() -> None:
    found = {"rhino": "0.1.0", "jax": "0.12.0.1", "jaxlib": "0.12.0.1", "python": "3.12.1"}
    assert environment.untested_jax(found) is None
    assert environment.untested_jax({**found, "jax": "0.10.2", "jaxlib": "0.10.2"}) is None
    assert "jax 0.9.2 is outside" in (environment.untested_jax({**found, "jax": "0.9.2"}) or "")
    assert "jaxlib 0.13.0 is outside" in (
        environment.untested_jax({**found, "jaxlib": "0.13.0"}) or ""
    )
    assert "jax none" in (environment.untested_jax({**found, "jax": "none"}) or "")


@pytest.mark.parametrize("name", ["rhino", "jax", "jaxlib", "click", "nosuchpackage"])
def test_installed_versions_read_from_folders_are_importlib_metadatas(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`versions()` reads NAME-VERSION.dist-info folder names on sys.path (not importing
    importlib.metadata): the version importlib.metadata gives, the first on sys.path where
    two are installed, and importlib.metadata's answer where no folder names one."""
    try:
        expected = metadata.version(name)
    except metadata.PackageNotFoundError:
        expected = "none"
    assert environment._installed_version(name) == expected
    shadow = tmp_path / f"{name.upper()}-9.9.dist-info"  # found first, any case
    shadow.mkdir()
    (shadow / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 9.9\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert environment._installed_version(name) == metadata.version(name) == "9.9"
    shadow.rename(tmp_path / "elsewhere")
    assert environment._installed_version(name) == expected
