"""rhino.search.cluster: units, YAML loading and its errors, the per-axis link model."""

from __future__ import annotations

from pathlib import Path

import pytest

from rhino.hlo.errors import ConfigError
from rhino.search.cluster import (
    Link,
    cluster_names,
    load_cluster,
    load_cluster_text,
    parse_quantity,
)
from rhino.search.mesh import parse_mesh

GOOD = """\
name: test
devices_per_node: 4
device:
  memory: 16 GiB
  flops: {f32: 10 TFLOP/s, bf16: 40 TFLOP/s}
links:
  intra_node: {bandwidth: 100 GB/s, latency: 1 us}
  inter_node: {bandwidth: 80 Gb/s, latency: 10 us}
"""


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        ("300 GB/s", "bandwidth", 300e9),
        ("100 Gb/s", "bandwidth", 12.5e9),
        ("2 GiB/s", "bandwidth", 2 * 2**30),
        (150e9, "bandwidth", 150e9),
        ("150e9", "bandwidth", 150e9),
        ("32 GiB", "bytes", 32 * 2**30),
        ("80 GB", "bytes", 80e9),
        (1024, "bytes", 1024),
        ("5 us", "time", 5e-6),
        ("1.5 ms", "time", 1.5e-3),
        ("0", "time", 0.0),
        ("15.7 TFLOP/s", "flops", 15.7e12),
        ("125 TFLOPS", "flops", 125e12),
        ("20GFLOP/s", "flops", 20e9),
    ],
)
def test_parse_quantity(value: object, kind: str, expected: float) -> None:
    assert parse_quantity(value, kind) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("fast", "bandwidth"),
        ("5 parsecs", "time"),
        ("32 GiB/s", "bytes"),
        (True, "bytes"),
        (-1, "bandwidth"),
        (0, "bandwidth"),
        ("10 TB", "flops"),
        (None, "time"),
        ([1], "time"),
    ],
)
def test_parse_quantity_rejects(value: object, kind: str) -> None:
    with pytest.raises(ValueError, match="expected a number like"):
        parse_quantity(value, kind)


@pytest.mark.parametrize("name", ["m8", "h100x8", "cpu"])
def test_shipped_clusters_load(name: str) -> None:
    cluster = load_cluster(name)
    assert cluster.name == name
    assert cluster.devices_per_node >= 1
    assert cluster.intra_node.bandwidth > cluster.inter_node.bandwidth
    assert cluster.flops_for("f32") > 0
    assert cluster.memory_bytes > 1e9


def test_shipped_names() -> None:
    assert {"m8", "h100x8", "cpu"} <= set(cluster_names())


def test_m8_numbers() -> None:
    m8 = load_cluster("m8")
    assert m8.memory_bytes == 32 * 2**30
    assert m8.flops_for("f32") <= 15.7e12  # achievable, below the V100 peak
    assert m8.flops_for("s32") == m8.flops_for("f32")  # unlisted types use f32
    assert m8.inter_node.bandwidth <= 100e9 / 8  # at most the 100 Gb/s line rate


def test_load_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(GOOD)
    cluster = load_cluster(str(path))
    assert cluster.name == "test"
    assert cluster.source == str(path)
    assert cluster.flops_for("bf16") == 40e12
    assert cluster.memory_bandwidth is None
    assert cluster.inter_node == Link(10e9, 10e-6)


def test_name_defaults_to_file_name(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text(GOOD.replace("name: test\n", ""))
    assert load_cluster(path).name == "lab"


def test_unknown_name_lists_the_shipped_ones() -> None:
    with pytest.raises(ConfigError, match=r"cluster 'm9'.*available: .*m8"):
        load_cluster("m9")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_cluster(tmp_path / "nope.yaml")


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_cluster(str(path))
    return str(info.value)


def test_bad_unit_names_file_line_col_and_key(tmp_path: Path) -> None:
    message = _error(tmp_path, GOOD.replace("bandwidth: 100 GB/s", "bandwidth: fast"))
    assert message == (
        f"{tmp_path / 'bad.yaml'}:7:27: key 'links.intra_node.bandwidth': "
        "expected a number like 150e9 or '150 GB/s', got 'fast'"
    )


def test_missing_key_names_file_and_key(tmp_path: Path) -> None:
    message = _error(tmp_path, GOOD.replace("  memory: 16 GiB\n", ""))
    # where the mapping that lacks it starts
    assert message == f"{tmp_path / 'bad.yaml'}:4:3: key 'device.memory': missing"
    message = _error(tmp_path, GOOD.replace(", latency: 10 us", ""))
    assert message.endswith("key 'links.inter_node.latency': missing")
    message = _error(tmp_path, GOOD.replace("f32: 10 TFLOP/s, ", ""))
    assert "key 'device.flops.f32': missing" in message


def test_unknown_key_is_an_error(tmp_path: Path) -> None:
    message = _error(tmp_path, GOOD.replace("intra_node:", "intra_nod:"))
    assert "key 'links.intra_nod': unknown key" in message


def test_bad_values(tmp_path: Path) -> None:
    assert "key 'devices_per_node': expected a positive integer" in _error(
        tmp_path, GOOD.replace("devices_per_node: 4", "devices_per_node: four")
    )
    assert "not valid YAML" in _error(tmp_path, GOOD + "  : [\n")
    assert "top level: expected a mapping" in _error(tmp_path, "- 1\n- 2\n")
    assert "key 'meshes.2x4': expected a list of 2 links" in _error(
        tmp_path, GOOD + "meshes:\n  2x4: [{bandwidth: 1 GB/s, latency: 1 us}]\n"
    )


def test_intra_and_inter_node_axes() -> None:
    cluster = load_cluster_text(GOOD)  # 4 devices per node
    mesh = parse_mesh("2x4")
    assert cluster.axis_link(mesh, 1) == cluster.intra_node
    inter = cluster.axis_link(mesh, 0)
    # 4 groups ({0,4}, {1,5}, ...) share each node's one NIC
    assert inter == Link(10e9 / 4, 10e-6)
    # one group over all 8 devices has the NIC to itself
    assert cluster.group_link(mesh, (0, 1)) == Link(10e9, 10e-6)
    # a mesh within one node
    assert cluster.axis_link(parse_mesh("2x2"), 0) == cluster.intra_node


def test_nics_per_node_share() -> None:
    text = GOOD.replace("latency: 10 us}", "latency: 10 us, nics_per_node: 4}")
    cluster = load_cluster_text(text)
    assert cluster.axis_link(parse_mesh("2x4"), 0).bandwidth == 10e9  # a NIC per group
    # the inter-node share never exceeds the intra-node link
    text = GOOD.replace("80 Gb/s", "8000 Gb/s")
    assert load_cluster_text(text).group_link(parse_mesh("2x4"), (0, 1)).bandwidth == 100e9


def test_m8_2x8_axes() -> None:
    m8 = load_cluster("m8")
    mesh = parse_mesh("2x8")
    fast, slow = m8.axis_link(mesh, 1), m8.axis_link(mesh, 0)
    assert fast == m8.intra_node
    assert slow.bandwidth == pytest.approx(m8.inter_node.bandwidth / 8)
    # 4x4 on two nodes: axis 0 groups {j, 4+j, 8+j, 12+j} span both nodes, four per NIC
    assert m8.axis_link(parse_mesh("4x4"), 0).bandwidth == pytest.approx(
        m8.inter_node.bandwidth / 4
    )


def test_mesh_override(tmp_path: Path) -> None:
    text = GOOD + (
        "meshes:\n"
        "  2x4:\n"
        "    - {bandwidth: 3 GB/s, latency: 7 us}\n"
        "    - {bandwidth: 50 GB/s, latency: 2 us}\n"
    )
    cluster = load_cluster_text(text)
    mesh = parse_mesh("2x4")
    assert cluster.axis_link(mesh, 0) == Link(3e9, 7e-6)
    assert cluster.axis_link(mesh, 1) == Link(50e9, 2e-6)
    assert cluster.group_link(mesh, (0, 1)) == Link(3e9, 7e-6)
    # other meshes keep the link model
    assert cluster.axis_link(parse_mesh("4x2"), 1) == cluster.intra_node


@pytest.mark.parametrize(
    ("n", "places", "up", "text"),
    [
        (100, 1, False, "100 B"),
        (1024, 1, False, "1 KiB"),
        (1536, 1, False, "1.5 KiB"),
        (3 * 2**30, 2, False, "3 GiB"),
        (10.0001 * 2**30, 2, False, "10 GiB"),
        (10.0001 * 2**30, 2, True, "10.01 GiB"),
        (1023.5, 1, True, "1 KiB"),
        (5 * 2**40, 1, False, "5 TiB"),
    ],
)
def test_bytes_read_as_a_person_writes_them(n: float, places: int, up: bool, text: str) -> None:
    from rhino.search.units import format_bytes

    assert format_bytes(n, places, up=up) == text
    if up:
        assert parse_quantity(text.replace(" ", ""), "bytes") >= n  # a limit that holds it


def test_a_key_given_twice_is_an_error_at_its_second_place(tmp_path: Path) -> None:
    message = _error(tmp_path, GOOD + "devices_per_node: 8\n")
    assert message == f"{tmp_path / 'bad.yaml'}:9:1: key 'devices_per_node': given twice"
