"""Worker processes for searches run side by side (mesh enumeration, sweeps)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.process
import os
import sys


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


def workers_can_start() -> bool:
    """Can worker processes start here? Each imports the main module again, by its name
    or else from its path (as `multiprocessing.spawn` prepares it): not where that path
    is not a file (a script read from standard input, `python - < script.py`, is
    "<stdin>"), where each worker would die as it starts and the pool break."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return True
    path = getattr(main, "__file__", None)
    if path is None:  # interactive, `python -c`: nothing to import again
        return True
    # the directory multiprocessing resolves a relative path from (not in typeshed)
    start = getattr(multiprocessing.process, "ORIGINAL_DIR", None) or os.getcwd()
    return os.path.isfile(os.path.join(start, path))
