"""Keras 3 ``fit()`` training steps of keras_hub models, on the JAX backend.

Each step is exactly the function that ``Model.fit()`` jits on the JAX backend
(``keras/src/backend/jax/trainer.py``, ``JAXTrainer.make_train_function``): the task model is
compiled with AdamW driven by a ``keras.optimizers.schedules`` learning-rate schedule, a loss
and an accuracy metric; ``fit()``'s symbolic build creates the model, loss, metric and
optimizer variables; and the step is ``jax.jit(model.train_step, donate_argnums=0)`` applied
to ``(state, data)`` where

* ``state = (trainable_variables, non_trainable_variables, optimizer_variables,
  metrics_variables)``, each a list of the variables' values in Keras' order (dropout's
  ``SeedGenerator`` states and BatchNorm's moving statistics are non-trainable variables;
  the optimizer's are ``iteration`` then one momentum and one velocity per trainable
  variable; the metrics' are the loss tracker's ``total``/``count`` then the accuracy's);
* ``data = (x, y, sample_weight)`` as ``fit()`` passes a batch: ``x`` is the task's input
  dict (or image batch), ``y`` the labels and ``sample_weight`` the label mask (what the
  keras_hub preprocessors produce; ``None`` for the image classifier).

The step returns ``(logs, state)``: the metrics' results (``loss``, accuracy) and the new
state. No weights are downloaded: every model is built from a small config with random
initialization (the weights are allocated, small), and the step is lowered from
``jax.ShapeDtypeStruct`` arguments.

Keras and keras_hub are imported lazily (``STEPS`` can be listed without them); they need
their own environment (``.venv-keras``: ``jax==0.10.2``, ``keras``, ``keras-hub``), and
``KERAS_BACKEND`` must be ``jax`` (set here when unset, before Keras is first imported).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from corpus.common import Built, Step, StepConfig

VOCAB = 1000
"""Vocabulary size of the language models."""
HEAD_DIM = 32
"""Attention head width: heads = hidden // HEAD_DIM (at least 1)."""
NUM_CLASSES = 10
"""Classes of the image classifier."""
RESNET_STEM = 64
"""Filters of the ResNet stem and first stage (keras_hub's ``ResNetBackbone`` insists on 64)."""
SEED = 0
"""Keras' global seed for the random initialization (the weights are not in the HLO)."""


def _keras() -> tuple[Any, Any]:
    """``(keras, keras_hub)``, imported with the JAX backend and a fresh session."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras
    import keras_hub

    if keras.backend.backend() != "jax":
        raise RuntimeError(
            f"Keras was imported with the {keras.backend.backend()!r} backend; "
            "set KERAS_BACKEND=jax before importing it"
        )
    keras.utils.clear_session()
    keras.utils.set_random_seed(SEED)
    return keras, keras_hub


def _heads(hidden: int) -> int:
    """Attention heads for a model width."""
    return max(1, hidden // HEAD_DIM)


def _spec(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
    """An abstract array."""
    return jax.ShapeDtypeStruct(shape, np.dtype(dtype))


def _lm_batch(batch: int, seq: int) -> tuple[dict[str, Any], Any, Any]:
    """A causal-LM batch as ``fit()`` gets it from ``CausalLMPreprocessor``.

    ``x`` holds ``token_ids`` (int32) and ``padding_mask`` (bool); ``y`` is the next token
    and ``sample_weight`` its padding mask (bool).
    """
    x = {"token_ids": _spec((batch, seq), "int32"), "padding_mask": _spec((batch, seq), "bool")}
    return x, _spec((batch, seq), "int32"), _spec((batch, seq), "bool")


def _fit_step(model: Any, data: Any) -> Built:
    """The step ``model.fit()`` jits for a batch shaped like ``data``.

    Mirrors ``fit()``: ``_symbolic_build`` (model, loss, metric and optimizer variables),
    ``_get_jax_state`` (the four variable lists) and ``make_train_function``'s
    ``jit(self.train_step, donate_argnums=0)`` (no distribution, no NNX: no
    ``out_shardings``).
    """
    import keras

    if keras.distribution.distribution() is not None or keras.config.is_nnx_enabled():
        raise RuntimeError("a Keras distribution or NNX changes the jitted step; unset them")
    if model.steps_per_execution != 1 or not model.jit_compile or model.run_eagerly:
        raise RuntimeError("the step assumes steps_per_execution=1 and jit_compile")
    model._symbolic_build(data_batch=data)
    state = model._get_jax_state(
        trainable_variables=True,
        non_trainable_variables=True,
        optimizer_variables=True,
        metrics_variables=True,
    )
    return Built(model.train_step, (state, data), (0,))


def _warmup_cosine(keras: Any, peak: float, warmup: int, decay: int) -> Any:
    """Linear warm-up from 0 to ``peak``, then cosine decay to 10% of it."""
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        decay_steps=decay,
        alpha=0.1,
        warmup_target=peak,
        warmup_steps=warmup,
    )


def _adamw_lm(keras: Any, learning_rate: Any) -> Any:
    """AdamW as the keras_hub fine-tuning guides set it: global-norm clipping, no decay on
    biases and normalization scales."""
    optimizer = keras.optimizers.AdamW(
        learning_rate=learning_rate, weight_decay=0.01, global_clipnorm=1.0
    )
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta", "scale"])
    return optimizer


def _compile_lm(keras: Any, model: Any, learning_rate: Any) -> None:
    """Compile a (causal or seq2seq) LM task as its ``compile()`` defaults do, with AdamW."""
    model.compile(
        optimizer=_adamw_lm(keras, learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )


def build_gpt2(config: StepConfig) -> Built:
    """keras_hub ``GPT2CausalLM`` (dropout 0.1), masked next-token cross-entropy."""
    keras, keras_hub = _keras()
    hidden, seq = config.get("hidden"), config.get("seq")
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCAB,
        num_layers=config.get("layers"),
        num_heads=_heads(hidden),
        hidden_dim=hidden,
        intermediate_dim=4 * hidden,
        dropout=0.1,
        max_sequence_length=seq,
    )
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    _compile_lm(keras, model, _warmup_cosine(keras, 3e-4, warmup=100, decay=10_000))
    return _fit_step(model, _lm_batch(config.get("batch"), seq))


def build_t5(config: StepConfig) -> Built:
    """keras_hub ``T5Seq2SeqLM`` (encoder-decoder, dropout 0.1, tied embeddings).

    The encoder reads ``seq`` tokens and the decoder ``seq // 2``, as
    ``T5Seq2SeqLMPreprocessor`` packs them: both padding masks in ``x``, the decoder's next
    token as ``y`` and its mask as ``sample_weight``.
    """
    keras, keras_hub = _keras()
    hidden, seq, batch = config.get("hidden"), config.get("seq"), config.get("batch")
    backbone = keras_hub.models.T5Backbone(
        vocabulary_size=VOCAB,
        num_layers=config.get("layers"),
        num_heads=_heads(hidden),
        hidden_dim=hidden,
        intermediate_dim=4 * hidden,
        dropout=0.1,
    )
    model = keras_hub.models.T5Seq2SeqLM(backbone=backbone, preprocessor=None)
    learning_rate = keras.optimizers.schedules.PolynomialDecay(
        initial_learning_rate=1e-3, decay_steps=10_000, end_learning_rate=1e-5, power=1.0
    )
    _compile_lm(keras, model, learning_rate)
    target = max(1, seq // 2)
    x = {
        "encoder_token_ids": _spec((batch, seq), "int32"),
        "encoder_padding_mask": _spec((batch, seq), "bool"),
        "decoder_token_ids": _spec((batch, target), "int32"),
        "decoder_padding_mask": _spec((batch, target), "bool"),
    }
    data = (x, _spec((batch, target), "int32"), _spec((batch, target), "bool"))
    return _fit_step(model, data)


def build_qwen_moe(config: StepConfig) -> Built:
    """keras_hub ``QwenMoeCausalLM``: 4 experts, top-2, a gated shared expert, GQA.

    The experts are one dense bank (every token through every expert, weighted by the
    router); the router's load-balancing loss is added with ``add_loss`` during training.
    """
    keras, keras_hub = _keras()
    hidden, seq = config.get("hidden"), config.get("seq")
    heads = max(2, hidden // 16)
    backbone = keras_hub.models.QwenMoeBackbone(
        vocabulary_size=VOCAB,
        num_layers=config.get("layers"),
        num_query_heads=heads,
        num_key_value_heads=heads // 2,
        hidden_dim=hidden,
        intermediate_dim=2 * hidden,
        moe_intermediate_dim=hidden,
        shared_expert_intermediate_dim=2 * hidden,
        num_experts=4,
        top_k=2,
    )
    model = keras_hub.models.QwenMoeCausalLM(backbone=backbone, preprocessor=None)
    _compile_lm(keras, model, _warmup_cosine(keras, 1e-3, warmup=50, decay=5_000))
    return _fit_step(model, _lm_batch(config.get("batch"), seq))


def build_resnet18(config: StepConfig) -> Built:
    """keras_hub ``ResNetImageClassifier`` on a ResNet-18-shaped ``ResNetBackbone``.

    ``layers`` stages of two basic blocks (4: ResNet-18's 2-2-2-2); a 64-filter 7x7 stride-2
    stem and max-pool; BatchNorm after every conv (its moving mean and variance are
    non-trainable state); ``seq`` x ``seq`` RGB images, integer labels, no sample weights.
    keras_hub requires the first stage to have 64 filters, so ``hidden`` sets the width of
    the later ones: stage ``i >= 1`` has ``hidden * 2**i`` (the default 64 gives ResNet-18's
    64-128-256-512; 16 gives 64-32-64-128).
    """
    keras, keras_hub = _keras()
    hidden, layers, side = config.get("hidden"), config.get("layers"), config.get("seq")
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[RESNET_STEM],
        input_conv_kernel_sizes=[7],
        stackwise_num_filters=[RESNET_STEM] + [hidden * 2**i for i in range(1, layers)],
        stackwise_num_blocks=[2] * layers,
        stackwise_num_strides=[1] + [2] * (layers - 1),
        block_type="basic_block",
        use_pre_activation=False,
        image_shape=(side, side, 3),
    )
    model = keras_hub.models.ResNetImageClassifier(
        backbone=backbone, num_classes=NUM_CLASSES, preprocessor=None
    )
    learning_rate = _warmup_cosine(keras, 1e-3, warmup=200, decay=20_000)
    model.compile(
        optimizer=keras.optimizers.AdamW(learning_rate=learning_rate, weight_decay=0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    batch = config.get("batch")
    data = (_spec((batch, side, side, 3), "float32"), _spec((batch,), "int32"))
    return _fit_step(model, data)


_LIBRARY = "Keras 3 fit() (JAX backend) + keras_hub"
_LM_DEFAULTS = StepConfig(batch=8, layers=2, hidden=64, seq=64)

STEPS: dict[str, Step] = {
    s.name: s
    for s in (
        Step(
            "keras_gpt2",
            _LIBRARY,
            "GPT2CausalLM (dropout on), masked sparse CE + accuracy, AdamW + warm-up cosine; "
            "state: params, dropout seed states, optimizer, metric totals/counts",
            build_gpt2,
            _LM_DEFAULTS,
        ),
        Step(
            "keras_t5",
            _LIBRARY,
            "T5Seq2SeqLM encoder-decoder (dropout on, padding masks), masked sparse CE + "
            "accuracy, AdamW + linear decay; decoder length seq // 2",
            build_t5,
            _LM_DEFAULTS,
        ),
        Step(
            "keras_qwen_moe",
            _LIBRARY,
            "QwenMoeCausalLM, 4 experts top-2 + shared expert, router aux loss, masked "
            "sparse CE + accuracy, AdamW + warm-up cosine",
            build_qwen_moe,
            _LM_DEFAULTS,
        ),
        Step(
            "keras_resnet18",
            _LIBRARY,
            "ResNetImageClassifier on a ResNet-18-shaped backbone (BatchNorm), sparse CE + "
            "accuracy, AdamW + warm-up cosine; seq is the image side, hidden the base width of "
            "stages 2+ (stage 1 is 64)",
            build_resnet18,
            StepConfig(batch=8, layers=4, hidden=64, seq=32),
        ),
    )
}
"""The Keras steps by name."""
