"""Cluster descriptions: device speed and memory, and the links between devices.

A cluster is read from YAML (configs/clusters/<name>.yaml):

    name: m8                        # optional; defaults to the file name
    devices_per_node: 8             # devices sharing the fast intra-node link
    device:
      name: V100-SXM2-32GB          # optional, for reports
      memory: 32 GiB                # bytes per device
      memory_bandwidth: 800 GB/s    # optional: achievable HBM bandwidth
      flops:                        # achievable FLOP/s per element type; f32 required,
        f32: 14 TFLOP/s             # other types fall back to f32
        f16: 100 TFLOP/s
    links:
      intra_node:                   # per device, as NCCL's "bus bandwidth"
        bandwidth: 130 GB/s
        latency: 1 us               # per ring step
      inter_node:
        bandwidth: 100 Gb/s         # per NIC
        nics_per_node: 1            # optional, default 1; NICs share the node's traffic
        latency: 5 us
    meshes:                         # optional: measured per-axis numbers for one mesh
      "2x8":
        - {bandwidth: 1.4 GB/s, latency: 5 us}     # axis 0
        - {bandwidth: 130 GB/s, latency: 1 us}     # axis 1

Numbers take units: bandwidth "300 GB/s", "100 Gb/s" (bits), "25 GiB/s"; bytes "32 GiB",
"80 GB"; time "5 us", "1.5 ms"; throughput "15.7 TFLOP/s", "125 TFLOPS"; a plain number
is in base units (bytes, bytes/s, seconds, FLOP/s).

Link model (`Cluster.group_link`). Mesh device ids are row-major and node k holds ids
[k*devices_per_node, (k+1)*devices_per_node), so inner mesh axes stay in a node. A
collective whose replica groups each stay in one node runs at the intra-node numbers.
Otherwise each group runs a ring that leaves and enters every node it touches once, and
all groups of the collective run at the same time: a node's NICs (bandwidth x
nics_per_node) are shared by the groups that touch the node, so a group gets
node_bandwidth / groups_touching_node, capped by the intra-node bandwidth, with the
inter-node latency. On a 2x8 mesh of M8 nodes, axis 0 pairs device i with 8+i: eight
groups share one 100 Gb/s NIC. A `meshes` entry replaces this for the listed mesh: one
group over several axes gets the slowest bandwidth and the largest latency among them.
"""

from __future__ import annotations

import importlib.resources
import math
import os
import re
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from rhino.hlo.errors import ConfigError
from rhino.search.mesh import DeviceMesh, parse_mesh
from rhino.search.yamldoc import YamlReader, kind_of, load

# -- units ---------------------------------------------------------------------------------

_PREFIX = {"": 1.0, "K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BIN_PREFIX = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}


def _unit_table() -> dict[str, dict[str, float]]:
    bandwidth: dict[str, float] = {}
    size: dict[str, float] = {}
    for p, f in _PREFIX.items():
        bandwidth[f"{p}B/s"] = f
        bandwidth[f"{p}b/s"] = f / 8
        bandwidth[f"{p}bit/s"] = f / 8
        bandwidth[f"{p}bps"] = f / 8
        size[f"{p}B"] = f
    for p, f in _BIN_PREFIX.items():
        bandwidth[f"{p}B/s"] = f
        size[f"{p}B"] = f
    time = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    flops: dict[str, float] = {}
    for p, f in _PREFIX.items():
        for unit in ("FLOP/s", "FLOPS", "FLOPs", "flop/s", "flops"):
            flops[f"{p}{unit}"] = f
    return {"bandwidth": bandwidth, "bytes": size, "time": time, "flops": flops}


_UNITS = _unit_table()
_EXAMPLES = {
    "bandwidth": "a number like 150e9 or '150 GB/s'",
    "bytes": "a number like 34359738368 or '32 GiB'",
    "time": "a number like 5e-6 or '5 us'",
    "flops": "a number like 15.7e12 or '15.7 TFLOP/s'",
}
_QUANTITY_RE = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([^\s\d].*?)?\s*$")


def parse_quantity(value: Any, kind: str) -> float:
    """`value` (a number or a string with a unit) in base units of `kind`.

    kind is "bandwidth" (bytes/s), "bytes", "time" (seconds) or "flops" (FLOP/s).
    Raises ValueError naming what was expected. Times may be 0; the rest must be > 0.
    """
    if isinstance(value, bool) or value is None:
        raise ValueError(f"expected {_EXAMPLES[kind]}, got {value!r}")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        m = _QUANTITY_RE.match(value)
        if m is None:
            raise ValueError(f"expected {_EXAMPLES[kind]}, got {value!r}")
        number = float(m.group(1))
        unit = m.group(2)
        if unit:
            factor = _UNITS[kind].get(unit)
            if factor is None:
                raise ValueError(
                    f"expected {_EXAMPLES[kind]}, got {value!r} (unknown unit {unit!r})"
                )
            # divide by 1e6 rather than multiply by 1e-6: "5 us" is exactly 5e-06
            number = number * factor if factor >= 1 else number / round(1 / factor)
    else:
        raise ValueError(f"expected {_EXAMPLES[kind]}, got {value!r}")
    if not math.isfinite(number) or number < 0 or (number == 0 and kind != "time"):
        raise ValueError(f"expected {_EXAMPLES[kind]} greater than 0, got {value!r}")
    return number


# -- the cluster -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """Alpha-beta numbers of one kind of link, per device."""

    bandwidth: float
    """Bytes per second a device moves through the link (NCCL bus bandwidth)."""
    latency: float
    """Seconds per message step (alpha)."""


@dataclass(frozen=True)
class Cluster:
    """A homogeneous cluster: nodes of identical devices, intra- and inter-node links."""

    name: str
    """Short name (the YAML's `name`, or its file name)."""
    source: str
    """File the cluster was read from ("" when built in code)."""
    devices_per_node: int
    """Devices per node; mesh device ids fill nodes in order."""
    device_name: str
    """Device model, for reports."""
    memory_bytes: float
    """Memory per device, bytes."""
    memory_bandwidth: float | None
    """Achievable device-memory bandwidth, bytes/s (None when not given)."""
    flops: tuple[tuple[str, float], ...]
    """Achievable FLOP/s per element type ('f32' always present)."""
    intra_node: Link
    """Link between devices of one node."""
    inter_node: Link
    """One NIC between nodes (bandwidth per NIC)."""
    nics_per_node: int = 1
    """NICs per node; the node's inter-node bandwidth is nics_per_node x bandwidth."""
    mesh_axes: tuple[tuple[tuple[int, ...], tuple[Link, ...]], ...] = ()
    """Measured per-axis links for particular mesh shapes, overriding the link model."""

    def __post_init__(self) -> None:
        # hashed once: a cluster is part of the key of every cost cache (reshards, links)
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self))))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __reduce__(self) -> tuple[type[Cluster], tuple[Any, ...]]:
        """Pickled as its fields: string hashes are salted per process."""
        return Cluster, tuple(getattr(self, f.name) for f in fields(self))

    def flops_for(self, dtype: str) -> float:
        """Achievable FLOP/s for element type `dtype` (f32's when not listed)."""
        table = dict(self.flops)
        return table.get(dtype, table["f32"])

    def axis_link(self, mesh: DeviceMesh, axis: int) -> Link:
        """The link a collective along one mesh axis runs at."""
        return self.group_link(mesh, (axis,))

    def group_link(self, mesh: DeviceMesh, axes: tuple[int, ...]) -> Link:
        """The link a collective over `axes` runs at (see the module's link model)."""
        return _group_link(self, mesh, tuple(axes))

    def _group_link(self, mesh: DeviceMesh, axes: tuple[int, ...]) -> Link:
        for shape, links in self.mesh_axes:
            if shape == mesh.shape:
                return Link(
                    min(links[a].bandwidth for a in axes),
                    max(links[a].latency for a in axes),
                )
        groups = mesh.axes_groups(tuple(axes))
        dpn = self.devices_per_node
        touching: dict[int, int] = {}
        crossing = False
        for group in groups:
            nodes = {d // dpn for d in group}
            if len(nodes) > 1:
                crossing = True
                for node in nodes:
                    touching[node] = touching.get(node, 0) + 1
        if not crossing:
            return self.intra_node
        node_bandwidth = self.inter_node.bandwidth * self.nics_per_node
        per_group = node_bandwidth / max(touching.values())
        return Link(min(per_group, self.intra_node.bandwidth), self.inter_node.latency)


@lru_cache(maxsize=4096)
def _group_link(cluster: Cluster, mesh: DeviceMesh, axes: tuple[int, ...]) -> Link:
    return cluster._group_link(mesh, axes)


# -- loading ---------------------------------------------------------------------------------

_REPO_CLUSTERS = Path(__file__).resolve().parent.parent / "configs" / "clusters"


def cluster_names() -> list[str]:
    """Names of the clusters shipped with rhino."""
    names: set[str] = set()
    for folder in _cluster_dirs():
        names.update(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
    return sorted(names)


def _cluster_dirs() -> list[Any]:
    """Where shipped clusters live: configs/clusters/ next to the package folders (a
    checkout, or an editable install), else the `rhino.configs` package data (a wheel)."""
    dirs: list[Any] = []
    if _REPO_CLUSTERS.is_dir():
        dirs.append(_REPO_CLUSTERS)
    try:
        packaged = importlib.resources.files("rhino.configs") / "clusters"
        if packaged.is_dir():
            dirs.append(packaged)
    except (ModuleNotFoundError, TypeError):
        pass
    return dirs


def load_cluster(name_or_path: str | os.PathLike[str]) -> Cluster:
    """Read a cluster: a YAML path, or the name of a shipped one ("m8", "h100x8", "cpu")."""
    text_name = os.fspath(name_or_path)
    path = Path(text_name)
    looks_like_path = path.suffix in (".yaml", ".yml") or os.sep in text_name or "/" in text_name
    if looks_like_path:
        if not path.is_file():
            raise ConfigError(f"cluster file {text_name}: no such file")
        return _load_text(path.read_text(encoding="utf-8"), text_name, path.stem)
    for folder in _cluster_dirs():
        candidate = folder / f"{text_name}.yaml"
        if candidate.is_file():
            return _load_text(candidate.read_text(encoding="utf-8"), _shown(candidate), text_name)
    raise ConfigError(
        f"cluster {text_name!r}: not a file, and no shipped cluster of that name "
        f"(available: {', '.join(cluster_names()) or 'none found'})"
    )


def _shown(path: Any) -> str:
    """A path as a user would write it: relative to the working directory when inside it."""
    try:
        return os.path.relpath(str(path))
    except ValueError:
        return str(path)


def load_cluster_text(text: str, source: str = "<string>") -> Cluster:
    """Read a cluster from YAML text; `source` names it in error messages."""
    return _load_text(text, source, Path(source).stem if source != "<string>" else "cluster")


def _load_text(text: str, source: str, default_name: str) -> Cluster:
    reader, doc = load(text, source)
    if doc is None:
        raise ConfigError(f"{source}: empty cluster file")
    r = _ClusterReader(reader)
    root = r.mapping(doc, "", ("name", "devices_per_node", "device", "links", "meshes"))
    device_node = r.required(root, "device", "", doc)
    device = r.mapping(device_node, "device", ("name", "memory", "memory_bandwidth", "flops"))
    flops_node = r.required(device, "flops", "device", device_node)
    flops_doc = r.mapping(flops_node, "device.flops", None)
    if "f32" not in flops_doc:
        raise r.fail(flops_node, "device.flops.f32", f"missing (expected {_EXAMPLES['flops']})")
    flops = tuple(
        sorted((k, r.quantity(v, f"device.flops.{k}", "flops")) for k, v in flops_doc.items())
    )
    links_node = r.required(root, "links", "", doc)
    links = r.mapping(links_node, "links", ("intra_node", "inter_node"))
    intra = r.link(r.required(links, "intra_node", "links", links_node), "links.intra_node", ())
    inter_node = r.required(links, "inter_node", "links", links_node)
    inter = r.link(inter_node, "links.inter_node", ("nics_per_node",))
    nics_node = r.mapping(inter_node, "links.inter_node", None).get("nics_per_node")
    nics = 1 if nics_node is None else r.positive_int(nics_node, "links.inter_node.nics_per_node")
    dpn = r.positive_int(r.required(root, "devices_per_node", "", doc), "devices_per_node")
    mesh_axes = []
    meshes = r.mapping(root["meshes"], "meshes", None) if "meshes" in root else {}
    for mesh_text, axes_node in meshes.items():
        key = f"meshes.{mesh_text}"
        try:
            mesh = parse_mesh(mesh_text)
        except ConfigError as e:
            raise r.fail(axes_node, key, str(e)) from None
        if not isinstance(axes_node, yaml.SequenceNode) or len(axes_node.value) != mesh.ndim:
            raise r.fail(
                axes_node,
                key,
                f"expected a list of {mesh.ndim} links (one per mesh axis), "
                f"got {kind_of(axes_node)}",
            )
        mesh_axes.append(
            (mesh.shape, tuple(r.link(a, f"{key}[{i}]", ()) for i, a in enumerate(axes_node.value)))
        )
    name = r.string(root["name"], "name") if "name" in root else default_name
    memory_bandwidth = (
        r.quantity(device["memory_bandwidth"], "device.memory_bandwidth", "bandwidth")
        if "memory_bandwidth" in device
        else None
    )
    return Cluster(
        name=name,
        source=source,
        devices_per_node=dpn,
        device_name=str(r.scalar(device["name"])) if "name" in device else "",
        memory_bytes=r.quantity(
            r.required(device, "memory", "device", device_node), "device.memory", "bytes"
        ),
        memory_bandwidth=memory_bandwidth,
        flops=flops,
        intra_node=intra,
        inter_node=inter,
        nics_per_node=nics,
        mesh_axes=tuple(mesh_axes),
    )


class _ClusterReader(YamlReader):
    """The cluster's keys, read from its node tree (errors carry file, key and line:col)."""

    def __init__(self, reader: YamlReader) -> None:
        super().__init__(reader.source, reader.loader)

    def quantity(self, node: yaml.Node, key: str, kind: str) -> float:
        try:
            return parse_quantity(self.scalar(node), kind)
        except ValueError as e:
            raise self.fail(node, key, str(e)) from None

    def link(self, node: yaml.Node, key: str, extra: tuple[str, ...]) -> Link:
        doc = self.mapping(node, key, ("bandwidth", "latency", *extra))
        return Link(
            bandwidth=self.quantity(
                self.required(doc, "bandwidth", key, node), f"{key}.bandwidth", "bandwidth"
            ),
            latency=self.quantity(
                self.required(doc, "latency", key, node), f"{key}.latency", "time"
            ),
        )
