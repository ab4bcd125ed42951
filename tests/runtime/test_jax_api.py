"""rhino.jax: a JAX function's plan as NamedShardings on the user's mesh, and a callable
that runs the whole plan and computes what `jax.jit` computes on one device. Real steps:
the README's Flax + optax loop, an Equinox + optax step with dropout; the errors a user
meets before anything runs."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import rhino.jax
from tests.hlo.corpus import ROOT

EXAMPLE = ROOT / "examples" / "jax_api_train.py"


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("jax_api_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _max_diff(a: Any, b: Any) -> float:
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def _check_laid_out(results: Any, shardings: Any) -> None:
    """Every result is a jax.Array laid out exactly as the plan's NamedSharding says."""
    leaves, tree = jax.tree.flatten(results)
    assert tree == jax.tree.structure(shardings, is_leaf=lambda s: isinstance(s, NamedSharding))
    for array, sharding in zip(leaves, jax.tree.leaves(shardings), strict=True):
        assert isinstance(array, jax.Array) and array.sharding == sharding


def test_the_readme_example_trains_as_on_one_device(capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text()
    assert EXAMPLE.read_text() in readme  # the README shows exactly the code tested here
    example = _load_example()
    params, losses = example.train(planned=True)
    assert "estimated step" in capsys.readouterr().out  # print(plan): the report
    ref_params, ref_losses = example.train(planned=False)
    assert len(losses) == 3 and losses[0] > losses[-1]  # it trains
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert _max_diff(params, ref_params) < 1e-5
    devices = {d for leaf in jax.tree.leaves(params) for d in leaf.sharding.device_set}
    assert len(devices) == 8


def _eqx_step() -> tuple[Any, tuple[Any, ...]]:
    """An Equinox MLP with dropout (keys from jax.random) trained by optax's AdamW; the
    model's arrays are the step's argument, its static parts closed over."""
    import equinox as eqx
    import optax

    class Net(eqx.Module):
        first: eqx.nn.Linear
        drop: eqx.nn.Dropout
        last: eqx.nn.Linear

        def __init__(self, key: jax.Array) -> None:
            k1, k2 = jax.random.split(key)
            self.first = eqx.nn.Linear(32, 128, key=k1)
            self.drop = eqx.nn.Dropout(0.2)
            self.last = eqx.nn.Linear(128, 8, key=k2)

        def __call__(self, x: jax.Array, key: jax.Array) -> jax.Array:
            return self.last(self.drop(jax.nn.gelu(self.first(x)), key=key))

    model = Net(jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)
    tx = optax.adamw(1e-2)

    def step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array, key: jax.Array) -> Any:
        def loss_fn(params: Any) -> jax.Array:
            net = eqx.combine(params, static)
            keys = jax.random.split(key, x.shape[0])
            logits = jax.vmap(net)(x, keys)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    x = jax.random.normal(jax.random.PRNGKey(1), (64, 32))
    y = jax.random.randint(jax.random.PRNGKey(2), (64,), 0, 8)
    return step, (params, tx.init(params), x, y, jax.random.PRNGKey(3))


def test_an_equinox_step_runs_as_planned_and_as_on_one_device() -> None:
    step, args = _eqx_step()
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    plan = rhino.jax.plan(step, *args, mesh=mesh, donate_argnums=(0, 1))
    shardings = plan.in_shardings
    assert jax.tree.structure(
        shardings, is_leaf=lambda s: isinstance(s, NamedSharding)
    ) == jax.tree.structure(args)
    leaves = jax.tree.leaves(shardings)
    assert all(isinstance(s, NamedSharding) and s.mesh == mesh for s in leaves)
    assert any(s.spec != PartitionSpec(*([None] * len(s.spec))) for s in leaves)  # splits
    want = jax.jit(step)(*args)
    run = plan.jit()
    state = jax.device_put(args[:2], shardings[:2])  # donated: consumed by the call
    got = run(*state, *args[2:])
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state))
    with pytest.raises(rhino.jax.ArgumentError, match="deleted"):
        run(*state, *args[2:])  # the state it consumed
    _check_laid_out(got, plan.out_shardings)
    assert _max_diff(got, want) < 1e-5
    assert not [n for n in plan.notes if "moved at each call" in n], plan.notes
    # a second call on the first's results: they are already where the program wants them
    again = run(got[0], got[1], *args[2:])
    want_again = jax.jit(step)(want[0], want[1], *args[2:])
    assert _max_diff(again, want_again) < 1e-5
    report = str(plan)
    assert "memory per device" in report and "opt_state" in report


def _nnx_step() -> tuple[Any, tuple[Any, ...]]:
    """A Flax NNX MLP with dropout and nnx.Optimizer (optax Adam), in NNX's functional
    form: the step merges the (model, optimizer) state, which holds the dropout stream's
    PRNG key (a typed key array) and its counter, and returns it updated."""
    import optax

    try:
        from flax import nnx
    except AttributeError as e:  # flax 0.12.8's nnx under jax 0.12: no hijax.HiPrimitive
        pytest.skip(f"flax.nnx does not import under jax {jax.__version__}: {e}")

    class Net(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.first = nnx.Linear(32, 64, rngs=rngs)
            self.drop = nnx.Dropout(0.2, rngs=rngs)
            self.last = nnx.Linear(64, 8, rngs=rngs)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.last(self.drop(nnx.relu(self.first(x))))

    model = Net(nnx.Rngs(params=0, dropout=1))
    graphdef, state = nnx.split((model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)))

    def step(state: Any, x: jax.Array, y: jax.Array) -> Any:
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model: Net) -> jax.Array:
            return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    x = jax.random.normal(jax.random.key(1), (64, 32))
    return step, (state, x, jax.random.randint(jax.random.key(2), (64,), 0, 8))


def _unkeyed(tree: Any) -> Any:
    """PRNG key arrays as their data, to compare."""
    return jax.tree.map(
        lambda a: (
            jax.random.key_data(a) if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) else a
        ),
        tree,
    )


def test_a_flax_nnx_step_carries_its_prng_keys_through_the_plan() -> None:
    step, args = _nnx_step()
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    plan = rhino.jax.plan(step, *args, mesh=mesh)
    keys = [
        leaf
        for leaf in jax.tree.leaves(args[0])
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    ]
    assert len(keys) == 1  # the dropout stream's key
    run = plan.jit()
    got = run(*args)
    want = jax.jit(step)(*args)
    _check_laid_out(got, plan.out_shardings)
    out_keys = [
        leaf
        for leaf in jax.tree.leaves(got[0])
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    ]
    assert len(out_keys) == 1 and out_keys[0].dtype == keys[0].dtype
    assert _max_diff(_unkeyed(got), _unkeyed(want)) < 1e-5
    again, want_again = run(got[0], *args[1:]), jax.jit(step)(want[0], *args[1:])
    assert _max_diff(_unkeyed(again), _unkeyed(want_again)) < 1e-5
    assert float(again[1]) != float(got[1])  # it trains (and the dropout mask moved on)


def _tiny() -> tuple[Any, tuple[Any, ...]]:
    def fn(w: dict[str, jax.Array], x: jax.Array, scale: float) -> Any:
        h = jnp.tanh(x @ w["a"])
        return {"h": h * scale, "sum": (h @ w["b"]).sum()}

    w = {"a": jnp.ones((16, 32)) / 16, "b": jnp.ones((32, 8))}
    return fn, (w, jnp.arange(64 * 16, dtype=jnp.float32).reshape(64, 16) / 1000, 2.0)


@pytest.fixture(scope="module")
def tiny_plan() -> rhino.jax.JaxPlan:
    fn, args = _tiny()
    return rhino.jax.plan(fn, *args, mesh=jax.make_mesh((2, 4), ("data", "model")))


def test_shapes_plan_and_host_arrays_and_numbers_run_as_jax_jit_takes_them(
    tiny_plan: rhino.jax.JaxPlan,
) -> None:
    fn, (w, x, scale) = _tiny()
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (w, x))
    abstract = rhino.jax.plan(fn, *shapes, scale, mesh=tiny_plan.mesh)  # nothing computed
    assert abstract.in_shardings == tiny_plan.in_shardings
    got = tiny_plan.jit()(jax.tree.map(np.asarray, w), np.asarray(x, np.float64), 3)
    want = jax.jit(fn)(w, x, 3.0)
    _check_laid_out(got, tiny_plan.out_shardings)
    assert _max_diff(got, want) < 1e-5


def test_arguments_that_do_not_match_are_refused_before_running(
    tiny_plan: rhino.jax.JaxPlan,
) -> None:
    _, (w, x, scale) = _tiny()
    run = tiny_plan.jit()
    with pytest.raises(rhino.jax.ArgumentError, match=r"missing \[2\] \(4 leaves planned, 3 given"):
        run(w, x)
    with pytest.raises(TypeError, match=r"missing \[0\]\['b'\]"):  # ArgumentError: a TypeError
        run({"a": w["a"]}, x, scale)
    with pytest.raises(rhino.jax.ArgumentError, match=r"not planned \[0\]\['c'\]"):
        run({**w, "c": w["a"]}, x, scale)
    with pytest.raises(
        rhino.jax.ArgumentError, match=r"missing \[0\]\['a'\], .*not planned \[0\]\[0\]"
    ):
        run([w["a"], w["b"]], x, scale)
    from flax.core import FrozenDict

    with pytest.raises(rhino.jax.ArgumentError, match="same leaves in other containers"):
        run(FrozenDict(w), x, scale)
    with pytest.raises(rhino.jax.ArgumentError, match=r"w\['a'\]: expected shape \[16, 32\]"):
        run({"a": w["a"][:8], "b": w["b"]}, x, scale)
    with pytest.raises(rhino.jax.ArgumentError, match="x: expected dtype float32, got int32"):
        run(w, x.astype(jnp.int32), scale)


def test_requests_it_cannot_serve_are_refused() -> None:
    fn, args = _tiny()
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    with pytest.raises(rhino.jax.PlanError, match="rhino pipeline"):
        rhino.jax.plan(fn, *args, mesh=mesh, stages=2)
    with pytest.raises(ValueError, match="jax.sharding.Mesh"):  # a PlanError is a ValueError
        rhino.jax.plan(fn, *args, mesh=(2, 4))  # type: ignore[arg-type]
    with pytest.raises(rhino.jax.PlanError, match="takes arrays"):
        rhino.jax.plan(fn, args[0], args[1], "2", mesh=mesh)


def test_a_saved_plan_is_reused_on_its_mesh_and_refused_on_another(
    tiny_plan: rhino.jax.JaxPlan, tmp_path: Path
) -> None:
    fn, args = _tiny()
    saved = tmp_path / "plan.json"
    tiny_plan.plan.write(saved)
    again = rhino.jax.plan(fn, *args, mesh=tiny_plan.mesh, use_plan=saved)
    assert again.in_shardings == tiny_plan.in_shardings
    assert again.out_shardings == tiny_plan.out_shardings
    with pytest.raises(rhino.jax.PlanError, match=r"mesh 2x4 \(8 devices\).*shape 8 \(8"):
        rhino.jax.plan(fn, *args, mesh=jax.make_mesh((8,), ("data",)), use_plan=saved)
    with pytest.raises(rhino.jax.PlanError, match="mesh 2x4.*shape 4 "):
        rhino.jax.plan(fn, *args, mesh=jax.make_mesh((4,), ("x",)), use_plan=tiny_plan.plan)
    other = (args[0], args[1][:32], args[2])  # another program: the plan does not fit
    with pytest.raises(rhino.jax.PlanError, match="does not fit"):
        rhino.jax.plan(fn, *other, mesh=tiny_plan.mesh, use_plan=saved)


SCRIPT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, jax.numpy as jnp
import rhino.jax

def f(w, x):
    return jnp.tanh(x @ w).sum()

mesh = jax.make_mesh((2, 4), ("data", "model"))
args = (jnp.ones((16, 8)) / 16, jnp.ones((32, 16)))
top = rhino.jax.plan(f, *args, mesh=mesh)  # unguarded: a worker would run this again
print("top", float(top.jit()(*args)), top.notes)

if __name__ == "__main__":
    guarded = rhino.jax.plan(f, *args, mesh=mesh)
    print("guarded", float(guarded.jit()(*args)), guarded.notes)
"""


def test_a_script_without_a_main_guard_plans_without_worker_processes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    top, guarded = (
        line for line in done.stdout.splitlines() if line.startswith(("top", "guarded"))
    )
    want = float(jnp.tanh(jnp.ones((32, 16)) @ (jnp.ones((16, 8)) / 16)).sum())
    # a float32 sum of 256 terms, in another order when sharded: within 256 ulps
    close = pytest.approx(want, rel=256 * float(jnp.finfo(jnp.float32).eps))
    assert float(top.split()[1]) == close
    assert "without worker processes" in top
    assert float(guarded.split()[1]) == close
    assert "worker" not in guarded


def test_layouts_no_named_sharding_expresses_are_taken_as_the_nearest_one() -> None:
    """A plan whose argument layout has a non-maximal stride and whose result holds
    partial sums (edited in: rhino's search gives parameters maximal layouts): the
    NamedShardings are the nearest expressible ones, the program takes and returns them,
    and the numbers are jax.jit's."""

    def fn(x: jax.Array, w: jax.Array) -> Any:
        return (x * 2).sum(axis=0), x @ w

    args = (jnp.arange(128.0).reshape(8, 16), jnp.ones((16, 4)))
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    made = rhino.jax.plan(fn, *args, mesh=mesh).plan
    (total,) = (
        i for i in made.instructions if i.opcode == "reduce" and i.shape.startswith("f32[16]")
    )
    edits = {"x.1": "S0[s=2]R", total.name: "PS0"}
    edited = dataclasses.replace(
        made,
        instructions=tuple(
            dataclasses.replace(i, outs=(edits[i.name],), sharding=None) if i.name in edits else i
            for i in made.instructions
        ),
    )
    plan = rhino.jax.plan(fn, *args, mesh=mesh, use_plan=edited)
    assert plan.in_shardings[0].spec == PartitionSpec("data", None)
    assert plan.out_shardings[0].spec == PartitionSpec("model")
    notes = "\n".join(plan.notes)
    assert "planned S0[s=2]R (a non-maximal stride)" in notes and "taken as S0R" in notes
    assert "planned PS0 (partial sums)" in notes and "taken as RS0" in notes
    got = plan.jit()(*args)
    _check_laid_out(got, plan.out_shardings)
    assert _max_diff(got, jax.jit(fn)(*args)) < 1e-5
    assert not [n for n in plan.notes if "moved at each call" in n], plan.notes
    # a stride written out that is the maximal one (4 of 8 rows a shard) is no stride
    maximal = dataclasses.replace(
        edited,
        instructions=tuple(
            dataclasses.replace(i, outs=("S0[s=4]R",)) if i.name == "x.1" else i
            for i in edited.instructions
        ),
    )
    plan = rhino.jax.plan(fn, *args, mesh=mesh, use_plan=maximal)
    assert plan.in_shardings[0].spec == PartitionSpec("data", None)
    assert not [n for n in plan.notes if "planned S0[s=4]R" in n], plan.notes


def _keyed() -> tuple[Any, tuple[Any, ...]]:
    def fn(keys: jax.Array, x: jax.Array) -> Any:
        return jax.vmap(lambda k: jax.random.normal(k, (4,)))(keys) + x, keys

    return fn, (jax.random.split(jax.random.key(0), 8), jnp.ones((8, 4)))


def test_prng_keys_whose_data_the_plan_splits_are_laid_out_whole() -> None:
    """A typed key array's data has one more dim than the keys; a plan splitting that dim
    (pinned here) has no NamedSharding for the keys: they are laid out without the split,
    converted at each call, returned as keys."""
    fn, args = _keyed()
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    plan = rhino.jax.plan(fn, *args, mesh=mesh, pins={"keys.1": "S1R"})
    assert plan.in_shardings[0].spec == PartitionSpec(None)
    assert sum("splits the data of PRNG keys (S1R)" in n for n in plan.notes) == 2
    got, want = plan.jit()(*args), jax.jit(fn)(*args)
    _check_laid_out(got, plan.out_shardings)
    assert got[1].dtype == args[0].dtype
    assert _max_diff(_unkeyed(got[1]), _unkeyed(want[1])) == 0  # the same keys
    assert _max_diff(got[0], want[0]) < 1e-6  # jax 0.12: 1 ulp apart where sharded


def test_rhino_device_d_is_the_meshs_flat_device_d_in_any_device_order() -> None:
    fn, args = _keyed()
    order = [3, 1, 7, 5, 0, 2, 6, 4]
    mesh = Mesh(np.array(jax.devices()[:8], dtype=object)[order].reshape(2, 4), ("a", "b"))
    plan = rhino.jax.plan(fn, *args, mesh=mesh)
    assert plan.in_shardings[1].spec != PartitionSpec(None, None)  # x is split: order matters
    got = plan.jit()(*args)
    _check_laid_out(got, plan.out_shardings)
    want = jax.jit(fn)(*args)
    assert _max_diff(_unkeyed(got[1]), _unkeyed(want[1])) == 0
    assert _max_diff(got[0], want[0]) < 1e-6
    assert not [n for n in plan.notes if "moved at each call" in n], plan.notes
