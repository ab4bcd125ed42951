"""Worker processes for searches run side by side (mesh enumeration, sweeps)."""

from __future__ import annotations

import ast
import functools
import multiprocessing
import multiprocessing.context
import multiprocessing.process
import os
import sys
import threading
from pathlib import Path


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
    """Can worker processes start here (`why_no_workers`)?"""
    return why_no_workers() is None


def why_no_workers() -> str | None:
    """Why worker processes would break here, or None where they can start. Each imports
    the main module again, by its name or else from its path, as `multiprocessing.spawn`
    prepares it (not a package's `__main__`), so not where that path is not a file (a
    script read from standard input, `python - < script.py`, is "<stdin>": each worker
    would die as it starts and the pool break), nor where the main thread is running the
    main module's top-level code outside `if __name__ == "__main__":` (each worker would
    run that code again, the whole search included, before its first task)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None:  # interactive, `python -c`, a notebook: nothing to import again
        return None
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if (name or "").rpartition(".")[2] == "__main__" or _stem(path) == "__main__":
        return None  # a package's __main__ (`python -m rhino.cli`): not run in workers
    if name is None:
        # the directory multiprocessing resolves a relative path from (not in typeshed)
        start = getattr(multiprocessing.process, "ORIGINAL_DIR", None) or os.getcwd()
        path = os.path.join(start, path)
        if not os.path.isfile(path):
            return f"the main module ({getattr(main, '__file__', '')}) is not a file to import"
    line = _main_line()
    if line is not None and not _guarded(path, line):
        return "called from the top level of a script without `if __name__ == '__main__':`"
    return None


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _main_line() -> int | None:
    """The line of the main module's top-level code the main thread is running, or None
    where it is not running any (from any thread: a search's own threads ask too)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            return frame.f_lineno
        frame = frame.f_back
    return None


def _guarded(path: str, line: int) -> bool:
    """Is `line` of the script at `path` inside a top-level `if __name__ == "__main__":`?
    No where the script cannot be read."""
    tree = _script(path)
    for node in tree.body if tree is not None else ():
        if node.lineno <= line <= (node.end_lineno or node.lineno):
            return _is_main_guard(node)
    return False


@functools.lru_cache(maxsize=4)
def _script(path: str) -> ast.Module | None:
    try:
        return ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    sides = [test.left, *test.comparators]
    names = {s.id for s in sides if isinstance(s, ast.Name)}
    texts = {s.value for s in sides if isinstance(s, ast.Constant)}
    return (
        len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and names == {"__name__"}
        and texts == {"__main__"}
    )
