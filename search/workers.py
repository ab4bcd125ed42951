"""Worker processes for searches run side by side (mesh enumeration, sweeps)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context


def worker_context(
    preload: str,
) -> multiprocessing.context.ForkServerContext | multiprocessing.context.SpawnContext:
    """Workers start from a fork server that has imported `preload` once (cheap, and
    safe with the threads of the parent: progress display, solver, jax); plain spawn
    where there is none. Never a bare fork of a threaded parent (it can deadlock)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        forkserver = multiprocessing.get_context("forkserver")
        forkserver.set_forkserver_preload([preload])
        return forkserver
    return multiprocessing.get_context("spawn")
