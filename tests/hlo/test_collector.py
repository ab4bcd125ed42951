from __future__ import annotations

import gc
import weakref

from rhino.hlo.collector import collector_paused


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_the_collector_is_off_in_the_block_and_as_it_was_after() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_what_the_block_made_is_old_and_still_collected() -> None:
    gc.collect()
    with collector_paused():
        nodes = [Node() for _ in range(10_000)]
    assert gc.get_count()[0] < 1_000  # not left to the youngest generation
    ref = weakref.ref(nodes[0])
    del nodes
    gc.collect()
    assert ref() is None
