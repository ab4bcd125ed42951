"""rhino.jax: plan a JAX function with rhino, and run the plan from JAX.

    import jax, rhino.jax

    mesh = jax.make_mesh((2, 4), ("data", "model"))
    p = rhino.jax.plan(train_step, state, batch, mesh=mesh)   # lowers, plans (SPMD)
    p.in_shardings, p.out_shardings    # NamedSharding pytrees on `mesh`
    step = p.jit()                     # the whole plan, as a callable like train_step
    state, loss = step(state, batch)   # jax.Arrays laid out as p.out_shardings say
    print(p)                           # estimated step time, memory per device, collectives

See `plan` for what it does and does not do (SPMD only: pipelines are `rhino pipeline`).
"""

from __future__ import annotations

from rhino.jax.api import ArgumentError, JaxPlan, PlanError, plan

__all__ = ["ArgumentError", "JaxPlan", "PlanError", "plan"]
