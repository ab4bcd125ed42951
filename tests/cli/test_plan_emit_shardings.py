"""`rhino plan --emit-shardings`: every entry parameter's PartitionSpec, keyed by its JAX
pytree path where the HLO carries it (jax's debug print) and by its name where not (the
corpus' exported steps), the same layouts the plan and rhino.jax give."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import jax
import pytest
from click.testing import CliRunner

import rhino.jax
from rhino.cli.main import cli
from rhino.hlo.parser import parse_file
from rhino.runtime.spmd.boundary import partition_spec
from rhino.search.spmd.plan import Plan
from rhino.search.spmd.spec import parse_spec
from tests.hlo.corpus import ROOT

pytestmark = pytest.mark.jax_surface  # jax lowers the step (its debug print: the keys)


def _emit(source: Path, tmp_path: Path, *extra: str) -> tuple[dict[str, Any], Plan]:
    specs, plan_file = tmp_path / "specs.json", tmp_path / "plan.json"
    result = CliRunner().invoke(
        cli,
        ["plan", str(source), "--mesh", "2x4", "--emit-shardings", str(specs)]
        + ["--out", str(plan_file), "--json", *extra],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["emitted_shardings"]["path"] == str(specs)
    return json.loads(specs.read_text()), Plan.read(plan_file)


def test_an_exported_step_without_paths_is_keyed_by_parameter_names(tmp_path: Path) -> None:
    source = ROOT / "tests" / "data" / "corpus" / "flax_cnn.hlo.gz"
    doc, plan = _emit(source, tmp_path)
    assert doc["schema"] == "rhino.shardings/1"
    assert doc["mesh"] == {"shape": [2, 4], "axis_names": ["axis_0", "axis_1"]}
    params = parse_file(source).entry.parameters
    assert list(doc["partition_specs"]) == [p.name for p in params]  # in parameter order
    split = 0
    for p in params:
        want = partition_spec(
            parse_spec(plan.instruction(p.name).outs[0], 2), p.shape.rank, ("axis_0", "axis_1")
        )
        got = doc["partition_specs"][p.name]
        assert got == [list(e) if isinstance(e, tuple) else e for e in want], p.name
        split += any(e is not None for e in got)
    assert split > 5  # the plan shards the CNN
    assert doc["partition_specs"]["batch__image__.1"][0] is not None  # the batch is split


def _example() -> Any:
    spec = importlib.util.spec_from_file_location(
        "jax_api_train", ROOT / "examples" / "jax_api_train.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_step_printed_with_debug_info_is_keyed_by_pytree_paths_as_rhino_jax_lays_it_out(
    tmp_path: Path,
) -> None:
    example = _example()
    x = jax.random.normal(jax.random.key(1), (64, 128))
    y = jax.random.randint(jax.random.key(2), (64,), 0, 10)
    params = example.model.init(jax.random.key(0), x, train=False)
    args = (params, example.tx.init(params), x, y, jax.random.key(3))
    lowered = jax.jit(example.train_step, keep_unused=True).lower(*args)
    source = tmp_path / "step.hlo"
    source.write_text(lowered.as_text(dialect="hlo", debug_info=True))
    doc, _ = _emit(source, tmp_path, "--axis-names", "data,model")
    specs = doc["partition_specs"]
    assert doc["mesh"] == {"shape": [2, 4], "axis_names": ["data", "model"]}
    assert "params['params']['Dense_0']['kernel']" in specs
    assert "opt_state[0].mu['params']['Dense_1']['bias']" in specs
    assert {"x", "y", "key"} <= set(specs)
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    plan = rhino.jax.plan(example.train_step, *args, mesh=mesh)
    paths, _ = jax.tree_util.tree_flatten_with_path(args)
    shardings = jax.tree.leaves(plan.in_shardings)
    assert len(specs) == len(shardings) == len(paths)
    for (key, got), sharding in zip(specs.items(), shardings, strict=True):
        want = [list(e) if isinstance(e, tuple) else e for e in sharding.spec]
        assert got[: len(want)] == want and all(e is None for e in got[len(want) :]), key


def test_axis_names_are_checked_before_the_search(tmp_path: Path) -> None:
    source = ROOT / "examples" / "mlp.hlo"
    runner = CliRunner()
    lone = runner.invoke(cli, ["plan", str(source), "--mesh", "2x4", "--axis-names", "a,b"])
    assert lone.exit_code == 2 and "--emit-shardings" in lone.output
    wrong = runner.invoke(
        cli,
        ["plan", str(source), "--mesh", "2x4", "--emit-shardings", str(tmp_path / "s.json")]
        + ["--axis-names", "a,b,c"],
    )
    assert wrong.exit_code == 2 and "expected 2 comma-separated names" in wrong.output
    assert "planning" not in wrong.output and not (tmp_path / "s.json").exists()
