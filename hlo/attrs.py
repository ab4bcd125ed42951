"""Decoders for instruction attribute values, one per attribute key, in a table.

`decode_attr(key, text)` turns the verbatim text of an attribute into a value whose
`str()` is XLA's text form again (so `set_attr` can print it). Keys not in the table
decode to `Raw`, the text itself. Decoders raise `TextError` with an offset into `text`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rhino.hlo.errors import TextError
from rhino.hlo.lexemes import STRING as STRING_RE


class Raw(str):
    """An attribute value rhino does not model: its text, verbatim."""


class IntList(tuple[int, ...]):
    """`{1,0}`."""

    def __str__(self) -> str:
        return "{" + ",".join(map(str, self)) + "}"

    __repr__ = __str__


class IntListList(tuple[IntList, ...]):
    """`{{0,1},{2,3}}` (replica groups, source-target pairs)."""

    def __str__(self) -> str:
        return "{" + ",".join(str(g) for g in self) + "}"

    __repr__ = __str__


class NameList(tuple[str, ...]):
    """`{%a, %b}`: names of computations or instructions."""

    def __str__(self) -> str:
        return "{" + ", ".join("%" + n for n in self) + "}"


@dataclass(frozen=True)
class WindowDim:
    size: int
    stride: int = 1
    pad_low: int = 0
    pad_high: int = 0
    lhs_dilate: int = 1
    rhs_dilate: int = 1
    reversal: bool = False


@dataclass(frozen=True)
class Window:
    """`{size=3x3 stride=2x2 pad=1_1x1_1 lhs_dilate=1x1 rhs_dilate=1x1 rhs_reversal=0x0}`."""

    dims: tuple[WindowDim, ...]

    def __str__(self) -> str:
        if not self.dims:
            return "{}"
        d = self.dims
        parts = ["size=" + "x".join(str(w.size) for w in d)]
        if any(w.stride != 1 for w in d):
            parts.append("stride=" + "x".join(str(w.stride) for w in d))
        if any(w.pad_low or w.pad_high for w in d):
            parts.append("pad=" + "x".join(f"{w.pad_low}_{w.pad_high}" for w in d))
        if any(w.lhs_dilate != 1 for w in d):
            parts.append("lhs_dilate=" + "x".join(str(w.lhs_dilate) for w in d))
        if any(w.rhs_dilate != 1 for w in d):
            parts.append("rhs_dilate=" + "x".join(str(w.rhs_dilate) for w in d))
        if any(w.reversal for w in d):
            parts.append("rhs_reversal=" + "x".join(str(int(w.reversal)) for w in d))
        return "{" + " ".join(parts) + "}"


@dataclass(frozen=True)
class ConvDimLabels:
    """`b01f_01io->b01f`: which dim of each operand is batch/feature/spatial."""

    lhs: str
    rhs: str
    out: str

    def __str__(self) -> str:
        return f"{self.lhs}_{self.rhs}->{self.out}"

    @staticmethod
    def _spatial(labels: str) -> tuple[int, ...]:
        digits = sorted((c, i) for i, c in enumerate(labels) if c.isdigit())
        return tuple(i for _, i in digits)

    @property
    def lhs_batch(self) -> int:
        return self.lhs.index("b")

    @property
    def lhs_feature(self) -> int:
        return self.lhs.index("f")

    @property
    def lhs_spatial(self) -> tuple[int, ...]:
        return self._spatial(self.lhs)

    @property
    def kernel_input_feature(self) -> int:
        return self.rhs.index("i")

    @property
    def kernel_output_feature(self) -> int:
        return self.rhs.index("o")

    @property
    def kernel_spatial(self) -> tuple[int, ...]:
        return self._spatial(self.rhs)

    @property
    def out_batch(self) -> int:
        return self.out.index("b")

    @property
    def out_feature(self) -> int:
        return self.out.index("f")

    @property
    def out_spatial(self) -> tuple[int, ...]:
        return self._spatial(self.out)


@dataclass(frozen=True)
class SliceDims:
    """`{[0:4], [2:8:2]}`: start, limit, stride per dim."""

    dims: tuple[tuple[int, int, int], ...]

    def __str__(self) -> str:
        parts = []
        for start, limit, stride in self.dims:
            parts.append(f"[{start}:{limit}:{stride}]" if stride != 1 else f"[{start}:{limit}]")
        return "{" + ", ".join(parts) + "}"


@dataclass(frozen=True)
class PaddingConfig:
    """`0_1_0x2_2_1`: low, high, interior padding per dim."""

    dims: tuple[tuple[int, int, int], ...]

    def __str__(self) -> str:
        return "x".join(f"{lo}_{hi}" + (f"_{it}" if it else "") for lo, hi, it in self.dims)


class KeyValues(dict[str, str]):
    """`{op_name="..." source_line=12}` or `{k="v", k2="v2"}`: values verbatim (quotes kept)."""

    def __init__(self, items: dict[str, str], text: str) -> None:
        super().__init__(items)
        self.text = text

    def __str__(self) -> str:
        return self.text


# -- decoders ---------------------------------------------------------------------------
_INT = re.compile(r"-?\d+")


def _int(text: str) -> int:
    t = text.strip()
    if not _INT.fullmatch(t):
        raise TextError(f"expected an integer, got {t!r}")
    return int(t)


def _bool(text: str) -> bool:
    t = text.strip()
    if t not in ("true", "false"):
        raise TextError(f"expected true or false, got {t!r}")
    return t == "true"


def _braced(text: str) -> str:
    t = text.strip()
    if not (t.startswith("{") and t.endswith("}")):
        raise TextError(f"expected a value in braces like {{1,2}}, got {t!r}")
    return t[1:-1]


def _int_list(text: str) -> IntList:
    inner = _braced(text)
    if not inner.strip():
        return IntList(())
    out = []
    offset = text.index("{") + 1
    for part in inner.split(","):
        p = part.strip()
        if not _INT.fullmatch(p):
            raise TextError(f"expected an integer in the list, got {p!r}", offset)
        out.append(int(p))
        offset += len(part) + 1
    return IntList(out)


_GROUP = re.compile(r"\{([^{}]*)\}")


def _int_list_list(text: str) -> IntListList:
    inner = _braced(text).strip()
    groups: list[IntList] = []
    pos = 0
    while pos < len(inner):
        m = _GROUP.match(inner, pos)
        if m is None:
            raise TextError(
                f"expected a group like {{0,1}}, got {inner[pos : pos + 16]!r}", pos + 1
            )
        groups.append(_int_list(m.group(0)))
        pos = m.end()
        while pos < len(inner) and inner[pos] in ", ":
            pos += 1
    return IntListList(groups)


_IOTA_GROUPS = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")


class IotaReplicaGroups(IntListList):
    """`[2,4]<=[8]` / `[2,4]<=[4,2]T(1,0)`: groups from a reshaped, transposed iota."""

    text: str

    def __str__(self) -> str:
        return self.text


_MESH_AXIS = re.compile(r"'([^']*)'=(\d+)")
_MESH_GROUPS = re.compile(r"mesh\[([^\]]*)\](?:\s*\{([^{}]*)\})?")


class MeshReplicaGroups(IntListList):
    """`mesh['a'=2,'b'=4] {'a'}`: one group per setting of the mesh axes not listed.

    When XLA also prints `device_ids=(...)`, that is a separate attribute to rhino's
    scanner; `rhino.hlo.analysis.replica_groups(inst)` combines the two.
    """

    text: str
    axes: tuple[tuple[str, int], ...]
    grouped: tuple[str, ...] | None

    def __str__(self) -> str:
        return self.text


def mesh_groups(
    axes: tuple[tuple[str, int], ...], grouped: tuple[str, ...], device_ids: list[int]
) -> list[list[int]]:
    """Groups of `device_ids` laid row-major on the mesh, varying along the `grouped` axes."""
    import numpy as np

    sizes = [n for _, n in axes]
    ids = np.asarray(device_ids).reshape(sizes)
    names = [a for a, _ in axes]
    inner = [names.index(a) for a in grouped]
    outer = [i for i in range(len(names)) if i not in inner]
    ids = ids.transpose(outer + inner).reshape(-1, int(np.prod([sizes[i] for i in inner] or [1])))
    return [list(map(int, row)) for row in ids]


def _replica_groups(text: str) -> IntListList:
    t = text.strip()
    if t.startswith("{"):
        return _int_list_list(t)
    if t.startswith("mesh["):
        m = _MESH_GROUPS.fullmatch(t)
        if m is None:
            raise TextError(f"expected replica groups like mesh['a'=2,'b'=4] {{'a'}}, got {t!r}")
        axes = tuple((a, int(n)) for a, n in _MESH_AXIS.findall(m.group(1)))
        grouped = tuple(re.findall(r"'([^']*)'", m.group(2))) if m.group(2) is not None else None
        n = 1
        for _, size in axes:
            n *= size
        groups = mesh_groups(axes, grouped, list(range(n))) if grouped is not None else []
        value = MeshReplicaGroups(IntList(g) for g in groups)
        value.text, value.axes, value.grouped = t, axes, grouped
        return value
    m = _IOTA_GROUPS.fullmatch(t)
    if m is None:
        raise TextError(
            f"expected replica groups like {{{{0,1}},{{2,3}}}} or [2,2]<=[4], got {t!r}"
        )
    import numpy as np

    shape = [int(x) for x in m.group(1).split(",")]
    reshape = [int(x) for x in m.group(2).split(",")]
    n = 1
    for d in reshape:
        n *= d
    if int(np.prod(shape)) != n:
        raise TextError(f"replica groups {t}: {shape} does not hold the {n} ids of {reshape}")
    ids = np.arange(n).reshape(reshape)
    if m.group(3):
        perm = [int(x) for x in m.group(3).split(",")]
        if sorted(perm) != list(range(len(reshape))):
            raise TextError(f"replica groups {t}: T({m.group(3)}) is not a permutation")
        ids = ids.transpose(perm)
    ids = ids.reshape(shape[0], -1) if len(shape) >= 1 else ids
    iota = IotaReplicaGroups(IntList(int(x) for x in row) for row in ids)
    iota.text = t
    return iota


def _window(text: str) -> Window:
    inner = _braced(text).strip()
    if not inner:
        return Window(())
    fields: dict[str, list[str]] = {}
    for item in inner.split():
        if "=" not in item:
            raise TextError(f"expected key=value, got {item!r}")
        k, v = item.split("=", 1)
        if k not in ("size", "stride", "pad", "lhs_dilate", "rhs_dilate", "rhs_reversal"):
            raise TextError(f"unknown field {k!r}")
        fields[k] = v.split("x")
    if "size" not in fields:
        raise TextError("missing size=")
    n = len(fields["size"])
    for k, parts in fields.items():
        if len(parts) != n:
            raise TextError(f"{k} has {len(parts)} dims, size has {n}")
    try:
        dims = []
        for i in range(n):
            pad = fields["pad"][i].split("_") if "pad" in fields else ["0", "0"]
            if len(pad) != 2:
                raise ValueError
            dims.append(
                WindowDim(
                    size=int(fields["size"][i]),
                    stride=int(fields["stride"][i]) if "stride" in fields else 1,
                    pad_low=int(pad[0]),
                    pad_high=int(pad[1]),
                    lhs_dilate=int(fields["lhs_dilate"][i]) if "lhs_dilate" in fields else 1,
                    rhs_dilate=int(fields["rhs_dilate"][i]) if "rhs_dilate" in fields else 1,
                    reversal=fields["rhs_reversal"][i] == "1"
                    if "rhs_reversal" in fields
                    else False,
                )
            )
    except ValueError:
        raise TextError(f"malformed numbers in {text.strip()!r}") from None
    return Window(tuple(dims))


_DIM_LABELS = re.compile(r"([b0-9f]+)_([io0-9]+)->([b0-9f]+)")


def _dim_labels(text: str) -> ConvDimLabels:
    t = text.strip()
    m = _DIM_LABELS.fullmatch(t)
    if m is None:
        raise TextError(f"expected convolution dim labels like b01f_01io->b01f, got {t!r}")
    lhs, rhs, out = m.groups()
    n = len(lhs)
    for part, needed in ((lhs, "bf"), (rhs, "io"), (out, "bf")):
        if len(part) != n or any(part.count(c) != 1 for c in needed):
            raise TextError(
                f"convolution dim labels {t!r}: each side needs {n} labels incl. {needed}"
            )
    return ConvDimLabels(lhs, rhs, out)


_SLICE_ITEM = re.compile(r"\s*\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(\d+)\s*)?\]\s*")


def _slice(text: str) -> SliceDims:
    inner = _braced(text)
    dims = []
    if inner.strip():
        for part in inner.split(","):
            m = _SLICE_ITEM.fullmatch(part)
            if m is None:
                raise TextError(f"expected a slice like [0:4] or [0:8:2], got {part.strip()!r}")
            dims.append((int(m.group(1)), int(m.group(2)), int(m.group(3) or 1)))
    return SliceDims(tuple(dims))


def _padding(text: str) -> PaddingConfig:
    t = text.strip()
    dims = []
    for part in t.split("x"):
        nums = part.split("_")
        if len(nums) not in (2, 3) or not all(_INT.fullmatch(x) for x in nums):
            raise TextError(f"expected padding like 0_1 or 0_1_2 per dim, got {part!r}")
        lo, hi = int(nums[0]), int(nums[1])
        dims.append((lo, hi, int(nums[2]) if len(nums) == 3 else 0))
    return PaddingConfig(tuple(dims))


_KV_KEY = re.compile(r"\s*([\w.\-]+)\s*=\s*")


def _key_values(text: str) -> KeyValues:
    """`{k="v" k2=3}` or `{k="v", k2={{0,1}}}`: values verbatim, nesting allowed."""
    inner = _braced(text)
    base = text.index("{") + 1
    items: dict[str, str] = {}
    pos = 0
    n = len(inner)
    while True:
        while pos < n and inner[pos] in " ,\t\n":
            pos += 1
        if pos >= n:
            return KeyValues(items, text)
        m = _KV_KEY.match(inner, pos)
        if m is None:
            raise TextError(
                f"expected key=value, got {inner[pos : pos + 20].strip()!r}", base + pos
            )
        end = _value_end(inner, m.end(), base)
        if end == m.end():
            raise TextError(f"expected a value for {m.group(1)}", base + end)
        items[m.group(1)] = inner[m.end() : end]
        pos = end


def _value_end(text: str, pos: int, base: int) -> int:
    """End of one value: a string, a balanced {...}, or a run up to space or comma."""
    if pos < len(text) and text[pos] == '"':
        m = re.compile(STRING_RE).match(text, pos)
        if m is None:
            raise TextError("unterminated string", base + pos)
        return m.end()
    depth = 0
    i = pos
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                raise TextError("unbalanced '}'", base + i)
        elif c == '"':
            m = re.compile(STRING_RE).match(text, i)
            if m is None:
                raise TextError("unterminated string", base + i)
            i = m.end()
            continue
        elif depth == 0 and c in " ,\t\n":
            break
        i += 1
    if depth:
        raise TextError("'{' is never closed", base + pos)
    return i


def _string(text: str) -> str:
    t = text.strip()
    if len(t) < 2 or not (t.startswith('"') and t.endswith('"')):
        raise TextError(f"expected a quoted string, got {t!r}")
    return t


_NAME = re.compile(r"%?[A-Za-z_][\w.\-]*")


def _name(text: str) -> str:
    t = text.strip()
    if not _NAME.fullmatch(t):
        raise TextError(f"expected a name, got {t!r}")
    return t.lstrip("%")


def _names(text: str) -> NameList:
    t = text.strip()
    if not t.startswith("{"):
        return NameList((_name(t),))
    inner = t[1:-1].strip()
    return NameList(tuple(_name(p) for p in inner.split(",")) if inner else ())


_ENUM = re.compile(r"[A-Za-z_][\w\-]*")


def _enum(text: str) -> str:
    t = text.strip()
    if not _ENUM.fullmatch(t):
        raise TextError(f"expected a keyword, got {t!r}")
    return t


class EnumList(tuple[str, ...]):
    """`{default,highest}`."""

    def __str__(self) -> str:
        return "{" + ",".join(self) + "}"


def _enum_list(text: str) -> EnumList:
    inner = _braced(text)
    return EnumList(_enum(p) for p in inner.split(",")) if inner.strip() else EnumList(())


def _sharding(text: str) -> Any:
    from rhino.hlo.sharding import parse_sharding

    return parse_sharding(text.strip())


def _raw(text: str) -> Raw:
    return Raw(text)


INT_LIST_KEYS = (
    "dimensions",
    "lhs_batch_dims",
    "rhs_batch_dims",
    "lhs_contracting_dims",
    "rhs_contracting_dims",
    "offset_dims",
    "collapsed_slice_dims",
    "start_index_map",
    "slice_sizes",
    "operand_batching_dims",
    "start_indices_batching_dims",
    "update_window_dims",
    "inserted_window_dims",
    "scatter_dims_to_operand_dims",
    "input_batching_dims",
    "scatter_indices_batching_dims",
    "dynamic_slice_sizes",
    "fft_length",
    "lhs_ragged_dims",
    "rhs_group_dims",
)
INT_KEYS = (
    "index",
    "iota_dimension",
    "index_vector_dim",
    "channel_id",
    "feature_group_count",
    "batch_group_count",
    "exponent_bits",
    "mantissa_bits",
    "k",
    "api_version_number",
)
BOOL_KEYS = (
    "is_stable",
    "indices_are_sorted",
    "unique_indices",
    "use_global_device_ids",
    "constrain_layout",
    "largest",
    "is_cross_program_prefetch",
    "is_host_transfer",
)
ENUM_KEYS = (
    "direction",
    "type",
    "kind",
    "fft_type",
    "distribution",
    "algorithm",
    "api_version",
    "padding_type",
    "triangular_solve_options",
    "mode",
    "rng_algorithm",
)

DECODERS: dict[str, Callable[[str], Any]] = {
    **{k: _int_list for k in INT_LIST_KEYS},
    **{k: _int for k in INT_KEYS},
    **{k: _bool for k in BOOL_KEYS},
    **{k: _enum for k in ENUM_KEYS},
    "replica_groups": _replica_groups,
    "source_target_pairs": _int_list_list,
    "window": _window,
    "dim_labels": _dim_labels,
    "slice": _slice,
    "padding": _padding,
    "metadata": _key_values,
    "frontend_attributes": _key_values,
    "sharding": _sharding,
    "custom_call_target": _string,
    "precision_config": _enum_list,
    "operand_precision": _enum_list,
    "to_apply": _name,
    "calls": _names,
    "body": _name,
    "condition": _name,
    "true_computation": _name,
    "false_computation": _name,
    "branch_computations": _names,
    "called_computations": _names,
    "select": _name,
    "scatter": _name,
    "control-predecessors": _names,
}


def format_attr(value: Any) -> str:
    """XLA's text for a decoded (or hand-made) attribute value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple) and not isinstance(
        value, IntList | IntListList | NameList | EnumList
    ):
        return "{" + ",".join(format_attr(v) for v in value) + "}"
    return str(value)


_SHAREABLE = frozenset(
    {_int_list, _int, _bool, _enum, _name, _names, _enum_list, _string, _int_list_list}
)
"""Decoders whose values are immutable (ints, strings, tuples), so that instructions
with the same attribute text may share one value."""

_decoded: dict[tuple[str, str], Any] = {}
"""(key, text) -> value, for the shareable decoders: a module repeats the same few
texts (`dimensions={0}`, `to_apply=%add`) thousands of times."""


def decode_attr(key: str, text: str) -> Any:
    """Decode attribute `key`'s text; unknown keys give `Raw(text)`."""
    value = _decoded.get((key, text))
    if value is not None:
        return value
    decoder = DECODERS.get(key, _raw)
    value = decoder(text)
    if decoder in _SHAREABLE and len(_decoded) < 100_000:
        _decoded[(key, text)] = value
    return value
