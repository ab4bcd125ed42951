"""Multi-layer perceptron regressed onto a target with mean squared error."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from zoo_models.common import Batch, ModelSpec, Params, dense, dense_shapes, f32


@dataclass(frozen=True)
class MLPConfig:
    """Sizes of an MLP: ``layers`` dense layers, relu between them."""

    layers: int
    """Number of dense layers (the last one maps to ``out_features``)."""
    hidden: int
    """Width of every hidden layer and of the input."""
    out_features: int
    """Width of the output (and of the regression target)."""
    batch: int
    """Rows per step."""


CONFIGS: dict[str, MLPConfig] = {
    "tiny": MLPConfig(layers=2, hidden=64, out_features=16, batch=8),
    "small": MLPConfig(layers=4, hidden=1024, out_features=1024, batch=64),
    "large": MLPConfig(layers=8, hidden=8192, out_features=8192, batch=1024),
}


def build(name: str, cfg: MLPConfig) -> ModelSpec:
    """An MLP training step: x [batch, hidden] -> y [batch, out_features], MSE loss."""
    widths = [cfg.hidden] * cfg.layers + [cfg.out_features]
    params = [
        dense_shapes(d_in, d_out) for d_in, d_out in zip(widths[:-1], widths[1:], strict=True)
    ]

    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        h = batch["x"]
        for i, layer in enumerate(params):
            h = dense(h, layer)
            if i + 1 < len(params):
                h = jax.nn.relu(h)
        return jnp.mean(jnp.square(h - batch["y"]))

    batch = {"x": f32(cfg.batch, cfg.hidden), "y": f32(cfg.batch, cfg.out_features)}
    return ModelSpec(name=name, loss_fn=loss_fn, params=params, batch=batch)
