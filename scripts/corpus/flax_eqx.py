"""Training steps written with Flax NNX and with Equinox, each the way its docs write one.

- ``flax_cnn``: a Flax NNX conv net (Conv + GroupNorm + relu + avg-pool blocks, dropout,
  Dense head) trained with ``optax.sgd`` (Nesterov momentum, decoupled weight decay) on an
  ``optax.warmup_cosine_decay_schedule``. The state is ``(model, nnx.Optimizer,
  nnx.MultiMetric)`` split into a graph def and a state (the functional API of NNX's
  performance guide: ``nnx.merge`` inside a ``jax.jit``-ed step, ``nnx.split``/``nnx.state``
  out, state donated). The state carries the dropout ``RngStream`` (key and counter), the
  optimizer step, and the metrics' running ``total``/``count`` variables (accuracy and loss
  averages); the step returns the new state and ``metrics.compute()``.
- ``eqx_transformer``: an Equinox decoder (``eqx.nn.Embedding``, ``eqx.nn.MultiheadAttention``
  with a causal-and-padding mask and attention dropout, ``eqx.nn.LayerNorm``,
  ``eqx.nn.Dropout``) on single sequences, ``jax.vmap``-ed over the batch with one dropout key
  per example. The step takes a typed PRNG key, splits it, and returns the next one; the
  optimizer is ``optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))`` with an
  ``optax.warmup_cosine_decay_schedule``; the loss is the mean next-token cross-entropy over
  non-padded tokens; metrics hold the loss and the gradients' global norm. Parameters and
  static parts are split with ``eqx.partition`` (as ``jax.jit`` needs) and nothing is
  donated (``eqx.filter_jit``'s default).

Both models are built abstractly (``nnx.eval_shape`` / ``eqx.filter_eval_shape``): nothing
big is allocated. No workaround was needed with jax 0.10.2.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from corpus.common import Built, Step, StepConfig

NUM_CLASSES = 10
VOCAB = 1000
DROPOUT = 0.1
TRAIN_STEPS = 1000
WARMUP_STEPS = 100


class CNN(nnx.Module):
    """``layers`` blocks of Conv 3x3 + GroupNorm + relu + 2x2 avg-pool, then dropout + Dense."""

    def __init__(self, layers: int, channels: int, side: int, *, rngs: nnx.Rngs) -> None:
        self.convs = nnx.List()
        self.norms = nnx.List()
        in_ch = 3
        for i in range(layers):
            out_ch = channels * 2 ** min(i, 2)
            self.convs.append(nnx.Conv(in_ch, out_ch, kernel_size=(3, 3), rngs=rngs))
            self.norms.append(nnx.GroupNorm(out_ch, num_groups=min(8, out_ch), rngs=rngs))
            in_ch = out_ch
            side = max(1, side // 2)
        self.hidden = nnx.Linear(in_ch * side * side, 4 * channels, rngs=rngs)
        self.dropout = nnx.Dropout(DROPOUT, rngs=rngs)
        self.head = nnx.Linear(4 * channels, NUM_CLASSES, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        for conv, norm in zip(self.convs, self.norms, strict=True):
            x = nnx.relu(norm(conv(x)))
            x = nnx.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = self.dropout(nnx.relu(self.hidden(x)))
        return self.head(x)


def build_flax_cnn(config: StepConfig) -> Built:
    """The NNX conv net's step on ``seq`` x ``seq`` RGB images (NHWC)."""
    b, side = config.get("batch"), config.get("seq")
    layers, channels = config.get("layers"), config.get("hidden")
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=0.1,
        warmup_steps=WARMUP_STEPS,
        decay_steps=TRAIN_STEPS,
        end_value=1e-4,
    )
    tx = optax.chain(
        optax.add_decayed_weights(5e-4), optax.sgd(schedule, momentum=0.9, nesterov=True)
    )

    def create() -> tuple[CNN, nnx.Optimizer[CNN], nnx.MultiMetric]:
        model = CNN(layers, channels, side, rngs=nnx.Rngs(params=0, dropout=1))
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
        return model, optimizer, metrics

    graphdef, state = nnx.split(nnx.eval_shape(create))

    def train_step(state: Any, batch: dict[str, jax.Array]) -> tuple[Any, dict[str, jax.Array]]:
        model, optimizer, metrics = nnx.merge(graphdef, state)
        model.train()

        def loss_fn(model: CNN) -> tuple[jax.Array, jax.Array]:
            logits = model(batch["image"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
            return loss, logits

        (loss, logits), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        metrics.update(loss=loss, logits=logits, labels=batch["label"])
        optimizer.update(model, grads)
        return nnx.state((model, optimizer, metrics)), metrics.compute()

    batch = {
        "image": jax.ShapeDtypeStruct((b, side, side, 3), jnp.float32),
        "label": jax.ShapeDtypeStruct((b,), jnp.int32),
    }
    return Built(train_step, (state, batch), donate_argnums=(0,))


class Block(eqx.Module):
    """Pre-norm transformer block on one sequence: masked self-attention and a GELU MLP."""

    ln1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    ln2: eqx.nn.LayerNorm
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear
    dropout: eqx.nn.Dropout

    def __init__(self, hidden: int, heads: int, *, key: jax.Array) -> None:
        k1, k2, k3 = jax.random.split(key, 3)
        self.ln1 = eqx.nn.LayerNorm(hidden)
        self.attn = eqx.nn.MultiheadAttention(heads, hidden, dropout_p=DROPOUT, key=k1)
        self.ln2 = eqx.nn.LayerNorm(hidden)
        self.fc1 = eqx.nn.Linear(hidden, 4 * hidden, key=k2)
        self.fc2 = eqx.nn.Linear(4 * hidden, hidden, key=k3)
        self.dropout = eqx.nn.Dropout(DROPOUT)

    def __call__(self, x: jax.Array, mask: jax.Array, *, key: jax.Array) -> jax.Array:
        k_attn, k1, k2 = jax.random.split(key, 3)
        h = jax.vmap(self.ln1)(x)
        x = x + self.dropout(self.attn(h, h, h, mask=mask, key=k_attn), key=k1)
        h = jax.vmap(self.ln2)(x)
        h = jax.vmap(self.fc2)(jax.nn.gelu(jax.vmap(self.fc1)(h)))
        return x + self.dropout(h, key=k2)


class Decoder(eqx.Module):
    """GPT-style decoder on one sequence: token + learned position embeddings, blocks, head."""

    embed: eqx.nn.Embedding
    pos: jax.Array
    blocks: list[Block]
    ln_f: eqx.nn.LayerNorm
    head: eqx.nn.Linear
    dropout: eqx.nn.Dropout

    def __init__(self, layers: int, hidden: int, heads: int, seq: int, *, key: jax.Array) -> None:
        keys = jax.random.split(key, layers + 3)
        self.embed = eqx.nn.Embedding(VOCAB, hidden, key=keys[0])
        self.pos = 0.02 * jax.random.normal(keys[1], (seq, hidden))
        self.blocks = [Block(hidden, heads, key=k) for k in keys[3:]]
        self.ln_f = eqx.nn.LayerNorm(hidden)
        self.head = eqx.nn.Linear(hidden, VOCAB, use_bias=False, key=keys[2])
        self.dropout = eqx.nn.Dropout(DROPOUT)

    def __call__(self, tokens: jax.Array, padding: jax.Array, *, key: jax.Array) -> jax.Array:
        seq = tokens.shape[0]
        keys = jax.random.split(key, len(self.blocks) + 1)
        x = self.dropout(jax.vmap(self.embed)(tokens) + self.pos[:seq], key=keys[0])
        mask = jnp.tril(jnp.ones((seq, seq), dtype=bool)) & padding[None, :].astype(bool)
        for block, k in zip(self.blocks, keys[1:], strict=True):
            x = block(x, mask, key=k)
        return jax.vmap(self.head)(jax.vmap(self.ln_f)(x))


def build_eqx_transformer(config: StepConfig) -> Built:
    """The Equinox decoder's causal-LM step on padded sequences."""
    b, s, h = config.get("batch"), config.get("seq"), config.get("hidden")
    model = eqx.filter_eval_shape(
        Decoder, config.get("layers"), h, max(1, h // 32), s, key=jax.random.key(0)
    )
    params, static = eqx.partition(model, lambda x: isinstance(x, jax.ShapeDtypeStruct))
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=3e-4,
        warmup_steps=WARMUP_STEPS,
        decay_steps=TRAIN_STEPS,
        end_value=3e-5,
    )
    optim = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))
    opt_state = jax.eval_shape(optim.init, params)

    def loss_fn(params: Any, tokens: jax.Array, padding: jax.Array, key: jax.Array) -> jax.Array:
        model = eqx.combine(params, static)
        keys = jax.random.split(key, tokens.shape[0])
        logits = jax.vmap(model)(tokens, padding, key=keys)
        mask = padding[:, 1:].astype(jnp.float32)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:])
        return (losses * mask).sum() / jnp.maximum(mask.sum(), 1.0)

    def make_step(
        params: Any, opt_state: Any, tokens: jax.Array, padding: jax.Array, key: jax.Array
    ) -> tuple[Any, Any, jax.Array, dict[str, jax.Array]]:
        key, dropout_key = jax.random.split(key)
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, padding, dropout_key)
        updates, opt_state = optim.update(grads, opt_state, params)
        params = eqx.apply_updates(params, updates)
        return params, opt_state, key, {"loss": loss, "grad_norm": optax.global_norm(grads)}

    tokens = jax.ShapeDtypeStruct((b, s), jnp.int32)
    padding = jax.ShapeDtypeStruct((b, s), jnp.int32)
    key = jax.eval_shape(lambda: jax.random.key(0))
    return Built(make_step, (params, opt_state, tokens, padding, key))


STEPS: dict[str, Step] = {
    s.name: s
    for s in (
        Step(
            "flax_cnn",
            "flax (NNX) + optax",
            "NNX conv net (Conv+GroupNorm, dropout, Dense), sgd+nesterov+weight decay on "
            "warmup_cosine_decay, nnx.Optimizer, nnx.MultiMetric accuracy/loss totals+counts, "
            "dropout RngStream in state, state donated",
            build_flax_cnn,
            StepConfig(batch=8, layers=2, hidden=32, seq=32),
        ),
        Step(
            "eqx_transformer",
            "equinox + optax",
            "Equinox decoder (MultiheadAttention with causal+padding mask, LayerNorm, Dropout), "
            "vmap over batch, typed key split per step and returned, clip_by_global_norm + adam "
            "on warmup_cosine_decay, returns loss and grad norm, no donation",
            build_eqx_transformer,
            StepConfig(batch=8, layers=2, hidden=64, seq=64),
        ),
    )
}
