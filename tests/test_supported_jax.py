"""The supported jax range is one fact in four places: rhino.runtime.environment's
SUPPORTED_JAX, pyproject's dependency range, the two ends `.ci/run` tests, and the
README's test command (which is `.ci/run`'s, verbatim)."""

from __future__ import annotations

import re
import tomllib

from rhino.runtime.environment import SUPPORTED_JAX
from tests.hlo.corpus import ROOT


def ci_command() -> str:
    text = (ROOT / ".ci" / "run").read_text()
    return text[text.index("python3 -m venv") :].strip()


def test_pyproject_allows_exactly_the_tested_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {re.split(r"[<>=]", d)[0]: d for d in project["dependencies"]}
    low, high = SUPPORTED_JAX
    for name in ("jax", "jaxlib"):
        assert pins[name] == f"{name}>={low},<={high}"


def test_ci_tests_both_ends() -> None:
    command = ci_command()
    low, high = SUPPORTED_JAX
    assert f"jax=={low} jaxlib=={low}" in command and f"jax=={high} jaxlib=={high}" in command
    assert command.index(f"jax=={low}") < command.index("pytest -n 2 -q &&")
    assert command.index(f"jax=={high}") < command.index("-m jax_surface")


def test_readme_test_command_is_ci_run() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.DOTALL)
    assert ci_command() in [b.strip() for b in blocks]
