"""The cyclic garbage collector, paused while a module is built or walked.

Parsing, cloning, verifying and summarizing a module allocate millions of objects and free
few of them: each collection in the meantime would rescan all that have built up (a third
of the parse time of a 50k-line module).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


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
            if gc.get_freeze_count() == 0:  # else it would thaw what someone else froze
                gc.freeze()
                gc.unfreeze()
            gc.enable()
