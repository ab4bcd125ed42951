"""Wide-ResNet: a bottleneck ResNet whose inner (3x3) width is multiplied by a width factor.

NHWC activations, HWIO kernels, batch norm in training mode (batch statistics; no running
averages are carried). Stem: 7x7/2 conv, BN, relu, 3x3/2 max pool. Stage i has
``base_channels * 2**i`` filters: its blocks are 1x1 (filters * width) -> 3x3 (same,
stride 2 on a stage's first block after the first stage) -> 1x1 (filters * 4), each
followed by BN, with a 1x1 projection shortcut where the shape changes. Then global average
pooling, a dense classifier and softmax cross-entropy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from zoo_models.common import (
    Batch,
    ModelSpec,
    Params,
    ZooError,
    batch_norm,
    conv2d,
    conv_shapes,
    dense,
    dense_shapes,
    f32,
    i32,
    softmax_cross_entropy,
)

STAGE_SIZES: dict[int, tuple[int, ...]] = {
    14: (1, 1, 1, 1),
    26: (2, 2, 2, 2),
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}
"""Bottleneck blocks per stage for each supported depth (3 convs a block, plus stem and head)."""


@dataclass(frozen=True)
class WideResNetConfig:
    """Sizes of a Wide-ResNet (the columns of the Rhino paper's Table 4, plus data)."""

    layers: int
    """Depth: one of ``STAGE_SIZES`` (50 and 101 in the paper)."""
    base_channels: int
    """Filters of the first stage (doubled each stage)."""
    width_factor: int
    """Multiplier of the bottleneck's inner width."""
    image_size: int
    """Height and width of the input images."""
    classes: int
    """Classifier outputs."""
    batch: int
    """Images per step."""


CONFIGS: dict[str, WideResNetConfig] = {
    "tiny": WideResNetConfig(14, 8, 2, image_size=32, classes=16, batch=8),
    "wr-1.3b": WideResNetConfig(50, 320, 2, image_size=224, classes=1000, batch=8),
    "wr-2.6b": WideResNetConfig(50, 448, 2, image_size=224, classes=1000, batch=8),
    "wr-6b": WideResNetConfig(50, 640, 2, image_size=224, classes=1000, batch=8),
    "wr-12b": WideResNetConfig(101, 320, 12, image_size=224, classes=1000, batch=8),
}


def _bn_shapes(c: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {"scale": f32(c), "bias": f32(c)}


def block_shapes(c_in: int, filters: int, width: int, project: bool) -> dict[str, Any]:
    """Shapes of one bottleneck block's weights."""
    inner, out = filters * width, filters * 4
    shapes: dict[str, Any] = {
        "conv1": conv_shapes(1, c_in, inner),
        "bn1": _bn_shapes(inner),
        "conv2": conv_shapes(3, inner, inner),
        "bn2": _bn_shapes(inner),
        "conv3": conv_shapes(1, inner, out),
        "bn3": _bn_shapes(out),
    }
    if project:
        shapes["proj"] = conv_shapes(1, c_in, out)
        shapes["proj_bn"] = _bn_shapes(out)
    return shapes


def block(x: jax.Array, p: Params, stride: int) -> jax.Array:
    """One bottleneck block with its (identity or projection) shortcut."""
    y = jax.nn.relu(batch_norm(conv2d(x, p["conv1"]), p["bn1"]))
    y = jax.nn.relu(batch_norm(conv2d(y, p["conv2"], stride), p["bn2"]))
    y = batch_norm(conv2d(y, p["conv3"]), p["bn3"])
    shortcut = batch_norm(conv2d(x, p["proj"], stride), p["proj_bn"]) if "proj" in p else x
    return jax.nn.relu(y + shortcut)


def layout(cfg: WideResNetConfig) -> list[tuple[int, int, int, bool]]:
    """(c_in, filters, stride, projected) of every block, in order."""
    if cfg.layers not in STAGE_SIZES:
        raise ZooError(
            f"wresnet: depth {cfg.layers} unknown; expected one of {sorted(STAGE_SIZES)}"
        )
    blocks, c_in = [], cfg.base_channels
    for stage, size in enumerate(STAGE_SIZES[cfg.layers]):
        filters = cfg.base_channels * 2**stage
        for j in range(size):
            stride = 2 if stage > 0 and j == 0 else 1
            blocks.append((c_in, filters, stride, stride != 1 or c_in != filters * 4))
            c_in = filters * 4
    return blocks


def build(name: str, cfg: WideResNetConfig) -> ModelSpec:
    """A Wide-ResNet training step on images [B, H, W, 3] with int labels [B]."""
    blocks = layout(cfg)
    params = {
        "stem": conv_shapes(7, 3, cfg.base_channels),
        "stem_bn": _bn_shapes(cfg.base_channels),
        "blocks": [block_shapes(c, f, cfg.width_factor, proj) for c, f, _, proj in blocks],
        "head": dense_shapes(blocks[-1][1] * 4, cfg.classes),
    }
    strides = [stride for _, _, stride, _ in blocks]

    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        h = jax.nn.relu(batch_norm(conv2d(batch["images"], params["stem"], 2), params["stem_bn"]))
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
        for p, stride in zip(params["blocks"], strides, strict=True):
            h = block(h, p, stride)
        logits = dense(jnp.mean(h, axis=(1, 2)), params["head"])
        return softmax_cross_entropy(logits, batch["labels"])

    size = cfg.image_size
    batch = {"images": f32(cfg.batch, size, size, 3), "labels": i32(cfg.batch)}
    return ModelSpec(name=name, loss_fn=loss_fn, params=params, batch=batch)
