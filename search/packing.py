"""Many small numpy arrays sent to another process as a few large ones.

Pickling arrays one by one costs some microseconds each however small they are: the
48-layer GPT-2's problem holds 28k distinct arrays, 1.2 s to pickle and as long to read
back. `pack` puts the distinct ones (by identity: an array several holders share is sent
once, and shared again where it arrives) into one buffer per dtype, and `unpack` gives
them back as views of those buffers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

T = TypeVar("T")


@dataclass(frozen=True)
class Packed:
    """Distinct arrays as one flat buffer per dtype: each array's buffer, its offset in
    it, and its shape."""

    buffers: tuple[np.ndarray, ...]
    buffer: np.ndarray
    offset: np.ndarray
    shapes: list[tuple[int, ...]]


def distinct(items: Iterable[T]) -> tuple[list[T], np.ndarray]:
    """The distinct `items` by identity, in the order they first come, and the index of
    each given item among them."""
    index: dict[int, int] = {}
    found: list[T] = []
    at = []
    for item in items:
        i = index.get(id(item))
        if i is None:
            i = index[id(item)] = len(found)
            found.append(item)
        at.append(i)
    return found, np.array(at, dtype=np.int64)


def pack(arrays: Iterable[np.ndarray]) -> tuple[Packed, np.ndarray]:
    """The distinct `arrays` (`distinct`) packed, and the index of each given array among
    them (what `unpack` gives back)."""
    distinct_arrays, at = distinct(arrays)
    dtypes: dict[np.dtype, int] = {}
    buffer = np.array(
        [dtypes.setdefault(a.dtype, len(dtypes)) for a in distinct_arrays], dtype=np.int64
    )
    sizes = np.array([a.size for a in distinct_arrays], dtype=np.int64)
    offset = np.zeros(len(distinct_arrays), dtype=np.int64)
    buffers = []
    for dtype, slot in dtypes.items():
        members = np.flatnonzero(buffer == slot)
        ends = np.cumsum(sizes[members])
        offset[members] = ends - sizes[members]
        flat = [distinct_arrays[i].ravel() for i in members.tolist()]
        buffers.append(np.concatenate(flat) if flat else np.zeros(0, dtype=dtype))
    return Packed(tuple(buffers), buffer, offset, [a.shape for a in distinct_arrays]), at


def unpack(packed: Packed) -> list[np.ndarray]:
    """The arrays `pack` packed, in its order: views of its buffers (one region each, so an
    array is shared only where it was when packed)."""
    out = []
    for buffer, start, shape in zip(
        packed.buffer.tolist(), packed.offset.tolist(), packed.shapes, strict=True
    ):
        out.append(packed.buffers[buffer][start : start + math.prod(shape)].reshape(shape))
    return out
