"""Shared pieces of the zoo: the model spec, the Adam training step, and common layers.

Every model is a loss function over (params, batch) plus the abstract shapes of both. The
training step built here is what gets lowered: forward, backward and one Adam update, with
Adam's two moment buffers and step counter as explicit inputs and outputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

F32 = jnp.float32
I32 = jnp.int32

Params = Any  # a pytree of arrays (or of jax.ShapeDtypeStruct when abstract)
Batch = Mapping[str, Any]
LossFn = Callable[[Params, Batch], jax.Array]


class ZooError(Exception):
    """A zoo request that cannot be built: unknown model or config, or a bad override."""


def f32(*shape: int) -> jax.ShapeDtypeStruct:
    """An abstract float32 array of the given shape."""
    return jax.ShapeDtypeStruct(shape, F32)


def i32(*shape: int) -> jax.ShapeDtypeStruct:
    """An abstract int32 array of the given shape."""
    return jax.ShapeDtypeStruct(shape, I32)


@dataclass(frozen=True)
class ModelSpec:
    """One model, ready to lower: what it computes and the shapes it computes on."""

    name: str
    """Identifier used in the HLO module name, e.g. ``gpt_medium``."""
    loss_fn: LossFn
    """Scalar training loss of (params, batch)."""
    params: Params
    """Pytree of ``jax.ShapeDtypeStruct``: the trainable weights."""
    batch: dict[str, jax.ShapeDtypeStruct]
    """Named abstract inputs of one step (tokens, labels, images, ...)."""


@dataclass(frozen=True)
class Adam:
    """Adam hyper-parameters (Kingma & Ba), constant learning rate, no weight decay."""

    learning_rate: float = 1e-3
    """Step size."""
    b1: float = 0.9
    """Decay of the first moment."""
    b2: float = 0.999
    """Decay of the second moment."""
    eps: float = 1e-8
    """Added to the root of the second moment."""


def make_train_step(spec: ModelSpec, adam: Adam = Adam()) -> Callable[..., Any]:
    """The function that is lowered: one full training step of ``spec``.

    train_step(params, adam_m, adam_v, adam_count, batch)
        -> (loss, new_params, new_adam_m, new_adam_v, new_adam_count)

    ``adam_m`` and ``adam_v`` have the structure and shapes of ``params``; ``adam_count`` is
    an int32 scalar (the number of updates done so far), used for bias correction.
    """

    def train_step(
        params: Params, adam_m: Params, adam_v: Params, adam_count: jax.Array, batch: Batch
    ) -> tuple[jax.Array, Params, Params, Params, jax.Array]:
        loss, grads = jax.value_and_grad(spec.loss_fn)(params, batch)
        count = adam_count + 1
        t = count.astype(F32)
        m = jax.tree.map(lambda m_, g: adam.b1 * m_ + (1.0 - adam.b1) * g, adam_m, grads)
        v = jax.tree.map(lambda v_, g: adam.b2 * v_ + (1.0 - adam.b2) * g * g, adam_v, grads)
        step_size = adam.learning_rate * jnp.sqrt(1.0 - adam.b2**t) / (1.0 - adam.b1**t)

        def update(p: jax.Array, m_: jax.Array, v_: jax.Array) -> jax.Array:
            return p - step_size * m_ / (jnp.sqrt(v_) + adam.eps)

        new_params = jax.tree.map(update, params, m, v)
        return loss, new_params, m, v, count

    train_step.__name__ = f"{spec.name}_train_step"
    train_step.__qualname__ = train_step.__name__
    return train_step


def abstract_args(spec: ModelSpec) -> tuple[Any, ...]:
    """Abstract arguments of ``make_train_step(spec)``, in order; nothing is allocated."""
    return (spec.params, spec.params, spec.params, i32(), spec.batch)


# ---------------------------------------------------------------------------------------
# Layers. Weights are plain dicts of arrays; shapes are chosen by each family's builder.


def dense(x: jax.Array, p: Mapping[str, jax.Array]) -> jax.Array:
    """``x @ w + b`` over the last axis of ``x``."""
    return jnp.einsum("...i,io->...o", x, p["w"]) + p["b"]


def dense_shapes(d_in: int, d_out: int) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes of a ``dense`` layer's weights."""
    return {"w": f32(d_in, d_out), "b": f32(d_out)}


def layer_norm(x: jax.Array, p: Mapping[str, jax.Array], eps: float = 1e-5) -> jax.Array:
    """Layer normalization over the last axis, with a learned scale and bias."""
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def layer_norm_shapes(d: int) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes of a ``layer_norm``'s weights."""
    return {"scale": f32(d), "bias": f32(d)}


def attention(
    x: jax.Array, p: Mapping[str, jax.Array], heads: int, head_dim: int, causal: bool
) -> jax.Array:
    """Multi-head self-attention with explicit heads: x [B, S, D] -> [B, S, D].

    Q, K, V are projected to [B, S, H, Dh]; scores are [B, H, S, S]; the output projection
    maps H * Dh back to D.
    """
    b, s, _ = x.shape
    q = (jnp.einsum("bsd,dk->bsk", x, p["wq"]) + p["bq"]).reshape(b, s, heads, head_dim)
    k = (jnp.einsum("bsd,dk->bsk", x, p["wk"]) + p["bk"]).reshape(b, s, heads, head_dim)
    v = (jnp.einsum("bsd,dk->bsk", x, p["wv"]) + p["bv"]).reshape(b, s, heads, head_dim)
    scores = jnp.einsum("bshd,bthd->bhst", q, k) / math.sqrt(head_dim)
    if causal:
        mask = jnp.tril(jnp.ones((s, s), dtype=bool))
        scores = jnp.where(mask, scores, jnp.finfo(F32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    ctx = jnp.einsum("bhst,bthd->bshd", probs, v).reshape(b, s, heads * head_dim)
    return jnp.einsum("bsk,kd->bsd", ctx, p["wo"]) + p["bo"]


def attention_shapes(d: int, heads: int, head_dim: int) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes of an ``attention`` layer's weights."""
    k = heads * head_dim
    return {
        "wq": f32(d, k),
        "bq": f32(k),
        "wk": f32(d, k),
        "bk": f32(k),
        "wv": f32(d, k),
        "bv": f32(k),
        "wo": f32(k, d),
        "bo": f32(d),
    }


def mlp_block(x: jax.Array, p: Params) -> jax.Array:
    """Transformer feed-forward block: dense, gelu, dense."""
    return dense(jax.nn.gelu(dense(x, p["fc1"])), p["fc2"])


def mlp_block_shapes(d: int, ffn: int) -> dict[str, Any]:
    """Shapes of an ``mlp_block``'s weights."""
    return {"fc1": dense_shapes(d, ffn), "fc2": dense_shapes(ffn, d)}


def softmax_cross_entropy(
    logits: jax.Array, labels: jax.Array, weights: jax.Array | None = None
) -> jax.Array:
    """Mean (or ``weights``-weighted mean) cross-entropy of int labels under ``logits``.

    The label log-probability is picked with a one-hot product rather than a gather, as
    is usual for a vocabulary that may be sharded.
    """
    logp = jax.nn.log_softmax(logits, axis=-1)
    onehot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
    nll = -jnp.sum(onehot * logp, axis=-1)
    if weights is None:
        return jnp.mean(nll)
    return jnp.sum(nll * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def conv2d(x: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    """NHWC convolution with an HWIO kernel and SAME padding."""
    return jax.lax.conv_general_dilated(
        x,
        w,
        window_strides=(stride, stride),
        padding="SAME",
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )


def conv_shapes(k: int, c_in: int, c_out: int) -> jax.ShapeDtypeStruct:
    """Shape of a k x k HWIO convolution kernel."""
    return f32(k, k, c_in, c_out)


def batch_norm(x: jax.Array, p: Mapping[str, jax.Array], eps: float = 1e-5) -> jax.Array:
    """Batch normalization in training mode: statistics of this batch over N, H, W."""
    mean = jnp.mean(x, axis=(0, 1, 2), keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=(0, 1, 2), keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * p["scale"] + p["bias"]


def max_pool(x: jax.Array, size: int = 2) -> jax.Array:
    """NHWC max pooling with a size x size window and stride ``size``."""
    window = (1, size, size, 1)
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, window, window, "VALID")
