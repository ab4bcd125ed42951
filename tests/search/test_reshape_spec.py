"""A layout mapped through a reshape puts the same elements, in the same local order, on
every device (so the reshape stays local), including dims split over several mesh axes."""

from __future__ import annotations

import itertools
import math

import pytest

from rhino.search.mesh import parse_mesh
from rhino.search.spmd.spec import ShardingSpec, parse_spec
from rhino.search.spmd.strategy import reshape_spec


def local_elements(spec: ShardingSpec, shape: tuple[int, ...], mesh_text: str) -> list[list[int]]:
    """Per device, the row-major flat indices of its shard, in local row-major order."""
    mesh = parse_mesh(mesh_text)
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    return [
        [
            sum(i * s for i, s in zip(index, strides, strict=True))
            for index in itertools.product(*per_dim)
        ]
        for per_dim in spec.device_slices(shape, mesh)
    ]


CASES = [
    ("S0S0", (8, 4), (32,), "2x4", "S0S0"),
    ("S0S0 order=1,0", (8, 4), (32,), "2x4", "S0S0 order=1,0"),
    ("S0S0", (32,), (8, 4), "2x4", "S0S0"),
    ("S1S1", (3, 8, 4), (3, 32), "2x4", "S1S1"),
    ("S0S0", (16, 3), (2, 8, 3), "2x4", None),  # 8 blocks of dim 0 straddle the new dims
    ("S0S1", (8, 4), (32,), "2x2", "S0S0[s=2]"),
    ("S0R", (8, 4), (32,), "2x4", "S0R"),
]


@pytest.mark.parametrize(("spec", "src", "dst", "mesh", "want"), CASES)
def test_reshape_spec(
    spec: str, src: tuple[int, ...], dst: tuple[int, ...], mesh: str, want: str | None
) -> None:
    got = reshape_spec(parse_spec(spec), src, dst, parse_mesh(mesh))
    if want is None:
        assert got is None
        return
    assert got is not None and str(got) == want
    assert local_elements(parse_spec(spec), src, mesh) == local_elements(got, dst, mesh)
