"""DNABERT: a BERT encoder over long k-mer token sequences, trained by masked LM.

Token and position embeddings with layer norm, post-LN encoder blocks with bidirectional
attention, and the BERT MLM head (dense, gelu, layer norm, then logits against the tied
token embedding plus a bias). The loss is cross-entropy over the positions that
``mlm_weights`` marks (1.0 for masked positions, 0.0 elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from zoo_models.common import (
    Batch,
    ModelSpec,
    Params,
    attention,
    attention_shapes,
    dense,
    dense_shapes,
    f32,
    i32,
    layer_norm,
    layer_norm_shapes,
    mlp_block,
    mlp_block_shapes,
    softmax_cross_entropy,
)


@dataclass(frozen=True)
class BertConfig:
    """Sizes of a BERT encoder."""

    layers: int
    """Encoder blocks."""
    hidden: int
    """Model width D."""
    ffn: int
    """Feed-forward width."""
    heads: int
    """Attention heads."""
    head_dim: int
    """Width of one head."""
    vocab: int
    """Vocabulary size (4101 for DNABERT's 6-mers plus special tokens)."""
    seq: int
    """Tokens per sequence."""
    batch: int
    """Sequences per step."""


CONFIGS: dict[str, BertConfig] = {
    "tiny": BertConfig(2, 64, 256, 4, 16, vocab=512, seq=128, batch=8),
    # "base" scaled down until it plans in seconds, still compute-bound on a V100
    "small": BertConfig(2, 256, 1024, 4, 64, vocab=4101, seq=256, batch=32),
    "base": BertConfig(12, 768, 3072, 12, 64, vocab=4101, seq=512, batch=32),
    "long": BertConfig(12, 768, 3072, 12, 64, vocab=4101, seq=4096, batch=8),
}


def encoder_block(x: jax.Array, p: Params, cfg: BertConfig) -> jax.Array:
    """One post-LN BERT block with bidirectional attention."""
    x = layer_norm(x + attention(x, p["attn"], cfg.heads, cfg.head_dim, causal=False), p["ln1"])
    return layer_norm(x + mlp_block(x, p["mlp"]), p["ln2"])


def param_shapes(cfg: BertConfig) -> dict[str, object]:
    """Shapes of all weights."""
    block = {
        "attn": attention_shapes(cfg.hidden, cfg.heads, cfg.head_dim),
        "ln1": layer_norm_shapes(cfg.hidden),
        "mlp": mlp_block_shapes(cfg.hidden, cfg.ffn),
        "ln2": layer_norm_shapes(cfg.hidden),
    }
    return {
        "wte": f32(cfg.vocab, cfg.hidden),
        "wpe": f32(cfg.seq, cfg.hidden),
        "ln_emb": layer_norm_shapes(cfg.hidden),
        "layers": [block for _ in range(cfg.layers)],
        "mlm_dense": dense_shapes(cfg.hidden, cfg.hidden),
        "mlm_ln": layer_norm_shapes(cfg.hidden),
        "mlm_bias": f32(cfg.vocab),
    }


def build(name: str, cfg: BertConfig) -> ModelSpec:
    """A DNABERT masked-LM training step."""

    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        h = jnp.take(params["wte"], batch["tokens"], axis=0) + params["wpe"]
        h = layer_norm(h, params["ln_emb"])
        for p in params["layers"]:
            h = encoder_block(h, p, cfg)
        h = layer_norm(jax.nn.gelu(dense(h, params["mlm_dense"])), params["mlm_ln"])
        logits = jnp.einsum("bsd,vd->bsv", h, params["wte"]) + params["mlm_bias"]
        return softmax_cross_entropy(logits, batch["labels"], batch["mlm_weights"])

    batch = {
        "tokens": i32(cfg.batch, cfg.seq),
        "labels": i32(cfg.batch, cfg.seq),
        "mlm_weights": f32(cfg.batch, cfg.seq),
    }
    return ModelSpec(name=name, loss_fn=loss_fn, params=param_shapes(cfg), batch=batch)
