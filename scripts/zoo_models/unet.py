"""UNet as in diffusion models: conv blocks down and up, with skip connections by concat.

NHWC throughout. Level i works at ``base_channels * multipliers[i]`` channels; each level's
block is two (3x3 conv, group norm, silu) steps, or with ``residual`` DDPM's residual block
(Ho et al. 2020): group norm, silu, 3x3 conv, plus a projection of the time embedding;
group norm, silu, 3x3 conv; added to the block's input, through a 1x1 conv where the
channels change. The time embedding is sinusoidal features of each image's noise level
through a two-layer silu MLP, computed once and read by every block (a branch beside
the image path, as the 1x1 shortcut is beside the block). Going down: the block's output
is kept as a skip, then a stride-2 3x3 conv halves the resolution. Going up: nearest-neighbour 2x
upsampling (broadcast + reshape) and a 3x3 conv, then concatenation with the skip on the
channel axis and a block. A final 3x3 conv maps back to the input channels; the loss is the
mean squared error against a target image (the denoising objective).
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
    conv2d,
    conv_shapes,
    dense,
    dense_shapes,
    f32,
)


@dataclass(frozen=True)
class UNetConfig:
    """Sizes of a UNet."""

    levels: int
    """Resolution levels; the image is halved levels - 1 times."""
    base_channels: int
    """Channels of the first level."""
    image_size: int
    """Height and width of the input images (divisible by 2 ** (levels - 1))."""
    in_channels: int
    """Channels of the input and output images."""
    groups: int
    """Group-norm groups (divides every level's channels)."""
    batch: int
    """Images per step."""
    residual: bool = False
    """DDPM residual blocks with a time embedding (see the module docstring)."""


CONFIGS: dict[str, UNetConfig] = {
    "tiny": UNetConfig(levels=3, base_channels=8, image_size=32, in_channels=4, groups=4, batch=8),
    # "base" scaled down until it plans in seconds, still compute-bound on a V100
    "small": UNetConfig(
        levels=3, base_channels=32, image_size=64, in_channels=4, groups=8, batch=64
    ),
    "base": UNetConfig(
        levels=4, base_channels=64, image_size=64, in_channels=4, groups=32, batch=16
    ),
    "ddpm": UNetConfig(
        levels=4,
        base_channels=64,
        image_size=64,
        in_channels=4,
        groups=32,
        batch=16,
        residual=True,
    ),
}


def channels(cfg: UNetConfig, level: int) -> int:
    """Channels at ``level`` (doubling each level)."""
    return cfg.base_channels * 2**level


def group_norm(x: jax.Array, p: Params, groups: int, eps: float = 1e-5) -> jax.Array:
    """Group normalization of x [B, H, W, C] over (H, W, C / groups) per group."""
    b, h, w, c = x.shape
    g = x.reshape(b, h, w, groups, c // groups)
    mean = jnp.mean(g, axis=(1, 2, 4), keepdims=True)
    var = jnp.mean(jnp.square(g - mean), axis=(1, 2, 4), keepdims=True)
    g = (g - mean) * jax.lax.rsqrt(var + eps)
    return g.reshape(b, h, w, c) * p["scale"] + p["bias"]


def conv_block(x: jax.Array, p: Params, groups: int) -> jax.Array:
    """Two (conv 3x3, group norm, silu) steps."""
    x = jax.nn.silu(group_norm(conv2d(x, p["conv1"]), p["gn1"], groups))
    return jax.nn.silu(group_norm(conv2d(x, p["conv2"]), p["gn2"], groups))


def conv_block_shapes(c_in: int, c_out: int) -> dict[str, Any]:
    """Shapes of a ``conv_block``'s weights."""
    norm = {"scale": f32(c_out), "bias": f32(c_out)}
    return {
        "conv1": conv_shapes(3, c_in, c_out),
        "gn1": dict(norm),
        "conv2": conv_shapes(3, c_out, c_out),
        "gn2": dict(norm),
    }


def res_block(x: jax.Array, temb: jax.Array, p: Params, groups: int) -> jax.Array:
    """DDPM's residual block on x [B, H, W, C] with the time embedding temb [B, E]."""
    h = conv2d(jax.nn.silu(group_norm(x, p["gn1"], groups)), p["conv1"])
    h = h + dense(jax.nn.silu(temb), p["temb"])[:, None, None, :]
    h = conv2d(jax.nn.silu(group_norm(h, p["gn2"], groups)), p["conv2"])
    return h + (conv2d(x, p["shortcut"]) if "shortcut" in p else x)


def res_block_shapes(c_in: int, c_out: int, embed: int) -> dict[str, Any]:
    """Shapes of a ``res_block``'s weights."""
    shapes = {
        "gn1": {"scale": f32(c_in), "bias": f32(c_in)},
        "conv1": conv_shapes(3, c_in, c_out),
        "temb": dense_shapes(embed, c_out),
        "gn2": {"scale": f32(c_out), "bias": f32(c_out)},
        "conv2": conv_shapes(3, c_out, c_out),
    }
    if c_in != c_out:
        shapes["shortcut"] = conv_shapes(1, c_in, c_out)
    return shapes


def time_embedding(t: jax.Array, p: Params, features: int) -> jax.Array:
    """Sinusoidal features of the noise levels t [B] through a two-layer silu MLP."""
    half = features // 2
    freqs = jnp.exp(-jnp.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
    angles = t[:, None] * freqs[None, :]
    e = jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    return dense(jax.nn.silu(dense(e, p["dense1"])), p["dense2"])


def upsample(x: jax.Array) -> jax.Array:
    """Nearest-neighbour 2x upsampling of x [B, H, W, C] -> [B, 2H, 2W, C]."""
    b, h, w, c = x.shape
    x = jnp.broadcast_to(x[:, :, None, :, None, :], (b, h, 2, w, 2, c))
    return x.reshape(b, 2 * h, 2 * w, c)


def param_shapes(cfg: UNetConfig) -> dict[str, Any]:
    """Shapes of all UNet weights."""
    n, embed = cfg.levels, 4 * cfg.base_channels

    def block(c_in: int, c_out: int) -> dict[str, Any]:
        return (
            res_block_shapes(c_in, c_out, embed) if cfg.residual else conv_block_shapes(c_in, c_out)
        )

    down = [block(channels(cfg, max(i - 1, 0)), channels(cfg, i)) for i in range(n)]
    pools = [conv_shapes(3, channels(cfg, i), channels(cfg, i)) for i in range(n - 1)]
    ups = [conv_shapes(3, channels(cfg, i + 1), channels(cfg, i)) for i in range(n - 1)]
    up_blocks = [block(2 * channels(cfg, i), channels(cfg, i)) for i in range(n - 1)]
    shapes = {
        "stem": conv_shapes(3, cfg.in_channels, cfg.base_channels),
        "down": down,
        "downsample": pools,
        "upsample": ups,
        "up": up_blocks,
        "out": conv_shapes(3, cfg.base_channels, cfg.in_channels),
    }
    if cfg.residual:
        shapes["time"] = {
            "dense1": dense_shapes(cfg.base_channels, embed),
            "dense2": dense_shapes(embed, embed),
        }
    return shapes


def check(cfg: UNetConfig) -> None:
    """Raise ``ZooError`` for sizes the architecture cannot take."""
    if cfg.image_size % 2 ** (cfg.levels - 1):
        raise ZooError(f"unet: image_size {cfg.image_size} not divisible by 2**{cfg.levels - 1}")
    if cfg.base_channels % cfg.groups:
        raise ZooError(
            f"unet: base_channels {cfg.base_channels} not divisible by groups {cfg.groups}"
        )


def build(name: str, cfg: UNetConfig) -> ModelSpec:
    """A UNet training step: images [B, H, W, C] denoised towards targets of the same shape."""
    check(cfg)

    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        if cfg.residual:
            temb = time_embedding(batch["noise_levels"], params["time"], cfg.base_channels)

        def block(x: jax.Array, p: Params) -> jax.Array:
            return (
                res_block(x, temb, p, cfg.groups) if cfg.residual else conv_block(x, p, cfg.groups)
            )

        h = conv2d(batch["images"], params["stem"])
        skips = []
        for i, p in enumerate(params["down"]):
            h = block(h, p)
            if i < cfg.levels - 1:
                skips.append(h)
                h = conv2d(h, params["downsample"][i], stride=2)
        for i in reversed(range(cfg.levels - 1)):
            h = conv2d(upsample(h), params["upsample"][i])
            h = block(jnp.concatenate([h, skips[i]], axis=-1), params["up"][i])
        out = conv2d(h, params["out"])
        return jnp.mean(jnp.square(out - batch["targets"]))

    shape = (cfg.batch, cfg.image_size, cfg.image_size, cfg.in_channels)
    batch = {"images": f32(*shape), "targets": f32(*shape)}
    if cfg.residual:
        batch["noise_levels"] = f32(cfg.batch)
    return ModelSpec(name=name, loss_fn=loss_fn, params=param_shapes(cfg), batch=batch)
