"""Shared pytest setup.

Runs before any test module is imported, so it is the place to configure jax: eight
simulated CPU devices, and the CPU platform only (jax reads both when it first starts).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.compile_flags import FAST_COMPILE

_DEVICE_FLAG = "--xla_force_host_platform_device_count=8"

if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_FLAG}".strip()
# compiled fast (tests/compile_flags.py); processes the tests start inherit it
for _flag in FAST_COMPILE.split():
    if _flag.split("=")[0] not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += f" {_flag}"
os.environ["JAX_PLATFORMS"] = "cpu"

# The tests of what jax itself does for rhino: the bridge, compiling and running programs
# (SPMD and pipelines), XLA's own parser and printer, the GPU check. CI runs every test
# under the oldest supported jax and these (`pytest -m jax_surface`) under the newest too.
# Left out: the zoo's plan-quality runs (what they test is the search; their programs
# take the same compile-and-run path as test_plan_runs and test_pipeline_exec).
JAX_SURFACE = (
    "tests/runtime/",
    "tests/cli/test_run_",
    "tests/cli/test_versions.py",
    "tests/hlo/test_sharding.py",
    "tests/hlo/test_snippets_xla.py",
    "tests/hlo/test_xla_agreement.py",
    "tests/hlo/test_replica_groups.py",
    "tests/test_zoo.py",
    "tests/test_gpu_check.py",
)
NOT_JAX_SURFACE = (
    "tests/runtime/test_zoo_runs.py",
    "tests/runtime/test_hand_plans.py",
    "tests/runtime/test_sweep.py",  # plans only: no jax
)


SLOW_FIRST = (
    "tests/corpus/test_corpus.py::test_every_command",
    "tests/runtime/test_hand_plans.py",
    "tests/search/test_merge.py::test_o2_meets_a_budget",
    "tests/search/test_planner.py::test_the_plans_of_the_combined_search_made_apart",
    "tests/runtime/test_zoo_runs.py",
    "tests/runtime/test_multihost.py",
    "tests/runtime/test_hosts.py",
    "tests/cli/test_plan_cmd.py::test_a_limit_that_cuts_the_search_short",
    "tests/cli/test_plan_cmd.py::test_a_mesh_put_to_work",
    "tests/runtime/test_plan_runs.py",
)
"""Tests of 10 s to 100 s each (`pytest --durations`): they run first, and with
--maxschedchunk=1 (pyproject's addopts) xdist hands out one test at a time, so the last
minutes are not one worker on a long test while the other waits (the suite on 2
workers ended with several minutes of one)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(str(config.rootpath))
    for item in items:
        path = Path(str(item.path)).relative_to(root).as_posix()
        if path.startswith(JAX_SURFACE) and not path.startswith(NOT_JAX_SURFACE):
            item.add_marker(pytest.mark.jax_surface)

    # the same order in every xdist worker (they must collect alike): the slow ones in
    # SLOW_FIRST's order, then the others as collected
    def rank(item: pytest.Item) -> int:
        found = (i for i, prefix in enumerate(SLOW_FIRST) if item.nodeid.startswith(prefix))
        return next(found, len(SLOW_FIRST))

    items.sort(key=rank)
