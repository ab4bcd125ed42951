"""Memory the search freed, handed back to the system.

glibc keeps what a process frees for its next allocations, and much of it stays resident:
arenas of threads, pages of small objects with a few still live among them, and (after a
large block is freed, its mmap threshold raised) large blocks on the heap instead of their
own mappings. A plan frees most of what it allocated when each of its phases ends, and the
next phase (another solve, the plan's table or JSON document) cannot reuse all of it: the
48-layer GPT-2's peak RSS on 2x4 held 72 MB of live Python objects
(`tracemalloc`) in 523 MiB. `return_freed_memory` calls glibc's `malloc_trim(0)`, which
unmaps what it can of that, where a phase ends.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable


def return_freed_memory() -> None:
    """Hand what this process has freed back to the system (glibc's `malloc_trim(0)`; where
    the C library has none, nothing). It takes 1-24 ms a call, so it is for the ends of
    phases, not loops."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim; None where the C library has none (musl, macOS) or there is no
    C library to load by name (Windows: `ctypes.CDLL(None)` raises there)."""
    if os.name != "posix":
        return None
    return getattr(ctypes.CDLL(None), "malloc_trim", None)
