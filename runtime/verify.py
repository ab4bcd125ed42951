"""Does the sharded program compute what the single-device program computes?

`run_and_compare` compiles the original HLO for one device and the annotated HLO for N
SPMD partitions, feeds both the same deterministic inputs (`rhino.runtime.inputs`; the
sharded run creates each device's shard directly, Rhino §6.3), and compares every
output.

Tolerance policy (per output, elementwise over the whole output):

    pass  iff  max |got - want|  <=  atol + rtol * max |want|

with (rtol, atol) by element type:

    f64 1e-9, 1e-12    f32 1e-4, 1e-5    f16 5e-3, 1e-4    bf16 4e-2, 1e-3
    f8* 0.25, 1e-2     integers and pred: exact

The error is measured against the output's largest magnitude, not elementwise: the
sharded program sums the same products in another order (partial sums per device, then
an all-reduce), and a training step's outputs (gradients, Adam updates, the loss) are
sums over many terms, so the rounding error of an element scales with the size of the
terms, which the output's largest magnitude stands for; an element close to zero
through cancellation can have a large relative error and still be right. A wrong plan
(a missing all-reduce, a shard read at the wrong offset) changes outputs by amounts of
the order of the values themselves, orders of magnitude above these bounds. rtol = 1e-4
for f32 is ~1000 ulp: room for reductions over ~1e6 terms.
NaN and infinities must appear at the same places with the same sign in both outputs
(they count as equal there); an output whose expected value is all NaN or inf compares
only those places. `max_rel_error` is reported as max |got - want| / max |want|.

Long reductions: summing n terms in another order moves the result by up to about n * u
times the terms' magnitude (u the unit roundoff: 2**-24 for f32), which the output's
largest magnitude stands for. An output's rtol is therefore raised to n * u, n the
longest reduction it depends on (`reduction_lengths`: the contracted size of a dot, a
convolution's window times its input features, the reduced size of a reduce), capped at
`MAX_DERIVED_RTOL`: a convolution's weight gradient over 8 images of 32x32 sums 8192
terms, 4.9e-4 for f32. A wrong plan still errs by the size of the values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rhino.hlo.errors import ExecutionError, VerificationFailed
from rhino.hlo.ir import Computation, Instruction, Module
from rhino.hlo.opcode import Opcode
from rhino.hlo.parser import parse_module
from rhino.runtime import xla_bridge as xb
from rhino.runtime.inputs import DEFAULT_OPTIONS, InputOptions, ShardMaker, entry_inputs


@dataclass(frozen=True)
class Tolerance:
    """Allowed error of one output: atol + rtol * max |expected|."""

    rtol: float
    atol: float


EXACT = Tolerance(0.0, 0.0)

DEFAULT_TOLERANCES: Mapping[str, Tolerance] = {
    "float64": Tolerance(1e-9, 1e-12),
    "float32": Tolerance(1e-4, 1e-5),
    "float16": Tolerance(5e-3, 1e-4),
    "bfloat16": Tolerance(4e-2, 1e-3),
    "complex128": Tolerance(1e-9, 1e-12),
    "complex64": Tolerance(1e-4, 1e-5),
}
"""Per numpy dtype name; float8 types use `FLOAT8_TOLERANCE`, integers and bool EXACT."""

FLOAT8_TOLERANCE = Tolerance(0.25, 1e-2)

MAX_DERIVED_RTOL = 1e-2
"""The most a long reduction raises an output's rtol to: a wrong plan (a missing sum, a
shard at the wrong offset) moves outputs by tens of percent."""


def tolerance_for(
    dtype: Any, table: Mapping[str, Tolerance] = DEFAULT_TOLERANCES, reduction: int = 1
) -> Tolerance:
    """The tolerance of an output of numpy dtype `dtype` that depends on sums of up to
    `reduction` terms (module docstring)."""
    name = np.dtype(dtype).name
    if name in table:
        base = table[name]
    elif name.startswith("float8"):
        base = FLOAT8_TOLERANCE
    else:
        return EXACT
    import ml_dtypes

    roundoff = float(ml_dtypes.finfo(dtype).eps) / 2
    derived = min(MAX_DERIVED_RTOL, reduction * roundoff)
    return Tolerance(max(base.rtol, derived), base.atol) if derived > base.rtol else base


def reduction_lengths(module: Module) -> tuple[int, ...]:
    """Per output of `module` (the ROOT's leaves, nested tuples flattened): the most terms
    one element of anything it depends on sums (module docstring); loops and calls count
    every reduction inside them."""
    longest: dict[int, int] = {}
    inner: dict[str, int] = {}

    def within(comp: Computation) -> int:
        if comp.name not in inner:
            inner[comp.name] = 1  # recursion guard
            inner[comp.name] = max((_terms(i, within) for i in comp.instructions), default=1)
        return inner[comp.name]

    entry = module.entry
    for inst in entry.instructions:
        own = _terms(inst, within)
        longest[id(inst)] = max([own, *(longest.get(id(op), 1) for op in inst.operands)])
    root = entry.root
    if root is None:
        return ()
    return tuple(_leaf_lengths(root, longest))


def _terms(inst: Instruction, within: Callable[[Computation], int]) -> int:
    """Terms one element of `inst` sums, and the most any computation it calls sums."""
    called = max((within(c) for c in inst.called), default=1)
    op = inst.opcode
    own = 1
    if op is Opcode.DOT:
        dims = inst.operands[0].shape.dims
        own = math.prod(dims[d] for d in inst.attr("lhs_contracting_dims", ()))
    elif op is Opcode.CONVOLUTION:
        kernel = inst.operands[1].shape.dims
        out_feature = inst.attr("dim_labels").rhs.index("o")
        own = math.prod(kernel) // max(1, kernel[out_feature])
    elif op in (Opcode.REDUCE, Opcode.REDUCE_WINDOW):
        dims = inst.operands[0].shape.dims
        if op is Opcode.REDUCE:
            own = math.prod(dims[d] for d in inst.attr("dimensions", ()))
        else:
            own = math.prod(w.size for w in inst.attr("window").dims)
    return max(own, called)


def _leaf_lengths(inst: Instruction, longest: dict[int, int]) -> list[int]:
    if inst.opcode is Opcode.TUPLE:
        return [n for op in inst.operands for n in _leaf_lengths(op, longest)]
    return [longest[id(inst)]] * max(1, len(inst.shape.leaves()))


@dataclass(frozen=True)
class OutputCheck:
    """The comparison of one output (a leaf of the ROOT tuple)."""

    index: int
    """Position among the flattened outputs."""
    shape: tuple[int, ...]
    dtype: str
    """numpy dtype name."""
    max_abs_error: float
    """max |got - want| over the elements finite in both (0 for an empty output)."""
    max_rel_error: float
    """max_abs_error / max |want| (0 when want is all zeros and so is the error)."""
    scale: float
    """max |want| over its finite elements."""
    allowed: float
    """atol + rtol * scale: the largest max_abs_error that passes."""
    mismatched_specials: int
    """Elements that are NaN or inf in one output but not equally so in the other."""
    nonfinite_expected: int
    """NaN or inf elements of the expected output (compared only by position: many
    of them make a weak check, e.g. sqrt of a negative Adam second moment)."""
    ok: bool

    def describe(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH"
        text = (
            f"output {self.index} {self.dtype}{list(self.shape)}: {verdict}, "
            f"max abs err {self.max_abs_error:.3g} (allowed {self.allowed:.3g}), "
            f"max rel err {self.max_rel_error:.3g}"
        )
        if self.mismatched_specials:
            text += f", {self.mismatched_specials} NaN/inf mismatches"
        if self.nonfinite_expected:
            text += f", {self.nonfinite_expected} NaN/inf expected"
        return text

    def to_json(self) -> dict[str, Any]:
        """Its place, verdict and largest errors (as `rhino run --json` reports them)."""
        return {
            "index": self.index,
            "ok": self.ok,
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error,
        }


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of running a plan and the single-device program on the same inputs."""

    outputs: tuple[OutputCheck, ...]
    num_partitions: int
    seed: int
    reference: xb.Compiled | None = field(default=None, repr=False, compare=False)
    """The single-device executable (for timing), when run_and_compare compiled it."""
    sharded: xb.Compiled | None = field(default=None, repr=False, compare=False)
    """The SPMD executable (for fidelity: `partitioned_hlo()`, memory stats)."""

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def failures(self) -> tuple[OutputCheck, ...]:
        return tuple(o for o in self.outputs if not o.ok)

    def summary(self) -> str:
        bad = self.failures
        head = (
            f"{len(self.outputs) - len(bad)}/{len(self.outputs)} outputs match the "
            f"single-device run on {self.num_partitions} partitions (seed {self.seed})"
        )
        return "\n  ".join([head, *(o.describe() for o in bad)])

    def to_json(self) -> dict[str, Any]:
        """ok, the summary, and per output its largest errors (`rhino run --json`)."""
        return {
            "ok": self.ok,
            "summary": self.summary(),
            "outputs": [o.to_json() for o in self.outputs],
        }

    def raise_if_failed(self) -> None:
        """Raise `VerificationFailed` (exit code 1) naming every mismatched output."""
        if not self.ok:
            raise VerificationFailed(self.summary())


def compare_output(
    index: int, want: np.ndarray, got: np.ndarray, tolerance: Tolerance
) -> OutputCheck:
    """Check one output against its expected value (see the module docstring)."""
    if want.shape != got.shape or want.dtype != got.dtype:
        raise ExecutionError(
            f"output {index}: the sharded run gave {got.dtype}{list(got.shape)}, the "
            f"single-device run {want.dtype}{list(want.shape)}"
        )
    if not _is_inexact(want.dtype):
        return _compare_exact(index, want, got)
    w = want.astype(np.complex128 if np.iscomplexobj(want) else np.float64)
    g = got.astype(w.dtype)
    special = ~np.isfinite(w) | ~np.isfinite(g)
    same_special = (np.isnan(w) & np.isnan(g)) | (np.isinf(w) & (w == g))
    mismatched = int(np.count_nonzero(special & ~same_special))
    finite = ~special
    if np.any(finite):
        scale = float(np.max(np.abs(w[finite])))
        err = float(np.max(np.abs(g[finite] - w[finite])))
    else:
        scale = err = 0.0
    allowed = tolerance.atol + tolerance.rtol * scale
    rel = err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))
    return OutputCheck(
        index=index,
        shape=tuple(want.shape),
        dtype=want.dtype.name,
        max_abs_error=err,
        max_rel_error=rel,
        scale=scale,
        allowed=allowed,
        mismatched_specials=mismatched,
        nonfinite_expected=int(np.count_nonzero(~np.isfinite(w))),
        ok=mismatched == 0 and err <= allowed,
    )


def compare_outputs(
    want: Sequence[np.ndarray],
    got: Sequence[np.ndarray],
    *,
    tolerances: Mapping[str, Tolerance] = DEFAULT_TOLERANCES,
) -> tuple[OutputCheck, ...]:
    """Check every output; the two runs must have the same number of outputs."""
    if len(want) != len(got):
        raise ExecutionError(
            f"the sharded run has {len(got)} outputs, the single-device run {len(want)}"
        )
    return tuple(
        compare_output(i, w, g, tolerance_for(w.dtype, tolerances))
        for i, (w, g) in enumerate(zip(want, got, strict=True))
    )


def run_and_compare(
    original_text: str,
    annotated_text: str,
    devices: Sequence[Any] | int,
    seed: int,
    *,
    options: InputOptions = DEFAULT_OPTIONS,
    tolerances: Mapping[str, Tolerance] = DEFAULT_TOLERANCES,
) -> VerifyReport:
    """Run `original_text` on one device and `annotated_text` on `devices` (SPMD, one
    partition per device; an int N means the first N local devices of jax's default
    platform), on the same inputs drawn from `seed`, and compare every output.

    The reference runs on devices[0] with global arrays; the sharded run creates each
    device's shard from the seed without the global array. Raises `ExecutionError`
    (from the bridge) when either program fails to compile or run, or when the two
    programs' parameters or outputs differ in number, shape or dtype.
    """
    devs = xb.local_devices(None, devices) if isinstance(devices, int) else tuple(devices)
    reference = xb.compile_reference(original_text, devs[0])
    sharded = xb.compile_spmd(annotated_text, devs, num_partitions=len(devs))
    original = parse_module(original_text, "<original>")
    makers = entry_inputs(original, seed, options=options)
    return verify_shards(
        reference, sharded, makers, seed, tolerances=tolerances, lengths=reduction_lengths(original)
    )


def _is_inexact(dtype: np.dtype[Any]) -> bool:
    if dtype == np.bool_ or np.issubdtype(dtype, np.integer):
        return False
    return not dtype.name.startswith(("int", "uint"))  # ml_dtypes int4 etc.


def _compare_exact(index: int, want: np.ndarray, got: np.ndarray) -> OutputCheck:
    """Integers and pred: every element equal. Errors are reported in float64 (which
    may round for int64 beyond 2**53; the verdict does not depend on it)."""
    equal = bool(np.array_equal(want, got))
    w = want.astype(np.float64)
    g = got.astype(np.float64)
    scale = float(np.max(np.abs(w))) if w.size else 0.0
    err = float(np.max(np.abs(g - w))) if w.size else 0.0
    if not equal and err == 0.0:
        err = float("nan")  # differs only beyond float64's precision
    rel = err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))
    return OutputCheck(
        index=index,
        shape=tuple(want.shape),
        dtype=want.dtype.name,
        max_abs_error=err,
        max_rel_error=rel,
        scale=scale,
        allowed=0.0,
        mismatched_specials=0,
        nonfinite_expected=0,
        ok=equal,
    )


def verify_shards(
    reference: xb.Compiled,
    sharded: xb.Compiled,
    inputs: Sequence[ShardMaker],
    seed: int,
    *,
    tolerances: Mapping[str, Tolerance] = DEFAULT_TOLERANCES,
    lengths: Sequence[int] | None = None,
) -> VerifyReport:
    """Run `reference` (one device, global inputs) and `sharded` (this process's
    partitions, each creating its own input shards) on `inputs`, and compare every output
    shard this process holds with the same piece of the reference output. `lengths`: per
    output, the longest reduction it depends on (`reduction_lengths`), which widens its
    tolerance.

    Replicated copies are all checked. The tolerance of an output is the one
    `rhino.runtime.verify` gives its whole expected value, so one process alone and a job
    of several reach the same verdict. Raises `ExecutionError` when the two programs'
    parameters differ or do not match `inputs`.
    """
    want_params = [(p.shape, p.dtype) for p in reference.parameters]
    got_params = [(p.shape, p.dtype) for p in sharded.parameters]
    made = [(m.shape, m.dtype) for m in inputs]
    if not want_params == got_params == made:
        raise ExecutionError(
            f"{sharded.name}: parameters differ: single-device program {want_params}, "
            f"sharded program {got_params}, inputs made {made}"
        )
    want = xb.execute(reference, [m.whole() for m in inputs])
    got = xb.execute_shards(sharded, list(inputs))
    terms = list(lengths) if lengths is not None and len(lengths) == len(want) else [1] * len(want)
    checks = tuple(
        check_shards(k, w, shards, tolerance_for(w.dtype, tolerances, terms[k]))
        for k, (w, shards) in enumerate(zip(want, got, strict=True))
    )
    return VerifyReport(checks, sharded.num_partitions, seed, reference=reference, sharded=sharded)


def check_shards(
    index: int, want: np.ndarray, shards: Sequence[xb.Shard], tolerance: Tolerance
) -> OutputCheck:
    """`compare_output` of output `index` over the pieces this process holds: errors
    are the worst over the shards, scale and allowance those of the whole output."""
    whole = compare_output(index, want, want, tolerance)
    pieces = [compare_output(index, want[s.index], s.data, tolerance) for s in shards]
    err = max((p.max_abs_error for p in pieces), default=0.0)
    if any(np.isnan(p.max_abs_error) for p in pieces):  # integers differing beyond 2**53
        err = float("nan")
    mismatched = sum(p.mismatched_specials for p in pieces)
    if whole.scale > 0:
        rel = err / whole.scale
    else:
        rel = 0.0 if err == 0 else float("inf")
    return OutputCheck(
        index=index,
        shape=whole.shape,
        dtype=whole.dtype,
        max_abs_error=err,
        max_rel_error=rel,
        scale=whole.scale,
        allowed=whole.allowed,
        mismatched_specials=mismatched,
        nonfinite_expected=whole.nonfinite_expected,
        ok=mismatched == 0 and err <= whole.allowed,
    )
