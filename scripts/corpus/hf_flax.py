"""Hugging Face transformers Flax models trained with optax, as HF's Flax example scripts do.

Each step follows ``examples/flax`` in transformers 4.x (run_clm_flax.py, run_mlm_flax.py,
run_summarization_flax.py, run_image_classification.py), with ``jax.jit`` in place of
``jax.pmap`` (so the cross-device ``pmean``/``psum`` are dropped: rhino shards the step itself):

- the state is a ``flax.training.train_state.TrainState`` subclass holding a ``dropout_rng``
  (a raw u32[2] key), donated to the step (``donate_argnums=0``);
- the optimizer is ``optax.adamw`` on an ``optax.join_schedules`` of a linear warm-up and a
  linear decay, with HF's weight-decay mask (no decay on biases and layer-norm scales);
- the step splits the dropout rng, calls the model with ``dropout_rng=..., train=True``,
  takes ``jax.value_and_grad`` of the loss, calls ``state.apply_gradients`` and returns
  ``(new_state, {"loss": loss, "learning_rate": lr_schedule(state.step)})``.

Models are built from small configs with random init (``_do_init=False`` and
``jax.eval_shape`` of ``init_weights``: no weights are downloaded or even allocated).
Needs transformers 4.x (5.x dropped Flax). Workaround for jax 0.10.2: JAX removed the
``a_min``/``a_max`` keywords of ``jnp.clip`` (deprecated since jax 0.4.27), which
``transformers.models.t5.modeling_flax_t5`` still passes in ``_relative_position_bucket``;
:func:`_patch_t5_clip` gives that one module a ``jnp`` whose ``clip`` maps them to
``min``/``max`` (global ``jax.numpy`` is left alone).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util
from flax.training import train_state
from flax.training.common_utils import onehot
from transformers import (
    BertConfig,
    FlaxBertForMaskedLM,
    FlaxGPT2LMHeadModel,
    FlaxT5ForConditionalGeneration,
    FlaxViTForImageClassification,
    GPT2Config,
    T5Config,
    ViTConfig,
)
from transformers.models.t5 import modeling_flax_t5

from corpus.common import Built, Step, StepConfig

VOCAB = 1000
"""Vocabulary of the text models (GPT-2's 50k would make the embedding dominate)."""
LEARNING_RATE = 5e-4
WARMUP_STEPS = 100
TRAIN_STEPS = 1000
WEIGHT_DECAY = 0.01
LABEL_SMOOTHING = 0.1
"""run_summarization_flax.py's ``--label_smoothing_factor``."""
NUM_LABELS = 10
"""Classes of the image classifier."""

Batch = dict[str, Any]


def _clip(
    arr: Any = None,
    a_min: Any = None,
    a_max: Any = None,
    *,
    min: Any = None,  # jnp.clip's own names
    max: Any = None,
) -> jax.Array:
    """``jnp.clip`` also taking the removed ``a_min``/``a_max`` keywords."""
    return jnp.clip(arr, a_min if min is None else min, a_max if max is None else max)


def _patch_t5_clip() -> None:
    """Give transformers' Flax T5 module a ``jnp`` whose ``clip`` accepts ``a_min``/``a_max``."""
    if isinstance(modeling_flax_t5.jnp, _JnpShim):
        return
    modeling_flax_t5.jnp = _JnpShim()


class _JnpShim(types.ModuleType):
    """``jax.numpy`` with :func:`_clip` in place of ``clip``."""

    def __init__(self) -> None:
        super().__init__("jax.numpy")
        self.clip = _clip

    def __getattr__(self, name: str) -> Any:
        return getattr(jnp, name)


class TrainState(train_state.TrainState):
    """HF's train state: params, optimizer state, step, and the dropout key."""

    dropout_rng: jnp.ndarray


def create_learning_rate_fn(
    num_train_steps: int, num_warmup_steps: int, learning_rate: float
) -> optax.Schedule:
    """Linear warm-up then linear decay to 0 (HF's ``create_learning_rate_fn``)."""
    warmup_fn = optax.linear_schedule(
        init_value=0.0, end_value=learning_rate, transition_steps=num_warmup_steps
    )
    decay_fn = optax.linear_schedule(
        init_value=learning_rate, end_value=0, transition_steps=num_train_steps - num_warmup_steps
    )
    return optax.join_schedules(schedules=[warmup_fn, decay_fn], boundaries=[num_warmup_steps])


def decay_mask_fn(params: Any) -> Any:
    """True where weight decay applies: not on biases nor layer-norm parameters (HF's mask)."""
    flat_params = traverse_util.flatten_dict(params)
    layer_norm_candidates = ["layernorm", "layer_norm", "ln"]
    layer_norm_named_params = {
        layer[-2:]
        for layer_norm_name in layer_norm_candidates
        for layer in flat_params
        if layer_norm_name in "".join(layer).lower()
    }
    flat_mask = {
        path: (path[-1] != "bias" and path[-2:] not in layer_norm_named_params)
        for path in flat_params
    }
    return traverse_util.unflatten_dict(flat_mask)


def _optimizer() -> tuple[optax.GradientTransformation, optax.Schedule]:
    """``optax.adamw`` on the warm-up/decay schedule, with the decay mask, and the schedule."""
    lr_fn = create_learning_rate_fn(TRAIN_STEPS, WARMUP_STEPS, LEARNING_RATE)
    tx = optax.adamw(
        learning_rate=lr_fn,
        b1=0.9,
        b2=0.999,
        eps=1e-8,
        weight_decay=WEIGHT_DECAY,
        mask=decay_mask_fn,
    )
    return tx, lr_fn


def _abstract_state(model: Any, tx: optax.GradientTransformation, seed: int = 0) -> TrainState:
    """The initial train state as ``jax.ShapeDtypeStruct`` leaves (nothing is allocated)."""

    def create(rng: jax.Array) -> TrainState:
        rng, dropout_rng = jax.random.split(rng)
        params = model.init_weights(rng, model.input_shape)
        return TrainState.create(
            apply_fn=model.__call__, params=params, tx=tx, dropout_rng=dropout_rng
        )

    return jax.eval_shape(create, jax.random.PRNGKey(seed))


LossFn = Callable[[jax.Array, Batch], tuple[jax.Array, jax.Array]]
"""(logits, batch) -> (summed loss, number of labels it sums over)."""


def _train_step(
    lr_fn: optax.Schedule, loss_fn: LossFn, normalize_grads: bool
) -> Callable[[TrainState, Batch], tuple[TrainState, dict[str, jax.Array]]]:
    """HF's ``train_step``.

    ``normalize_grads=False``: the mean loss is differentiated (run_clm_flax.py,
    run_image_classification.py). ``True``: the summed loss is differentiated and loss and
    gradients are divided by the number of labels afterwards (run_mlm_flax.py,
    run_summarization_flax.py).
    """

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        dropout_rng, new_dropout_rng = jax.random.split(state.dropout_rng)

        def compute_loss(params: Any) -> tuple[jax.Array, jax.Array]:
            inputs = dict(batch)
            labels = inputs.pop("labels")
            logits = state.apply_fn(**inputs, params=params, dropout_rng=dropout_rng, train=True)[0]
            loss, num_labels = loss_fn(logits, {**inputs, "labels": labels})
            if normalize_grads:
                return loss, num_labels
            return loss / num_labels, num_labels

        grad_fn = jax.value_and_grad(compute_loss, has_aux=True)
        (loss, num_labels), grad = grad_fn(state.params)
        if normalize_grads:
            loss = loss / num_labels
            grad = jax.tree_util.tree_map(lambda x: x / num_labels, grad)
        new_state = state.apply_gradients(grads=grad, dropout_rng=new_dropout_rng)
        metrics = {"loss": loss, "learning_rate": lr_fn(state.step)}
        return new_state, metrics

    return train_step


def _tokens(batch: int, seq: int) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((batch, seq), jnp.int32)


def _heads(hidden: int) -> int:
    """Attention heads for a width: one per 32 channels (2 at 64, 4 at 128)."""
    return max(1, hidden // 32)


def clm_loss(logits: jax.Array, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """Next-token cross-entropy over the non-padded tokens (run_clm_flax.py's shift)."""
    shift_logits = logits[..., :-1, :]
    shift_labels = batch["labels"][..., 1:]
    shift_mask = batch["attention_mask"][..., 1:].astype(jnp.float32)
    loss = optax.softmax_cross_entropy(shift_logits, onehot(shift_labels, shift_logits.shape[-1]))
    return (loss * shift_mask).sum(), shift_mask.sum()


def mlm_loss(logits: jax.Array, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """Cross-entropy on the masked tokens only (labels are -100 elsewhere; run_mlm_flax.py)."""
    labels = batch["labels"]
    label_mask = jnp.where(labels > 0, 1.0, 0.0)
    loss = optax.softmax_cross_entropy(logits, onehot(labels, logits.shape[-1])) * label_mask
    return loss.sum(), label_mask.sum()


def seq2seq_loss(logits: jax.Array, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """Label-smoothed cross-entropy over the non-padded target tokens
    (run_summarization_flax.py)."""
    labels, padding_mask = batch["labels"], batch["decoder_attention_mask"]
    vocab_size = logits.shape[-1]
    confidence = 1.0 - LABEL_SMOOTHING
    low_confidence = (1.0 - confidence) / (vocab_size - 1)
    normalizing_constant = -(
        confidence * jnp.log(confidence)
        + (vocab_size - 1) * low_confidence * jnp.log(low_confidence + 1e-20)
    )
    soft_labels = onehot(labels, vocab_size, on_value=confidence, off_value=low_confidence)
    loss = optax.softmax_cross_entropy(logits, soft_labels) - normalizing_constant
    loss = loss * padding_mask
    return loss.sum(), padding_mask.sum().astype(jnp.float32)


def image_loss(logits: jax.Array, batch: Batch) -> tuple[jax.Array, jax.Array]:
    """Cross-entropy against one-hot labels, averaged over the batch
    (run_image_classification.py)."""
    loss = optax.softmax_cross_entropy(logits, onehot(batch["labels"], logits.shape[-1]))
    return loss.sum(), jnp.asarray(loss.shape[0], jnp.float32)


def build_gpt2(config: StepConfig) -> Built:
    """FlaxGPT2LMHeadModel, causal LM on padded sequences."""
    b, s, h = config.get("batch"), config.get("seq"), config.get("hidden")
    model_config = GPT2Config(
        vocab_size=VOCAB, n_positions=s, n_embd=h, n_layer=config.get("layers"), n_head=_heads(h)
    )
    model = FlaxGPT2LMHeadModel(model_config, input_shape=(1, s), seed=0, _do_init=False)
    tx, lr_fn = _optimizer()
    batch = {"input_ids": _tokens(b, s), "attention_mask": _tokens(b, s), "labels": _tokens(b, s)}
    step = _train_step(lr_fn, clm_loss, normalize_grads=False)
    return Built(step, (_abstract_state(model, tx), batch), donate_argnums=(0,))


def build_bert(config: StepConfig) -> Built:
    """FlaxBertForMaskedLM, masked LM with a label mask."""
    b, s, h = config.get("batch"), config.get("seq"), config.get("hidden")
    model_config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=h,
        num_hidden_layers=config.get("layers"),
        num_attention_heads=_heads(h),
        intermediate_size=4 * h,
        max_position_embeddings=s,
    )
    model = FlaxBertForMaskedLM(model_config, input_shape=(1, s), seed=0, _do_init=False)
    tx, lr_fn = _optimizer()
    batch = {
        "input_ids": _tokens(b, s),
        "attention_mask": _tokens(b, s),
        "token_type_ids": _tokens(b, s),
        "labels": _tokens(b, s),
    }
    step = _train_step(lr_fn, mlm_loss, normalize_grads=True)
    return Built(step, (_abstract_state(model, tx), batch), donate_argnums=(0,))


def build_t5(config: StepConfig) -> Built:
    """FlaxT5ForConditionalGeneration, seq2seq with targets half as long as the inputs."""
    b, s, h = config.get("batch"), config.get("seq"), config.get("hidden")
    t = max(2, s // 2)
    heads = _heads(h)
    model_config = T5Config(
        vocab_size=VOCAB,
        d_model=h,
        d_kv=h // heads,
        d_ff=4 * h,
        num_layers=config.get("layers"),
        num_heads=heads,
        decoder_start_token_id=0,
    )
    _patch_t5_clip()
    model = FlaxT5ForConditionalGeneration(model_config, input_shape=(1, s), seed=0, _do_init=False)
    tx, lr_fn = _optimizer()
    batch = {
        "input_ids": _tokens(b, s),
        "attention_mask": _tokens(b, s),
        "decoder_input_ids": _tokens(b, t),
        "decoder_attention_mask": _tokens(b, t),
        "labels": _tokens(b, t),
    }
    step = _train_step(lr_fn, seq2seq_loss, normalize_grads=True)
    return Built(step, (_abstract_state(model, tx), batch), donate_argnums=(0,))


def build_vit(config: StepConfig) -> Built:
    """FlaxViTForImageClassification on ``seq`` x ``seq`` RGB images, patch 8."""
    b, side, h = config.get("batch"), config.get("seq"), config.get("hidden")
    model_config = ViTConfig(
        image_size=side,
        patch_size=8,
        num_channels=3,
        hidden_size=h,
        num_hidden_layers=config.get("layers"),
        num_attention_heads=_heads(h),
        intermediate_size=4 * h,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        num_labels=NUM_LABELS,
    )
    model = FlaxViTForImageClassification(model_config, seed=0, _do_init=False)
    tx, lr_fn = _optimizer()
    batch = {
        "pixel_values": jax.ShapeDtypeStruct((b, 3, side, side), jnp.float32),
        "labels": jax.ShapeDtypeStruct((b,), jnp.int32),
    }
    step = _train_step(lr_fn, image_loss, normalize_grads=False)
    return Built(step, (_abstract_state(model, tx), batch), donate_argnums=(0,))


_LIB = "transformers (Flax) + optax"
_COMMON = (
    "TrainState with dropout_rng, adamw on warm-up+linear-decay (join_schedules), "
    "decay mask, state donated"
)

STEPS: dict[str, Step] = {
    s.name: s
    for s in (
        Step(
            "hf_gpt2",
            _LIB,
            f"FlaxGPT2LMHeadModel causal LM, masked mean over attention_mask; {_COMMON}",
            build_gpt2,
            StepConfig(batch=8, layers=2, hidden=128, seq=64),
        ),
        Step(
            "hf_bert",
            _LIB,
            f"FlaxBertForMaskedLM MLM, label mask (labels > 0), grads / num_labels; {_COMMON}",
            build_bert,
            StepConfig(batch=8, layers=2, hidden=128, seq=64),
        ),
        Step(
            "hf_t5",
            _LIB,
            "FlaxT5ForConditionalGeneration seq2seq, label smoothing 0.1 over "
            f"decoder_attention_mask; {_COMMON}",
            build_t5,
            StepConfig(batch=8, layers=2, hidden=64, seq=64),
        ),
        Step(
            "hf_vit",
            _LIB,
            "FlaxViTForImageClassification 32x32 patch 8, one-hot cross-entropy, "
            f"dropout 0.1; {_COMMON}",
            build_vit,
            StepConfig(batch=8, layers=2, hidden=64, seq=32),
        ),
    )
}
