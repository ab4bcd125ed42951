"""The cyclic garbage collector, paused while a module is built or walked.

Parsing, cloning, verifying and summarizing a module allocate millions of objects and free
few of them: each collection in the meantime would rescan all that have built up (a third
of the parse time of a 50k-line module).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_frozen = False
"""Is a `heap_frozen` block running?"""


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the block, then as it was.

    On the way out, what the block allocated goes straight to the oldest generation
    (`gc.freeze()` then `gc.unfreeze()`, each a constant-time move of lists): left in
    the youngest, the first collections after the block would each walk all of it (about
    0.05 s of CPU after a 48k-instruction module). Garbage among it is still collected,
    by the next full collection.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if _frozen:  # inside `heap_frozen`: frozen too, thawed with the rest
                gc.freeze()
            elif gc.get_freeze_count() == 0:  # else it would thaw what someone else froze
                gc.freeze()
                gc.unfreeze()
            gc.enable()


@contextmanager
def heap_frozen() -> Iterator[None]:
    """What exists now left out of the cyclic collector's walks for the block, then let
    back in (`gc.freeze()`, `gc.unfreeze()`: constant-time moves of lists).

    A search allocates and frees millions of small objects over the module, graph and
    problem built before it; each full collection in the meantime would walk all of
    those again (on T5-large's O2 plan, 2.7 s of its 20 s solve). Garbage among them is
    collected after the block. `collector_paused` blocks inside freeze what they made
    too. Where something froze objects already, it is left alone (unfreezing would thaw
    those too).
    """
    global _frozen
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    _frozen = True
    try:
        yield
    finally:
        _frozen = False
        gc.unfreeze()
