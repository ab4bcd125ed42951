"""Encoder-decoder transformer (T5/original-Transformer shape): the encoder reads the
source tokens; every decoder block attends causally to the target and then, through
cross-attention, to the encoder's output; an LM head and cross-entropy on the target.

The encoder's output is read by every decoder block, so the graph is not a chain: a
pipeline stage boundary inside the decoder cuts the encoder's output once per stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from zoo_models.common import (
    Batch,
    ModelSpec,
    Params,
    attention,
    attention_shapes,
    f32,
    i32,
    layer_norm,
    layer_norm_shapes,
    mlp_block,
    mlp_block_shapes,
    softmax_cross_entropy,
)


@dataclass(frozen=True)
class EncDecConfig:
    """Sizes of an encoder-decoder transformer."""

    encoder_layers: int
    """Encoder blocks."""
    decoder_layers: int
    """Decoder blocks."""
    hidden: int
    """Model width D."""
    ffn: int
    """Width of the feed-forward blocks."""
    heads: int
    """Attention heads H."""
    head_dim: int
    """Width of one head Dh."""
    vocab: int
    """Vocabulary size V (shared by source and target)."""
    seq: int
    """Tokens per source and per target sequence S."""
    batch: int
    """Sequence pairs per step B."""


CONFIGS: dict[str, EncDecConfig] = {
    "tiny": EncDecConfig(2, 2, 64, 256, 4, 16, vocab=512, seq=64, batch=8),
    "base": EncDecConfig(6, 6, 512, 2048, 8, 64, vocab=8192, seq=256, batch=8),
    # T5-large's depth and widths (24 + 24 blocks), for stage planning at real graph sizes
    "large": EncDecConfig(24, 24, 1024, 4096, 16, 64, vocab=32128, seq=512, batch=8),
}


def cross_attention(x: jax.Array, memory: jax.Array, p: Params, cfg: EncDecConfig) -> jax.Array:
    """Queries from the decoder's x [B, S, D], keys and values from memory [B, T, D]."""
    b, s, _ = x.shape
    t = memory.shape[1]
    heads, dh = cfg.heads, cfg.head_dim
    q = (jnp.einsum("bsd,dk->bsk", x, p["wq"]) + p["bq"]).reshape(b, s, heads, dh)
    k = (jnp.einsum("btd,dk->btk", memory, p["wk"]) + p["bk"]).reshape(b, t, heads, dh)
    v = (jnp.einsum("btd,dk->btk", memory, p["wv"]) + p["bv"]).reshape(b, t, heads, dh)
    probs = jax.nn.softmax(jnp.einsum("bshd,bthd->bhst", q, k) / math.sqrt(dh), axis=-1)
    ctx = jnp.einsum("bhst,bthd->bshd", probs, v).reshape(b, s, heads * dh)
    return jnp.einsum("bsk,kd->bsd", ctx, p["wo"]) + p["bo"]


def encoder_block(x: jax.Array, p: Params, cfg: EncDecConfig) -> jax.Array:
    x = x + attention(layer_norm(x, p["ln1"]), p["attn"], cfg.heads, cfg.head_dim, False)
    return x + mlp_block(layer_norm(x, p["ln2"]), p["mlp"])


def decoder_block(x: jax.Array, memory: jax.Array, p: Params, cfg: EncDecConfig) -> jax.Array:
    x = x + attention(layer_norm(x, p["ln1"]), p["attn"], cfg.heads, cfg.head_dim, True)
    x = x + cross_attention(layer_norm(x, p["ln2"]), memory, p["cross"], cfg)
    return x + mlp_block(layer_norm(x, p["ln3"]), p["mlp"])


def _block_shapes(cfg: EncDecConfig, decoder: bool) -> dict[str, Any]:
    shapes = {
        "ln1": layer_norm_shapes(cfg.hidden),
        "attn": attention_shapes(cfg.hidden, cfg.heads, cfg.head_dim),
        "ln2": layer_norm_shapes(cfg.hidden),
        "mlp": mlp_block_shapes(cfg.hidden, cfg.ffn),
    }
    if decoder:
        shapes["cross"] = attention_shapes(cfg.hidden, cfg.heads, cfg.head_dim)
        shapes["ln3"] = layer_norm_shapes(cfg.hidden)
    return shapes


def build(name: str, cfg: EncDecConfig) -> ModelSpec:
    """An encoder-decoder training step with the layers unrolled."""
    params = {
        "embed": f32(cfg.vocab, cfg.hidden),
        "pos": f32(cfg.seq, cfg.hidden),
        "encoder": [_block_shapes(cfg, False) for _ in range(cfg.encoder_layers)],
        "ln_enc": layer_norm_shapes(cfg.hidden),
        "decoder": [_block_shapes(cfg, True) for _ in range(cfg.decoder_layers)],
        "ln_f": layer_norm_shapes(cfg.hidden),
        "head": f32(cfg.hidden, cfg.vocab),
    }
    batch = {
        "source": i32(cfg.batch, cfg.seq),
        "target": i32(cfg.batch, cfg.seq),
        "labels": i32(cfg.batch, cfg.seq),
    }

    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        x = jnp.take(params["embed"], batch["source"], axis=0) + params["pos"]
        for layer in params["encoder"]:
            x = encoder_block(x, layer, cfg)
        memory = layer_norm(x, params["ln_enc"])
        h = jnp.take(params["embed"], batch["target"], axis=0) + params["pos"]
        for layer in params["decoder"]:
            h = decoder_block(h, memory, layer, cfg)
        logits = jnp.einsum("bsd,dv->bsv", layer_norm(h, params["ln_f"]), params["head"])
        return softmax_cross_entropy(logits, batch["labels"])

    return ModelSpec(name=name, loss_fn=loss_fn, params=params, batch=batch)
