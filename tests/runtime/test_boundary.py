"""runtime/spmd/boundary.py: a layout as a PartitionSpec over named mesh axes (checked
against jax's own NamedSharding, device by device), the nearest expressible layout for
strides and partial sums, and parameter keys read from metadata."""

from __future__ import annotations

import jax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from rhino.hlo.parser import parse_module
from rhino.runtime.spmd.boundary import expressible, parameter_keys, partition_spec
from rhino.search.mesh import DeviceMesh
from rhino.search.spmd.spec import SpecError, all_specs, parse_spec

NAMES = ("data", "model")


@pytest.mark.parametrize(
    ("layout", "rank", "want"),
    [
        ("RR", 0, ()),
        ("RR", 2, (None, None)),
        ("RS0", 2, ("model", None)),
        ("S1S0", 2, ("model", "data")),
        ("S0S0", 1, (("data", "model"),)),
        ("S0S0 order=1,0", 2, (("model", "data"), None)),
    ],
)
def test_a_layout_names_the_axes_splitting_each_dim(
    layout: str, rank: int, want: tuple[object, ...]
) -> None:
    assert partition_spec(parse_spec(layout, 2), rank, NAMES) == want


def test_every_layout_of_a_2x4_mesh_is_the_named_sharding_of_its_partition_spec() -> None:
    """Device d of rhino's mesh is mesh.devices.flat[d]: there, the NamedSharding of the
    PartitionSpec holds exactly the elements the layout gives device d."""
    mesh = jax.make_mesh((2, 4), NAMES)
    rhino_mesh = DeviceMesh((2, 4))
    shape = (8, 16)
    specs = [s for s in all_specs(shape, rhino_mesh) if s.is_maximal() and not s.partial_axes()]
    assert len(specs) > 10
    for spec in specs:
        named = NamedSharding(mesh, PartitionSpec(*partition_spec(spec, 2, NAMES)))
        where = named.devices_indices_map(shape)
        for d, per_dim in enumerate(spec.device_slices(shape, rhino_mesh)):
            index = where[mesh.devices.flat[d]]
            got = tuple(tuple(range(*s.indices(n))) for s, n in zip(index, shape, strict=True))
            assert got == per_dim, (str(spec), d)


@pytest.mark.parametrize(
    ("layout", "nearest", "why"),
    [
        ("S0R", "S0R", None),
        ("S0[s=2]R", "S0R", "a non-maximal stride"),
        ("PS1", "RS1", "partial sums"),
        ("P[max]S0[s=2]", "RS0", "a non-maximal stride and partial sums"),
        ("S0[s=1]S0 order=1,0", "S0S0 order=1,0", "a non-maximal stride"),
    ],
)
def test_the_nearest_expressible_layout(layout: str, nearest: str, why: str | None) -> None:
    spec, reason = expressible(parse_spec(layout, 2))
    assert (str(spec), reason) == (nearest, why)


def test_an_inexpressible_layout_has_no_partition_spec() -> None:
    with pytest.raises(SpecError, match="expressible"):
        partition_spec(parse_spec("S0[s=2]R", 2), 1, NAMES)


def test_keys_are_the_pytree_paths_jax_writes_as_metadata() -> None:
    text = r"""HloModule m

ENTRY main {
  params__dense____kernel__.1 = f32[4,3]{1,0} parameter(0), metadata={op_name="params[\'dense\'][\'kernel\']"}
  state_step.1 = s32[] parameter(1), metadata={op_name="state.step"}
  y.1 = f32[4,3]{1,0} parameter(2)
  p.3 = f32[4,3]{1,0} parameter(3), metadata={op_name="jit(step)/add" stack_frame_id=3}
  a.1 = f32[] parameter(4), metadata={op_name="same"}
  b.1 = f32[] parameter(5), metadata={op_name="same"}
  ROOT t = (f32[4,3]{1,0}, s32[]) tuple(params__dense____kernel__.1, state_step.1)
}
"""
    assert parameter_keys(parse_module(text)) == {
        "params__dense____kernel__.1": "params['dense']['kernel']",
        "state_step.1": "state.step",
    }
