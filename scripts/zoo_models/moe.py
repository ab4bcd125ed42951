"""GShard-style mixture of experts: a GPT decoder whose every other MLP is a top-2 MoE.

The MoE layer follows GShard (Lepikhin et al., 2020, Algorithm 2) without random
second-expert routing: tokens are split into G groups of S tokens; top-2 gating builds a
combine tensor [G, S, E, C] (C = expert capacity) and a 0/1 dispatch mask of the same
shape; tokens move to experts and back with einsums that keep the expert dim E explicit,
and the expert weights are [E, D, F] and [E, F, D].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from zoo_models.common import (
    F32,
    Batch,
    ModelSpec,
    Params,
    ZooError,
    attention,
    attention_shapes,
    f32,
    layer_norm,
    layer_norm_shapes,
    mlp_block,
    mlp_block_shapes,
)
from zoo_models.gpt import GPTConfig, embed, lm_batch, lm_loss, outer_shapes


@dataclass(frozen=True)
class MoEConfig:
    """Sizes of a GShard MoE decoder (the columns of the Rhino paper's Table 2, plus data)."""

    layers: int
    """Number of blocks; the odd-numbered ones (1, 3, ...) have an MoE MLP."""
    hidden: int
    """Model width D."""
    ffn: int
    """Width F of each expert (and of the dense MLPs)."""
    heads: int
    """Attention heads."""
    head_dim: int
    """Width of one head."""
    experts: int
    """Experts E per MoE layer."""
    vocab: int
    """Vocabulary size."""
    seq: int
    """Tokens per sequence."""
    batch: int
    """Sequences per step."""
    group_size: int
    """Tokens per gating group S; batch * seq must be a multiple of it."""
    capacity_factor: float = 1.0
    """Expert capacity C = ceil(2 * S * capacity_factor / E) (top-2 gating)."""
    aux_loss_weight: float = 0.01
    """Weight of the load-balancing loss added to the LM loss."""


def _big(layers: int, hidden: int, ffn: int, heads: int, head_dim: int, experts: int) -> MoEConfig:
    return MoEConfig(
        layers,
        hidden,
        ffn,
        heads,
        head_dim,
        experts,
        vocab=32000,
        seq=1024,
        batch=8,
        group_size=1024,
    )


CONFIGS: dict[str, MoEConfig] = {
    "tiny": MoEConfig(2, 64, 128, 4, 16, 8, vocab=512, seq=64, batch=8, group_size=64),
    # many wide experts (4 per device on 8), enough tokens to keep them busy: the expert
    # weights outweigh the tokens dispatched to them, as in GShard
    "small": MoEConfig(2, 256, 2048, 4, 64, 32, vocab=4096, seq=256, batch=16, group_size=256),
    "8e-380m": _big(8, 768, 6144, 16, 48, 8),
    "8e-760m": _big(16, 768, 6144, 16, 48, 8),
    "16e-1.3b": _big(16, 768, 6144, 16, 48, 16),
    "16e-2.4b": _big(16, 1024, 8192, 16, 64, 16),
    "32e-10b": _big(16, 1536, 12288, 16, 96, 32),
}


def capacity(cfg: MoEConfig) -> int:
    """Expert capacity C: how many tokens of one group each expert takes at most."""
    return math.ceil(2 * cfg.group_size * cfg.capacity_factor / cfg.experts)


def top2_gating(
    x: jax.Array, wg: jax.Array, cfg: MoEConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """GShard top-2 gating of x [G, S, D]: (combine [G,S,E,C], dispatch [G,S,E,C], aux loss).

    Each token goes to its best and second-best experts with their two gates renormalized
    to sum to 1; past an expert's capacity C a token is dropped for that expert (its gate
    there becomes 0, the other keeps its weight). Capacity goes to first choices first.
    """
    e, c = cfg.experts, capacity(cfg)
    gates = jax.nn.softmax(jnp.einsum("gsd,de->gse", x, wg), axis=-1)
    mask1 = jax.nn.one_hot(jnp.argmax(gates, axis=-1), e, dtype=F32)
    mask2 = jax.nn.one_hot(jnp.argmax(gates * (1.0 - mask1), axis=-1), e, dtype=F32)
    aux = jnp.mean(jnp.mean(mask1, axis=1) * jnp.mean(gates, axis=1)) * e * e
    gate1 = jnp.sum(gates * mask1, axis=-1)
    gate2 = jnp.sum(gates * mask2, axis=-1)
    denom = gate1 + gate2 + 1e-9
    pos1 = (jnp.cumsum(mask1, axis=1) - 1.0) * mask1
    mask1 = mask1 * (pos1 < c)
    pos2 = (jnp.cumsum(mask2, axis=1) - 1.0 + jnp.sum(mask1, axis=1, keepdims=True)) * mask2
    mask2 = mask2 * (pos2 < c)
    gate1 = gate1 / denom * jnp.sum(mask1, axis=-1)
    gate2 = gate2 / denom * jnp.sum(mask2, axis=-1)
    slot1 = jax.nn.one_hot(jnp.sum(pos1 * mask1, axis=-1).astype(jnp.int32), c, dtype=F32)
    slot2 = jax.nn.one_hot(jnp.sum(pos2 * mask2, axis=-1).astype(jnp.int32), c, dtype=F32)
    combine = gate1[..., None, None] * mask1[..., None] * slot1[:, :, None, :]
    combine += gate2[..., None, None] * mask2[..., None] * slot2[:, :, None, :]
    dispatch = (combine > 0.0).astype(F32)
    return combine, dispatch, aux


def moe_mlp(x: jax.Array, p: Params, cfg: MoEConfig) -> tuple[jax.Array, jax.Array]:
    """The MoE feed-forward layer on x [B, T, D]: (output [B, T, D], aux loss)."""
    b, t, d = x.shape
    groups = x.reshape(b * t // cfg.group_size, cfg.group_size, d)
    combine, dispatch, aux = top2_gating(groups, p["gate"], cfg)
    expert_in = jnp.einsum("gsec,gsd->egcd", dispatch, groups)
    h = jnp.einsum("egcd,edf->egcf", expert_in, p["wi"]) + p["bi"][:, None, None, :]
    out = jnp.einsum("egcf,efd->egcd", jax.nn.relu(h), p["wo"]) + p["bo"][:, None, None, :]
    y = jnp.einsum("gsec,egcd->gsd", combine, out)
    return y.reshape(b, t, d), aux


def moe_shapes(cfg: MoEConfig) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes of an MoE layer's weights: gate [D, E] and per-expert MLPs."""
    e, d, f = cfg.experts, cfg.hidden, cfg.ffn
    return {
        "gate": f32(d, e),
        "wi": f32(e, d, f),
        "bi": f32(e, f),
        "wo": f32(e, f, d),
        "bo": f32(e, d),
    }


def _gpt(cfg: MoEConfig) -> GPTConfig:
    return GPTConfig(
        cfg.layers, cfg.hidden, cfg.ffn, cfg.heads, cfg.head_dim, cfg.vocab, cfg.seq, cfg.batch
    )


def _is_moe(layer: int) -> bool:
    return layer % 2 == 1


def layer_shapes(cfg: MoEConfig, layer: int) -> dict[str, Any]:
    """Shapes of block ``layer``: attention plus a dense or an MoE MLP."""
    mlp = moe_shapes(cfg) if _is_moe(layer) else mlp_block_shapes(cfg.hidden, cfg.ffn)
    return {
        "ln1": layer_norm_shapes(cfg.hidden),
        "attn": attention_shapes(cfg.hidden, cfg.heads, cfg.head_dim),
        "ln2": layer_norm_shapes(cfg.hidden),
        "moe" if _is_moe(layer) else "mlp": mlp,
    }


def check(cfg: MoEConfig) -> None:
    """Raise ``ZooError`` when the token count does not split into gating groups."""
    tokens = cfg.batch * cfg.seq
    if tokens % cfg.group_size:
        raise ZooError(
            f"moe: batch * seq = {cfg.batch} * {cfg.seq} = {tokens} tokens is not a multiple"
            f" of group_size {cfg.group_size}"
        )


def build(name: str, cfg: MoEConfig) -> ModelSpec:
    """A GShard MoE training step: LM loss plus ``aux_loss_weight`` times the gating loss."""
    check(cfg)
    gpt = _gpt(cfg)
    layers = [layer_shapes(cfg, i) for i in range(cfg.layers)]
    params = {**outer_shapes(gpt), "layers": layers}

    def loss_fn(params: Params, batch: Batch) -> jax.Array:
        h = embed(params, batch["tokens"])
        aux_total = jnp.zeros((), F32)
        for p in params["layers"]:
            h = h + attention(layer_norm(h, p["ln1"]), p["attn"], cfg.heads, cfg.head_dim, True)
            if "moe" in p:
                y, aux = moe_mlp(layer_norm(h, p["ln2"]), p["moe"], cfg)
                aux_total = aux_total + aux
            else:
                y = mlp_block(layer_norm(h, p["ln2"]), p["mlp"])
            h = h + y
        return lm_loss(params, h, batch["labels"]) + cfg.aux_loss_weight * aux_total

    return ModelSpec(name=name, loss_fn=loss_fn, params=params, batch=lm_batch(gpt))
