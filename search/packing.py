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

import numpy as np


@dataclass(frozen=True)
class Packed:
    """Distinct arrays as one flat buffer per dtype: each array's buffer, its offset in
    it, and its shape."""

    buffers: tuple[np.ndarray, ...]
    buffer: np.ndarray
    offset: np.ndarray
    shapes: list[tuple[int, ...]]


def pack(arrays: Iterable[np.ndarray]) -> tuple[Packed, np.ndarray]:
    """The distinct `arrays` (by identity) packed, and the index of each given array among
    them (what `unpack` gives back)."""
    index: dict[int, int] = {}
    distinct: list[np.ndarray] = []
    at = []
    for a in arrays:
        i = index.get(id(a))
        if i is None:
            i = index[id(a)] = len(distinct)
            distinct.append(a)
        at.append(i)
    dtypes: dict[np.dtype, int] = {}
    buffer = np.array([dtypes.setdefault(a.dtype, len(dtypes)) for a in distinct], dtype=np.int64)
    sizes = np.array([a.size for a in distinct], dtype=np.int64)
    offset = np.zeros(len(distinct), dtype=np.int64)
    buffers = []
    for dtype, slot in dtypes.items():
        members = np.flatnonzero(buffer == slot)
        ends = np.cumsum(sizes[members])
        offset[members] = ends - sizes[members]
        flat = [distinct[i].ravel() for i in members.tolist()]
        buffers.append(np.concatenate(flat) if flat else np.zeros(0, dtype=dtype))
    packed = Packed(tuple(buffers), buffer, offset, [a.shape for a in distinct])
    return packed, np.array(at, dtype=np.int64)


def unpack(packed: Packed) -> list[np.ndarray]:
    """The arrays `pack` packed, in its order: views of its buffers (one region each, so an
    array is shared only where it was when packed)."""
    out = []
    for buffer, start, shape in zip(
        packed.buffer.tolist(), packed.offset.tolist(), packed.shapes, strict=True
    ):
        out.append(packed.buffers[buffer][start : start + math.prod(shape)].reshape(shape))
    return out
