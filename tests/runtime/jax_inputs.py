"""A small JAX training step written out in every form `rhino.runtime.sources` reads.

The step: a two-layer MLP whose parameters are a pytree (`params['dense']['kernel']`
...), a `jax.random` dropout, plain SGD written in jax, the parameters donated. Shared by
tests/runtime/test_sources.py and tests/cli/test_sources_cmd.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def init(key: jax.Array) -> dict[str, Any]:
    k1, k2 = jax.random.split(key)
    return {
        "dense": {"kernel": jax.random.normal(k1, (8, 16)), "bias": jnp.zeros(16)},
        "out": {"kernel": jax.random.normal(k2, (16, 4))},
    }


def loss(params: dict[str, Any], x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["dense"]["kernel"] + params["dense"]["bias"])
    keep = jax.random.bernoulli(key, 0.9, h.shape)
    h = jnp.where(keep, h / 0.9, 0.0)
    return jnp.mean((h @ params["out"]["kernel"] - y) ** 2)


def step(params: dict[str, Any], x: jax.Array, y: jax.Array, key: jax.Array) -> Any:
    value, grads = jax.value_and_grad(loss)(params, x, y, key)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


def arguments() -> tuple[Any, ...]:
    x = jax.random.normal(jax.random.key(7), (4, 8))
    y = jax.random.normal(jax.random.key(8), (4, 4))
    return init(jax.random.key(0)), x, y, jax.random.key(1)


def flat_inputs(args: tuple[Any, ...]) -> list[np.ndarray]:
    """The step's arguments as the HLO entry's parameters: the pytree's leaves, the key
    as its raw u32[2]."""
    params, x, y, key = args
    leaves = jax.tree.leaves(params)
    return [np.asarray(v) for v in (*leaves, x, y, jax.random.key_data(key))]


PARAMETER_PATHS = [
    "params['dense']['bias']",
    "params['dense']['kernel']",
    "params['out']['kernel']",
    "x",
    "y",
    "key",
]
OUTPUT_PATHS = [
    "result[0]['dense']['bias']",
    "result[0]['dense']['kernel']",
    "result[0]['out']['kernel']",
    "result[1]",
]


def write_inputs(folder: Path) -> dict[str, Path]:
    """The step lowered once and written as: HLO text (`dialect="hlo"`, the reference),
    StableHLO text (plain and with debug locations), a serialized HloModuleProto."""
    lowered = jax.jit(step, donate_argnums=0).lower(*arguments())
    files = {
        "hlo": folder / "step.hlo",
        "stablehlo": folder / "step.mlir",
        "stablehlo-debug": folder / "step_debug.mlir",
        "hlo-proto": folder / "step.pb",
    }
    files["hlo"].write_text(lowered.as_text(dialect="hlo"))
    files["stablehlo"].write_text(lowered.as_text())
    files["stablehlo-debug"].write_text(lowered.as_text(debug_info=True))
    files["hlo-proto"].write_bytes(lowered.compiler_ir("hlo").as_serialized_hlo_module_proto())
    return files


def noise(key: jax.Array) -> jax.Array:
    """A helper with more instructions than the step and no dot: a dump's trap."""
    z = jax.random.normal(key, (64,))
    for _ in range(60):
        z = jnp.sin(z) * 1.01 + 0.1
    return z


def write_dump(folder: Path, *, text: bool = True) -> None:
    """An XLA dump of three compiles, as `XLA_FLAGS=--xla_dump_to=folder` writes it (per
    compile here: XLA reads XLA_FLAGS once per process): a jit wrapper, `noise` (the most
    instructions) and the step (the dots), each `before_optimizations` module as text
    (with `text`) and as an HloProto."""
    options = {
        "xla_dump_to": str(folder),
        "xla_dump_hlo_as_text": text,
        "xla_dump_hlo_as_proto": True,
    }
    jax.jit(lambda a: a * 2.0).lower(jnp.ones(3)).compile(options)
    jax.jit(noise).lower(jax.random.key(3)).compile(options)
    jax.jit(step, donate_argnums=0).lower(*arguments()).compile(options)
