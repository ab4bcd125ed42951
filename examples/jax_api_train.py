"""Train a Flax MLP with optax for 3 steps on 8 devices, as rhino.jax plans it."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # 8 CPUs

import flax.linen as nn
import jax
import optax

import rhino.jax


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        x = nn.Dropout(0.1, deterministic=not train)(nn.relu(nn.Dense(256)(x)))
        return nn.Dense(10)(x)


model, tx = MLP(), optax.adam(1e-3)


def train_step(params, opt_state, x, y, key):
    def loss_fn(params):
        logits = model.apply(params, x, train=True, rngs={"dropout": key})
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def train(planned=True, steps=3):
    x = jax.random.normal(jax.random.key(1), (64, 128))
    y = jax.random.randint(jax.random.key(2), (64,), 0, 10)
    params = model.init(jax.random.key(0), x, train=False)
    opt_state, key = tx.init(params), jax.random.key(3)
    step = jax.jit(train_step)  # one device
    if planned:
        mesh = jax.make_mesh((2, 4), ("data", "model"))
        plan = rhino.jax.plan(train_step, params, opt_state, x, y, key, mesh=mesh)
        print(plan)  # estimated step time, memory per device, collectives, layouts
        step = plan.jit()
    losses = []
    for i in range(steps):
        params, opt_state, loss = step(params, opt_state, x, y, jax.random.fold_in(key, i))
        losses.append(float(loss))
    return params, losses


if __name__ == "__main__":
    print("losses:", train()[1])
