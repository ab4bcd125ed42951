"""Deterministic inputs for a module's entry parameters, made shard by shard.

Rhino §6.3 (distributed initialization): a large model's parameters never exist whole
on one host; each device creates its own shard. rhino does this with a counter-based
generator: the value of every element is a pure function of

    (seed, parameter number, the element's flat row-major index in the GLOBAL array)

namely SplitMix64 (Steele et al.; the generator behind Java's SplittableRandom) at
position `index` of a stream keyed by (seed, parameter). A shard is computed from the
global indices of its own elements only, so

    assemble(shard_input(..., where) for every shard) == global_input(...)

bit for bit, for any sharding, without materializing the global array; and the
single-device reference run and the sharded run see the same numbers.

From the 64-bit hash `h` of an element:
    floats   N(0, 1) * scale by Box-Muller on the two 32-bit halves of h (one normal per
             element; the cosine branch), computed in float64 and rounded to the dtype.
             `scale` defaults to 0.1: a training step's forward, backward and optimizer
             update stay in a tame range (no overflow in exp, no huge Adam steps).
             Parameters whose name matches `InputOptions.nonnegative` (default: Adam's
             second moment, `adam_v...` as the zoo names it) get |N(0,1)| * scale:
             `sqrt(v)` of a negative v is NaN, and NaN outputs verify nothing.
    complex  real and imaginary parts as two floats (the second from a second stream).
    integers uniform in [0, int_high), int_high = 4 by default (the high 32 bits of h
             mod int_high): small enough to be a valid index into any dimension of size
             >= 4 (token ids, labels, gather indices, a step counter), so index-like
             parameters stay in range; out-of-range gather/dynamic-slice indices would be
             clamped by XLA anyway, and still agree between the two runs.
    pred     the top bit of h.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rhino.hlo.errors import ConfigError, ExecutionError
from rhino.hlo.ir import Module
from rhino.hlo.opcode import Opcode
from rhino.runtime.xla_bridge import Index

_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_MASK = (1 << 64) - 1
_IMAG_STREAM = 0x5851F42D4C957F2D
"""Mixed into the key of the second stream (imaginary parts)."""


@dataclass(frozen=True)
class InputOptions:
    """How inputs are drawn (the seed is passed separately)."""

    scale: float = 0.1
    """Standard deviation of float inputs."""
    int_high: int = 4
    """Integers are drawn uniformly from [0, int_high)."""
    nonnegative: str = r"adam_v"
    """Regex (re.search) on the parameter name: floats drawn as |N(0,1)| * scale."""

    def __post_init__(self) -> None:
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ConfigError(f"input scale must be a positive number, got {self.scale}")
        if self.int_high < 1:
            raise ConfigError(f"int_high must be >= 1, got {self.int_high}")
        try:
            re.compile(self.nonnegative)
        except re.error as e:
            raise ConfigError(f"nonnegative: bad regex {self.nonnegative!r}: {e}") from None


DEFAULT_OPTIONS = InputOptions()


# -- the generator ---------------------------------------------------------------------


def _mix(z: Any) -> Any:
    """SplitMix64's finalizer, on numpy uint64 arrays (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


def _mix_int(z: int) -> int:
    z &= _MASK
    z = ((z ^ (z >> 30)) * _MIX1) & _MASK
    z = ((z ^ (z >> 27)) * _MIX2) & _MASK
    return z ^ (z >> 31)


def stream_key(seed: int, param: int, stream: int = 0) -> int:
    """The 64-bit key of parameter `param`'s stream under `seed`."""
    return _mix_int(_mix_int(_mix_int(seed) ^ (param * _GAMMA)) ^ stream)


def _hash(key: int, flat: np.ndarray) -> np.ndarray:
    """SplitMix64 output number `flat` (0-based) of the stream seeded with `key`."""
    with np.errstate(over="ignore"):
        z = np.uint64(key) + (flat + np.uint64(1)) * np.uint64(_GAMMA)
        return _mix(z)


def _flat_indices(shape: tuple[int, ...], where: Index) -> np.ndarray:
    """Global row-major flat indices of the elements of the box `where`, shaped like it."""
    flat = np.zeros((), dtype=np.uint64)
    stride = 1
    ranges = []
    for dim, sl in zip(reversed(shape), reversed(where), strict=True):
        ranges.append((np.arange(sl.start, sl.stop, dtype=np.uint64), stride))
        stride *= dim
    ranges.reverse()
    for axis, (r, st) in enumerate(ranges):
        view = [1] * len(ranges)
        view[axis] = len(r)
        flat = flat + (r * np.uint64(st)).reshape(view)
    return flat


def _normal(h: np.ndarray) -> np.ndarray:
    u1 = ((h >> np.uint64(32)).astype(np.float64) + 0.5) / 2.0**32  # (0, 1): log is finite
    u2 = (h & np.uint64(0xFFFFFFFF)).astype(np.float64) / 2.0**32
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


# -- public API ------------------------------------------------------------------------


def numpy_dtype(hlo_dtype: str) -> np.dtype[Any]:
    """The numpy dtype of an HLO element type ("f32", "bf16", "s32", "pred", ...)."""
    simple = {
        "pred": np.bool_,
        "s8": np.int8,
        "s16": np.int16,
        "s32": np.int32,
        "s64": np.int64,
        "u8": np.uint8,
        "u16": np.uint16,
        "u32": np.uint32,
        "u64": np.uint64,
        "f16": np.float16,
        "f32": np.float32,
        "f64": np.float64,
        "c64": np.complex64,
        "c128": np.complex128,
    }
    if hlo_dtype in simple:
        return np.dtype(simple[hlo_dtype])
    import ml_dtypes

    exotic = {
        "bf16": "bfloat16",
        "f8e4m3fn": "float8_e4m3fn",
        "f8e5m2": "float8_e5m2",
        "f8e4m3": "float8_e4m3",
        "f8e3m4": "float8_e3m4",
        "f8e4m3fnuz": "float8_e4m3fnuz",
        "f8e5m2fnuz": "float8_e5m2fnuz",
        "f8e4m3b11fnuz": "float8_e4m3b11fnuz",
        "s4": "int4",
        "u4": "uint4",
        "s2": "int2",
        "u2": "uint2",
    }
    if hlo_dtype in exotic and hasattr(ml_dtypes, exotic[hlo_dtype]):
        return np.dtype(getattr(ml_dtypes, exotic[hlo_dtype]))
    raise ExecutionError(f"rhino cannot make inputs of element type {hlo_dtype}")


def shard_input(
    shape: Sequence[int],
    dtype: Any,
    seed: int,
    param: int,
    where: Index,
    *,
    options: InputOptions = DEFAULT_OPTIONS,
    nonnegative: bool = False,
) -> np.ndarray:
    """The piece `where` of parameter `param`'s input, computed from its global indices.

    `where` holds one slice per dimension (step 1; open ends allowed, as jax passes
    `slice(None)` for a replicated dimension). Equal to `global_input(...)[where]`.
    """
    shape = tuple(int(d) for d in shape)
    dt = np.dtype(dtype)
    box = _normalize(shape, where)
    flat = _flat_indices(shape, box)
    key = stream_key(seed, param)
    h = _hash(key, flat)
    return np.asarray(_values(h, dt, seed, param, flat, options, nonnegative), dtype=dt)


def _values(
    h: np.ndarray,
    dt: np.dtype[Any],
    seed: int,
    param: int,
    flat: np.ndarray,
    options: InputOptions,
    nonnegative: bool,
) -> np.ndarray:
    """Element values from their hashes (a 0-d input may come back as a numpy scalar)."""
    if dt == np.bool_:
        return (h >> np.uint64(63)).astype(np.bool_)
    if np.issubdtype(dt, np.integer) or dt.name.startswith(("int", "uint")):
        return ((h >> np.uint64(32)) % np.uint64(options.int_high)).astype(dt)
    if np.issubdtype(dt, np.complexfloating):
        imag = _normal(_hash(stream_key(seed, param, _IMAG_STREAM), flat))
        return ((_normal(h) + 1j * imag) * options.scale).astype(dt)
    if np.issubdtype(dt, np.floating) or dt.name.startswith(("bfloat", "float")):
        values = _normal(h)
        if nonnegative:
            values = np.abs(values)
        return (values * options.scale).astype(dt)
    raise ExecutionError(f"rhino cannot make inputs of dtype {dt}")


def global_input(
    shape: Sequence[int],
    dtype: Any,
    seed: int,
    param: int,
    *,
    options: InputOptions = DEFAULT_OPTIONS,
    nonnegative: bool = False,
) -> np.ndarray:
    """Parameter `param`'s whole input (what the single-device run gets)."""
    everything = tuple(slice(0, int(d)) for d in shape)
    return shard_input(
        shape, dtype, seed, param, everything, options=options, nonnegative=nonnegative
    )


@dataclass(frozen=True)
class ShardMaker:
    """A `xla_bridge.ShardFn`: called with a shard's global index, returns its data."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    seed: int
    param: int
    options: InputOptions = DEFAULT_OPTIONS
    nonnegative: bool = False

    def __call__(self, where: Index) -> np.ndarray:
        return shard_input(
            self.shape,
            self.dtype,
            self.seed,
            self.param,
            where,
            options=self.options,
            nonnegative=self.nonnegative,
        )

    def whole(self) -> np.ndarray:
        """The global array (for the single-device reference run)."""
        return self(tuple(slice(0, d) for d in self.shape))


def entry_inputs(
    module: Module, seed: int, *, options: InputOptions = DEFAULT_OPTIONS
) -> list[ShardMaker]:
    """One `ShardMaker` per entry parameter of `module`, in parameter-number order.

    Pass them to `xla_bridge.execute` as they are (each device creates its own shard),
    or `.whole()` for global arrays. The stream of parameter p is keyed by its parameter
    NUMBER, so the original module and its annotated copy get the same inputs.
    Raises ExecutionError for a tuple-shaped parameter or an element type rhino cannot
    generate.
    """
    pattern = re.compile(options.nonnegative)
    makers = []
    for p in module.entry.parameters:
        if p.opcode is not Opcode.PARAMETER or p.parameter_number is None:
            continue
        if p.shape.is_tuple:
            raise ExecutionError(
                f"{module.name}: parameter {p.parameter_number} (%{p.name}) is a tuple "
                f"{p.shape}; rhino makes inputs only for array parameters"
            )
        makers.append(
            ShardMaker(
                shape=tuple(p.shape.dims),
                dtype=numpy_dtype(p.shape.dtype),
                seed=seed,
                param=p.parameter_number,
                options=options,
                nonnegative=bool(pattern.search(p.name)),
            )
        )
    return makers


def _normalize(shape: tuple[int, ...], where: Index) -> Index:
    if len(where) != len(shape):
        raise ExecutionError(f"shard index {where} has {len(where)} dims, shape {shape}")
    box = []
    for dim, sl in zip(shape, where, strict=True):
        start, stop, step = sl.indices(dim)
        if step != 1:
            raise ExecutionError(f"shard index {where}: strided slices are not shards")
        box.append(slice(start, max(start, stop)))
    return tuple(box)
