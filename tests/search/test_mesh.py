"""rhino.search.mesh: parsing, row-major ids, replica groups, factorizations."""

from __future__ import annotations

import pytest

from rhino.hlo.errors import ConfigError
from rhino.search.mesh import DeviceMesh, mesh_factorizations, parse_mesh


@pytest.mark.parametrize(
    ("text", "shape"),
    [("8", (8,)), ("2x8", (2, 8)), ("2x2x4", (2, 2, 4)), (" 4 x 2 ", (4, 2)), ("1x8", (1, 8))],
)
def test_parse_mesh(text: str, shape: tuple[int, ...]) -> None:
    mesh = parse_mesh(text)
    assert mesh.shape == shape
    assert str(parse_mesh(str(mesh))) == str(mesh)


@pytest.mark.parametrize("text", ["2x", "x8", "", "2x0", "0", "2*8", "2x-1", "two", "2x8x"])
def test_parse_mesh_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match=r"mesh .*expected AxB.*got"):
        parse_mesh(text)


def test_parse_mesh_message_names_the_text() -> None:
    with pytest.raises(ConfigError) as info:
        parse_mesh("2x")
    assert str(info.value).startswith("mesh '2x': expected AxB")
    assert str(info.value).endswith("got '2x'")


def test_bad_shape() -> None:
    with pytest.raises(ConfigError):
        DeviceMesh((2, 0))
    with pytest.raises(ConfigError):
        DeviceMesh(())


def test_row_major_ids() -> None:
    mesh = parse_mesh("2x8")
    assert mesh.size == 16
    assert mesh.device_id((1, 3)) == 11
    assert mesh.coords(11) == (1, 3)
    assert all(mesh.device_id(mesh.coords(d)) == d for d in range(16))
    assert mesh.strides == (8, 1)


def test_axis_groups_2x4() -> None:
    mesh = parse_mesh("2x4")
    assert mesh.axis_groups(1) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.axis_groups(0) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_axes_groups_several_axes() -> None:
    mesh = parse_mesh("2x2x2")
    assert mesh.axes_groups((1, 2)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.axes_groups((0, 2)) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    # the order of the axes is the order shards are concatenated in
    assert mesh.axes_groups((2, 0)) == [[0, 4, 1, 5], [2, 6, 3, 7]]
    assert mesh.axes_groups((0, 1, 2)) == [list(range(8))]
    assert mesh.axes_groups(()) == [[d] for d in range(8)]


def test_groups_partition_the_devices() -> None:
    mesh = parse_mesh("2x3x4")
    for axes in [(0,), (1,), (2,), (0, 2), (2, 1)]:
        groups = mesh.axes_groups(axes)
        flat = sorted(d for g in groups for d in g)
        assert flat == list(range(mesh.size))
        assert all(len(g) == mesh.axes_size(axes) for g in groups)


def test_bad_axes() -> None:
    with pytest.raises(ValueError):
        parse_mesh("2x4").axis_groups(2)
    with pytest.raises(ValueError):
        parse_mesh("2x4").axes_groups((0, 0))


def test_mesh_factorizations() -> None:
    assert [m.shape for m in mesh_factorizations(8)] == [(8,), (2, 4), (4, 2)]
    assert [m.shape for m in mesh_factorizations(16)] == [(16,), (2, 8), (4, 4), (8, 2)]
    assert [m.shape for m in mesh_factorizations(7)] == [(7,)]
    assert [m.shape for m in mesh_factorizations(1)] == [(1,)]
    assert all(m.size == 12 for m in mesh_factorizations(12))
    with pytest.raises(ConfigError):
        mesh_factorizations(0)


def test_the_meshes_of_a_device_count_share_one_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    from rhino.search.cluster import load_cluster
    from rhino.search.mesh import DeviceMesh
    from rhino.search.spmd import meshsearch
    from rhino.search.spmd.planner import PlanRequest

    seen = []

    def trial(args):  # type: ignore[no-untyped-def]
        seen.append(args[2].solve.deadline)
        return None, "not planned here", 0.0  # (plan, error, seconds)

    monkeypatch.setattr(meshsearch, "_trial", trial)
    request = PlanRequest(DeviceMesh((1,)), load_cluster("m8"))
    with pytest.raises(meshsearch.InfeasibleError):
        meshsearch.plan_best_mesh("", "x.hlo", 8, request, jobs=1)
    assert len(seen) == len(meshsearch.mesh_factorizations(8)) > 1
    assert seen[0] is not None and len(set(seen)) == 1
