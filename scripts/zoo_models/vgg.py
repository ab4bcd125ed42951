"""VGG19 with a very large classifier (the Rhino paper's million-class variant).

Sixteen 3x3 convs with relu in five stages, each closed by a 2x2 max pool (its gradient is
a select-and-scatter), then three dense layers: two hidden ones of width ``fc`` and the
classifier of width ``classes``. No dropout (the step is deterministic).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax

from zoo_models.common import (
    Batch,
    ModelSpec,
    Params,
    ZooError,
    conv2d,
    conv_shapes,
    dense,
    dense_shapes,
    f32,
    i32,
    max_pool,
    softmax_cross_entropy,
)

STAGES: tuple[tuple[int, int], ...] = ((2, 1), (2, 2), (4, 4), (4, 8), (4, 8))
"""(convs, width multiplier of ``base_channels``) per stage: VGG configuration E."""


@dataclass(frozen=True)
class VGGConfig:
    """Sizes of a VGG19."""

    base_channels: int
    """Channels of the first stage (64 in VGG19)."""
    fc: int
    """Width of the two hidden dense layers (4096 in VGG19)."""
    classes: int
    """Classifier outputs."""
    image_size: int
    """Height and width of the input images (divisible by 32)."""
    batch: int
    """Images per step."""


CONFIGS: dict[str, VGGConfig] = {
    "tiny": VGGConfig(base_channels=4, fc=64, classes=4096, image_size=32, batch=8),
    "1m": VGGConfig(base_channels=64, fc=4096, classes=1_000_000, image_size=224, batch=128),
    "imagenet": VGGConfig(base_channels=64, fc=4096, classes=1000, image_size=224, batch=128),
}


def param_shapes(cfg: VGGConfig) -> dict[str, object]:
    """Shapes of all weights: conv kernels and biases per stage, then the dense layers."""
    convs, c_in = [], 3
    for count, mult in STAGES:
        for _ in range(count):
            c_out = cfg.base_channels * mult
            convs.append({"w": conv_shapes(3, c_in, c_out), "b": f32(c_out)})
            c_in = c_out
    side = cfg.image_size // 2 ** len(STAGES)
    flat = side * side * c_in
    return {
        "convs": convs,
        "fc1": dense_shapes(flat, cfg.fc),
        "fc2": dense_shapes(cfg.fc, cfg.fc),
        "classifier": dense_shapes(cfg.fc, cfg.classes),
    }


def build(name: str, cfg: VGGConfig) -> ModelSpec:
    """A VGG19 training step on images [B, H, W, 3] with int labels [B]."""
    if cfg.image_size % 2 ** len(STAGES):
        raise ZooError(f"vgg19: image_size {cfg.image_size} not divisible by {2 ** len(STAGES)}")
    stage_ends = set()
    index = 0
    for count, _ in STAGES:
        index += count
        stage_ends.add(index - 1)

    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        h = batch["images"]
        for i, p in enumerate(params["convs"]):
            h = jax.nn.relu(conv2d(h, p["w"]) + p["b"])
            if i in stage_ends:
                h = max_pool(h)
        h = h.reshape(h.shape[0], -1)
        h = jax.nn.relu(dense(h, params["fc1"]))
        h = jax.nn.relu(dense(h, params["fc2"]))
        return softmax_cross_entropy(dense(h, params["classifier"]), batch["labels"])

    size = cfg.image_size
    batch = {"images": f32(cfg.batch, size, size, 3), "labels": i32(cfg.batch)}
    return ModelSpec(name=name, loss_fn=loss_fn, params=param_shapes(cfg), batch=batch)
