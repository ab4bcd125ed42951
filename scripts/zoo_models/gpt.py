"""GPT decoder: token + position embedding, pre-LN blocks, final LN, LM head, cross-entropy.

Two builders share the block: ``build`` unrolls the layers in Python (one copy of the block
per layer in the HLO); ``build_scan`` stacks each layer weight along a leading layer axis
and runs the blocks under ``jax.lax.scan`` (the HLO holds one block inside a ``while``).
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
class GPTConfig:
    """Sizes of a GPT decoder (the columns of the Rhino paper's Table 1, plus data sizes)."""

    layers: int
    """Number of decoder blocks."""
    hidden: int
    """Model width D."""
    ffn: int
    """Width of the feed-forward block."""
    heads: int
    """Attention heads H."""
    head_dim: int
    """Width of one head Dh (H * Dh == D in every shipped config)."""
    vocab: int
    """Vocabulary size V."""
    seq: int
    """Tokens per sequence S."""
    batch: int
    """Sequences per step B."""


def _big(layers: int, hidden: int, ffn: int, heads: int, head_dim: int) -> GPTConfig:
    return GPTConfig(layers, hidden, ffn, heads, head_dim, vocab=50304, seq=1024, batch=8)


CONFIGS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(2, 64, 256, 4, 16, vocab=512, seq=64, batch=8),
    "medium": _big(24, 1024, 4096, 16, 64),
    "large": _big(24, 1536, 6144, 16, 96),
    "xl": _big(24, 2048, 8192, 32, 64),
    "2.7b": _big(32, 2560, 10240, 32, 80),
    "6.7b": _big(32, 4096, 16384, 32, 128),
    "hidden512": _big(24, 512, 2048, 8, 64),
}


def block(x: jax.Array, p: Params, cfg: GPTConfig, causal: bool = True) -> jax.Array:
    """One pre-LN transformer block: x + attn(ln(x)), then + mlp(ln(.))."""
    x = x + attention(layer_norm(x, p["ln1"]), p["attn"], cfg.heads, cfg.head_dim, causal)
    return x + mlp_block(layer_norm(x, p["ln2"]), p["mlp"])


def block_shapes(cfg: GPTConfig) -> dict[str, Any]:
    """Shapes of one block's weights."""
    return {
        "ln1": layer_norm_shapes(cfg.hidden),
        "attn": attention_shapes(cfg.hidden, cfg.heads, cfg.head_dim),
        "ln2": layer_norm_shapes(cfg.hidden),
        "mlp": mlp_block_shapes(cfg.hidden, cfg.ffn),
    }


def embed(params: Params, tokens: jax.Array) -> jax.Array:
    """Token embedding (a gather from ``wte``) plus learned position embedding."""
    return jnp.take(params["wte"], tokens, axis=0) + params["wpe"]


def lm_loss(params: Params, h: jax.Array, labels: jax.Array) -> jax.Array:
    """Final layer norm, LM head and mean next-token cross-entropy."""
    logits = jnp.einsum("bsd,dv->bsv", layer_norm(h, params["ln_f"]), params["head"])
    return softmax_cross_entropy(logits, labels)


def outer_shapes(cfg: GPTConfig) -> dict[str, Any]:
    """Shapes of the weights outside the blocks: embeddings, final LN and LM head."""
    return {
        "wte": f32(cfg.vocab, cfg.hidden),
        "wpe": f32(cfg.seq, cfg.hidden),
        "ln_f": layer_norm_shapes(cfg.hidden),
        "head": f32(cfg.hidden, cfg.vocab),
    }


def lm_batch(cfg: GPTConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Input tokens and next-token labels, both int32 [B, S]."""
    return {"tokens": i32(cfg.batch, cfg.seq), "labels": i32(cfg.batch, cfg.seq)}


def build(name: str, cfg: GPTConfig) -> ModelSpec:
    """A GPT training step with the layers unrolled."""
    params = {**outer_shapes(cfg), "layers": [block_shapes(cfg) for _ in range(cfg.layers)]}

    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        h = embed(params, batch["tokens"])
        for layer in params["layers"]:
            h = block(h, layer, cfg)
        return lm_loss(params, h, batch["labels"])

    return ModelSpec(name=name, loss_fn=loss_fn, params=params, batch=lm_batch(cfg))


def build_scan(name: str, cfg: GPTConfig) -> ModelSpec:
    """A GPT training step whose blocks run under ``jax.lax.scan`` over stacked weights."""
    stacked = jax.tree.map(lambda s: f32(cfg.layers, *s.shape), block_shapes(cfg))
    params = {**outer_shapes(cfg), "layers": stacked}

    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        def step(h: jax.Array, layer: Params) -> tuple[jax.Array, None]:
            return block(h, layer, cfg), None

        h, _ = jax.lax.scan(step, embed(params, batch["tokens"]), params["layers"])
        return lm_loss(params, h, batch["labels"])

    return ModelSpec(name=name, loss_fn=loss_fn, params=params, batch=lm_batch(cfg))
