"""Handing freed memory back to the system (`rhino.search.heap`)."""

from __future__ import annotations

import ctypes

import pytest

from rhino.search import heap


@pytest.fixture(autouse=True)
def _looked_up_again():
    heap._malloc_trim.cache_clear()
    yield
    heap._malloc_trim.cache_clear()


def test_nothing_is_loaded_where_there_is_no_posix_c_library(monkeypatch):
    # on Windows ctypes.CDLL(None) raises TypeError: it must not be called there
    def refuse(_name):
        raise TypeError("no C library by that name")

    monkeypatch.setattr(heap.os, "name", "nt")
    monkeypatch.setattr(ctypes, "CDLL", refuse)
    assert heap._malloc_trim() is None
    heap.return_freed_memory()  # does nothing, raises nothing


def test_a_c_library_without_malloc_trim_is_left_alone(monkeypatch):
    class Musl:  # no malloc_trim
        pass

    monkeypatch.setattr(heap.os, "name", "posix")
    monkeypatch.setattr(ctypes, "CDLL", lambda _name: Musl())
    assert heap._malloc_trim() is None
    heap.return_freed_memory()


def test_glibc_trims(monkeypatch):
    calls = []

    class Glibc:
        def malloc_trim(self, pad):
            calls.append(pad)
            return 1

    monkeypatch.setattr(heap.os, "name", "posix")
    monkeypatch.setattr(ctypes, "CDLL", lambda _name: Glibc())
    heap.return_freed_memory()
    heap.return_freed_memory()
    assert calls == [0, 0]
