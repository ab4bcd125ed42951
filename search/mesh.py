"""Logical device meshes.

A `DeviceMesh` arranges N devices in a grid, outermost axis first: mesh "2x8" has shape
(2, 8), and device ids are laid out row-major, so the device at mesh coordinates (i, j)
is `i * 8 + j`. On a cluster whose nodes hold consecutive device ids, the innermost axis
therefore stays inside a node longest (see `rhino.search.cluster`).

A collective "along axis a" runs once per replica group: the devices that differ only
in their coordinate on axis a (`axis_groups`). A collective over several axes runs over
the devices that differ only on those axes (`axes_groups`).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from functools import cached_property

from rhino.hlo.errors import ConfigError

_MESH_RE = re.compile(r"^\s*[1-9][0-9]*(\s*x\s*[1-9][0-9]*)*\s*$")


@dataclass(frozen=True)
class DeviceMesh:
    """A grid of devices; ids are row-major over `shape` (the last axis is contiguous)."""

    shape: tuple[int, ...]
    """Size of each mesh axis, outermost first; every size is >= 1."""

    def __post_init__(self) -> None:
        if not self.shape or any(not isinstance(n, int) or n < 1 for n in self.shape):
            raise ConfigError(f"mesh shape must be one or more positive sizes, got {self.shape}")
        # a mesh is part of the key of every cost cache; the hash of ints is the same in
        # every process, so a pickled mesh may carry it
        object.__setattr__(self, "_hash", hash((self.shape,)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    # -- basic facts -------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        """Number of mesh axes."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of devices."""
        return math.prod(self.shape)

    @cached_property
    def strides(self) -> tuple[int, ...]:
        """Device-id distance between neighbours along each axis (row-major)."""
        return tuple(math.prod(self.shape[a + 1 :]) for a in range(self.ndim))

    def device_id(self, coords: tuple[int, ...]) -> int:
        """The device at mesh coordinates `coords`."""
        return sum(c * s for c, s in zip(coords, self.strides, strict=True))

    def coords(self, device: int) -> tuple[int, ...]:
        """Mesh coordinates of `device` (inverse of `device_id`)."""
        return self._all_coords[device]

    @cached_property
    def _all_coords(self) -> tuple[tuple[int, ...], ...]:
        return tuple(
            tuple((d // s) % n for s, n in zip(self.strides, self.shape, strict=True))
            for d in range(self.size)
        )

    def devices(self) -> list[int]:
        """All device ids in order."""
        return list(range(self.size))

    def axes_size(self, axes: tuple[int, ...]) -> int:
        """Number of devices in one replica group over `axes`."""
        return math.prod(self.shape[a] for a in axes)

    # -- replica groups ------------------------------------------------------------------

    def axis_groups(self, axis: int) -> list[list[int]]:
        """Replica groups of a collective along one mesh axis.

        For mesh 2x4, axis 1 gives [[0,1,2,3],[4,5,6,7]] and axis 0 gives
        [[0,4],[1,5],[2,6],[3,7]]. Groups are ordered by their smallest device.
        """
        return self.axes_groups((axis,))

    def axes_groups(self, axes: tuple[int, ...]) -> list[list[int]]:
        """Replica groups of a collective over several mesh axes.

        Within a group, devices are ordered by their coordinates on `axes` in the order
        given (the first axis varies slowest), which is the order in which an all-gather
        over those axes concatenates shards.
        """
        self._check_axes(axes)
        rest = [a for a in range(self.ndim) if a not in axes]
        groups: list[list[int]] = []
        for rest_coords in itertools.product(*(range(self.shape[a]) for a in rest)):
            group = []
            for own_coords in itertools.product(*(range(self.shape[a]) for a in axes)):
                coords = [0] * self.ndim
                for a, c in zip(rest, rest_coords, strict=True):
                    coords[a] = c
                for a, c in zip(axes, own_coords, strict=True):
                    coords[a] = c
                group.append(self.device_id(tuple(coords)))
            groups.append(group)
        groups.sort(key=min)
        return groups

    def _check_axes(self, axes: tuple[int, ...]) -> None:
        if len(set(axes)) != len(axes) or any(not 0 <= a < self.ndim for a in axes):
            raise ValueError(f"mesh axes {axes} are not distinct axes of a {self} mesh")

    def __str__(self) -> str:
        return "x".join(str(n) for n in self.shape)

    # -- on disk -------------------------------------------------------------------------

    def to_json(self) -> list[int]:
        """The mesh in a plan file or a JSON report: its axis sizes, `[2, 4]`."""
        return list(self.shape)

    @staticmethod
    def from_json(sizes: object) -> DeviceMesh:
        """The mesh `to_json` wrote; raises ConfigError for anything but a list of sizes."""
        if not isinstance(sizes, list | tuple) or not all(
            isinstance(n, int) and not isinstance(n, bool) for n in sizes
        ):
            raise ConfigError(f"mesh {sizes!r}: expected a list of positive axis sizes")
        return DeviceMesh(tuple(sizes))


def parse_mesh(text: str) -> DeviceMesh:
    """Parse a mesh shape like "8", "2x8" or "2x2x4" (outermost axis first)."""
    if not isinstance(text, str) or not _MESH_RE.match(text):
        raise ConfigError(
            f"mesh {text!r}: expected AxB... with positive integer sizes "
            f"(e.g. '8', '2x8', '2x2x4'), got {text!r}"
        )
    return DeviceMesh(tuple(int(part) for part in text.replace(" ", "").split("x")))


def mesh_factorizations(n: int) -> list[DeviceMesh]:
    """All 1-D and 2-D meshes of exactly n devices: (n,), then (a, n/a) for 1 < a < n.

    Used by `--devices N`: the planner tries each and keeps the best plan. Shapes with an
    axis of size 1 other than the 1-D mesh are left out (they repeat the 1-D mesh).
    """
    if n < 1:
        raise ConfigError(f"devices: expected a positive number of devices, got {n}", "devices")
    meshes = [DeviceMesh((n,))]
    for a in range(2, n):
        if n % a == 0:
            meshes.append(DeviceMesh((a, n // a)))
    return meshes
