"""What was found of an array, remembered by the array object while it lives.

O2's refinement solves window after window of one core, and each window's reductions
look at the core's edge matrices again: the same array objects, never written (the
reductions make new arrays, never write into these). What they find of a matrix that
depends on it alone (is it far from separable) is found once and looked up by the
object after that. An entry goes when its array does, so a new array
that takes the freed address is never taken for it.
"""

from __future__ import annotations

import functools
import weakref
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")


class ByArray(Generic[T]):
    """Values by array object (by identity, not content), while the array lives; for
    arrays that are never written while in here."""

    def __init__(self) -> None:
        self._found: dict[int, tuple[weakref.ref[np.ndarray], T]] = {}

    def get(self, array: np.ndarray) -> T | None:
        hit = self._found.get(id(array))
        if hit is not None and hit[0]() is array:
            return hit[1]
        return None

    def put(self, array: np.ndarray, value: T) -> None:
        key = id(array)
        self._found[key] = (weakref.ref(array, functools.partial(self._forget, key)), value)

    def __len__(self) -> int:
        return len(self._found)

    def _forget(self, key: int, gone: weakref.ref[np.ndarray]) -> None:
        hit = self._found.get(key)
        if hit is not None and hit[0] is gone:
            del self._found[key]
