"""Try every mesh shape of N devices in parallel processes and keep the best plan (Rhino §3)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from rhino.hlo.errors import InfeasibleError, RhinoError
from rhino.hlo.parser import parse_module
from rhino.search.mesh import DeviceMesh, mesh_factorizations
from rhino.search.spmd.plan import Plan
from rhino.search.spmd.planner import PlanRequest, make_plan
from rhino.search.workers import worker_context, workers_can_start


@dataclass(frozen=True)
class MeshTrial:
    """How one mesh shape did."""

    mesh: DeviceMesh
    objective_s: float | None
    """Predicted step time; None when no plan was found."""
    error: str | None
    """Why there is no plan (e.g. the memory budget), or None."""
    seconds: float = 0.0
    """Wall time of the mesh's trial in its worker: reading the module, then the search."""


def _trial(args: tuple[str, str, PlanRequest]) -> tuple[Plan | None, str | None, float]:
    text, filename, request = args
    start = time.perf_counter()
    try:
        return make_plan(parse_module(text, filename), request), None, time.perf_counter() - start
    except RhinoError as e:
        return None, str(e), time.perf_counter() - start


def plan_best_mesh(
    text: str,
    filename: str,
    devices: int,
    request: PlanRequest,
    *,
    jobs: int = 2,
    progress: Callable[[str], None] | None = None,
) -> tuple[Plan, tuple[MeshTrial, ...]]:
    """Plan `text` on every 1-D and 2-D mesh of `devices` devices; the best plan (lowest
    predicted step time; ties to the earlier mesh in `mesh_factorizations` order) and
    how each mesh did. `request.mesh` is replaced per trial. The meshes share one
    deadline, `request.solve`'s time limit from now (`time.perf_counter` is the system's
    monotonic clock, the same in the worker processes). One after the other in this
    process with `jobs` 1, or where workers cannot start (`workers_can_start`)."""
    meshes = mesh_factorizations(devices)
    request = dataclasses.replace(request, solve=request.solve.started())
    work = [(text, filename, dataclasses.replace(request, mesh=m)) for m in meshes]
    say = progress or (lambda _msg: None)
    results: list[tuple[Plan | None, str | None, float]]
    if jobs <= 1 or len(meshes) == 1 or not workers_can_start():
        results = []
        for m, args in zip(meshes, work, strict=True):
            say(f"mesh {m}")
            results.append(_trial(args))
    else:
        say(f"{len(meshes)} meshes on {min(jobs, len(meshes))} processes")
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(meshes)),
            mp_context=worker_context("rhino.search.spmd.meshsearch"),
        ) as pool:
            results = list(pool.map(_trial, work))
    trials = tuple(
        MeshTrial(m, plan.objective_s if plan else None, error, seconds)
        for m, (plan, error, seconds) in zip(meshes, results, strict=True)
    )
    found = [
        (plan.objective_s, k, plan) for k, (plan, _, _) in enumerate(results) if plan is not None
    ]
    if not found:
        reasons = "; ".join(f"{t.mesh}: {t.error}" for t in trials)
        raise InfeasibleError(f"no mesh of {devices} devices has a plan: {reasons}")
    return min(found, key=lambda t: (t[0], t[1]))[2], trials
