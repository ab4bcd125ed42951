"""Sharded runs against the single-device run: inputs made shard by shard, tolerances,
and whole training steps (examples/) under hand-written plans on 8 simulated devices."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from rhino.hlo.errors import ExecutionError, VerificationFailed
from rhino.hlo.ir import Computation, Module
from rhino.hlo.opcode import Opcode
from rhino.hlo.parser import parse_file
from rhino.hlo.printer import print_module
from rhino.hlo.sharding import HloSharding, parse_sharding
from rhino.runtime import xla_bridge as xb
from rhino.runtime.inputs import (
    InputOptions,
    ShardMaker,
    entry_inputs,
    global_input,
    shard_input,
)
from rhino.runtime.spmd.annotate import annotated_text
from rhino.runtime.verify import (
    DEFAULT_TOLERANCES,
    compare_output,
    compare_outputs,
    run_and_compare,
    tolerance_for,
)
from rhino.search.mesh import DeviceMesh, parse_mesh
from rhino.search.spmd.spec import parse_spec
from tests.hlo.corpus import ROOT

R = HloSharding.replicated()


# -- inputs ------------------------------------------------------------------------------


def spec_boxes(spec: str, shape: tuple[int, ...], mesh: DeviceMesh) -> list[tuple[slice, ...]]:
    """Each device's box of a maximal-stride spec, from search/spmd/spec.py's device_slices."""
    boxes = []
    for per_dim in parse_spec(spec, mesh.ndim).device_slices(shape, mesh):
        boxes.append(tuple(slice(ix[0], ix[-1] + 1) for ix in per_dim))
    return boxes


@pytest.mark.parametrize(
    ("shape", "mesh", "spec"),
    [
        ((16, 6), "8", "S0"),
        ((6, 16), "8", "S1"),
        ((8, 12), "2x4", "S0S1"),
        ((8, 12), "2x4", "S1S0"),
        ((4, 6, 8), "2x4", "RS2"),
        ((16,), "2x4", "S0S0"),
        ((4, 4), "2x4", "RR"),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_, ml_dtypes.bfloat16])
def test_shards_assemble_to_the_global_input(
    shape: tuple[int, ...], mesh: str, spec: str, dtype: type
) -> None:
    want = global_input(shape, dtype, 7, 3)
    got = np.zeros_like(want)
    for box in spec_boxes(spec, shape, parse_mesh(mesh)):
        piece = shard_input(shape, dtype, 7, 3, box)
        assert piece.dtype == want.dtype and piece.shape == want[box].shape
        got[box] = piece
    np.testing.assert_array_equal(got, want)


def test_inputs_are_deterministic_and_keyed_by_seed_and_parameter() -> None:
    a = global_input((32, 8), np.float32, 0, 0)
    np.testing.assert_array_equal(a, global_input((32, 8), np.float32, 0, 0))
    assert not np.array_equal(a, global_input((32, 8), np.float32, 1, 0))
    assert not np.array_equal(a, global_input((32, 8), np.float32, 0, 1))
    # an element's value depends on its global index only, not on the shard around it
    assert (
        global_input((32, 8), np.float32, 0, 0)[5, 3]
        == shard_input((32, 8), np.float32, 0, 0, (slice(5, 6), slice(3, 4)))[0, 0]
    )


def test_input_distributions() -> None:
    x = global_input((256, 256), np.float32, 0, 0)
    assert abs(float(x.mean())) < 0.005 and abs(float(x.std()) - 0.1) < 0.005
    wide = global_input((256, 256), np.float32, 0, 0, options=InputOptions(scale=2.0))
    assert abs(float(wide.std()) - 2.0) < 0.1
    assert float(global_input((64, 64), np.float32, 0, 0, nonnegative=True).min()) >= 0
    ints = global_input((4096,), np.int32, 0, 0)
    assert sorted(np.unique(ints).tolist()) == [0, 1, 2, 3]
    assert set(global_input((64,), np.int32, 0, 0, options=InputOptions(int_high=2))) == {0, 1}
    assert set(global_input((64,), np.bool_, 0, 0).tolist()) == {False, True}
    scalar = global_input((), np.int32, 0, 12)
    assert isinstance(scalar, np.ndarray) and scalar.shape == ()


def test_entry_inputs_follow_the_parameters() -> None:
    module = parse_file(ROOT / "examples" / "mlp.hlo")
    makers = entry_inputs(module, 0)
    params = module.entry.parameters
    assert [m.param for m in makers] == list(range(len(params)))
    assert [m.shape for m in makers] == [tuple(p.shape.dims) for p in params]
    assert [m.nonnegative for m in makers] == [p.name.startswith("adam_v") for p in params]
    assert makers[12].dtype == np.int32 and makers[0].dtype == np.float32


def test_shard_functions_through_the_bridge() -> None:
    """The bridge calls a ShardMaker once per device with that device's index; the
    program returns its parameter, so the assembled output is the global input."""
    text = """\
HloModule identity

ENTRY main {
  p = f32[8,12] parameter(0), sharding={devices=[2,4]<=[8]}
  ROOT c = f32[8,12] copy(p), sharding={devices=[2,4]<=[8]}
}
"""
    compiled = xb.compile_spmd(text, xb.local_devices("cpu", 8), num_partitions=8)
    maker = ShardMaker((8, 12), np.dtype(np.float32), seed=3, param=0)
    (out,) = xb.execute(compiled, [maker])
    np.testing.assert_array_equal(out, maker.whole())


# -- comparing ---------------------------------------------------------------------------


def test_tolerance_is_relative_to_the_largest_expected_magnitude() -> None:
    want = np.array([100.0, 1e-3, -50.0], dtype=np.float32)
    near = want + np.array([0, 5e-3, 0], dtype=np.float32)  # 5e-5 of max |want|
    far = want + np.array([0, 2e-2, 0], dtype=np.float32)  # 2e-4 of max |want|
    assert compare_output(0, want, near, tolerance_for(np.float32)).ok
    check = compare_output(0, want, far, tolerance_for(np.float32))
    assert not check.ok and check.max_abs_error == pytest.approx(2e-2, rel=1e-3)
    assert check.max_rel_error == pytest.approx(2e-4, rel=1e-3)
    assert "MISMATCH" in check.describe()


def test_specials_and_exact_types() -> None:
    nan = np.array([np.nan, 1.0, np.inf], dtype=np.float32)
    assert compare_output(0, nan, nan.copy(), tolerance_for(np.float32)).ok
    flipped = np.array([1.0, 1.0, np.inf], dtype=np.float32)
    assert compare_output(0, nan, flipped, tolerance_for(np.float32)).mismatched_specials == 1
    neg = np.array([np.nan, 1.0, -np.inf], dtype=np.float32)
    assert not compare_output(0, nan, neg, tolerance_for(np.float32)).ok
    ints = np.array([1, 2, 3], dtype=np.int32)
    assert compare_output(0, ints, ints.copy(), tolerance_for(np.int32)).ok
    assert not compare_output(0, ints, ints + np.int32(1), tolerance_for(np.int32)).ok
    bf = np.array([1.0, 2.0], dtype=ml_dtypes.bfloat16)
    assert tolerance_for(bf.dtype) == DEFAULT_TOLERANCES["bfloat16"]
    assert compare_output(
        0, bf, (bf.astype(np.float32) * 1.01).astype(bf.dtype), tolerance_for(bf.dtype)
    ).ok
    with pytest.raises(ExecutionError, match="output 0"):
        compare_output(0, ints, ints.astype(np.int64), tolerance_for(np.int32))
    with pytest.raises(ExecutionError, match="2 outputs"):
        compare_outputs([ints], [ints, ints])


# -- whole training steps ----------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp() -> Module:
    return parse_file(ROOT / "examples" / "mlp.hlo")


@pytest.fixture(scope="module")
def devices() -> tuple[object, ...]:
    return xb.local_devices("cpu", 8)


def data_parallel_plan(module: Module) -> dict[str, HloSharding]:
    """Batch dim of the data inputs split over all 8 devices; weights replicated."""
    split = parse_sharding("{devices=[8,1]<=[8]}")
    return {p.name: split for p in module.entry.parameters if p.name.startswith("batch")}


def megatron_plan(module: Module) -> dict[str, HloSharding]:
    """Mesh 2x4: batch over axis 0, W1 (and b1, its Adam moments, its update)
    column-split and W2 (same) row-split over axis 1, as Megatron-LM does."""
    mesh = parse_mesh("2x4")
    specs = {
        "batch__x__.1": "S0R",
        "batch__y__.1": "S0R",
        "dot_general.5": "S0S1",  # h = x @ W1: batch x columns
        "params_0___w__.1": "RS1",
        "adam_m_0___w__.1": "RS1",
        "adam_v_0___w__.1": "RS1",
        "sub.11": "RS1",  # the updated W1 and its moments
        "add.37": "RS1",
        "add.41": "RS1",
        "params_0___b__.1": "RS0",
        "adam_m_0___b__.1": "RS0",
        "adam_v_0___b__.1": "RS0",
        "params_1___w__.1": "RS0",
        "adam_m_1___w__.1": "RS0",
        "adam_v_1___w__.1": "RS0",
        "sub.13": "RS0",
        "add.39": "RS0",
        "add.43": "RS0",
    }
    return {
        name: parse_spec(spec, 2).to_hlo_sharding(mesh, module.entry[name].shape.rank)
        for name, spec in specs.items()
    }


def test_data_parallel_mlp_step_matches(mlp: Module, devices: tuple[object, ...]) -> None:
    text = annotated_text(mlp, data_parallel_plan(mlp), strip_metadata=True)
    xb.xla_parse(text)
    report = run_and_compare(print_module(mlp), text, devices, seed=0)
    assert report.ok, report.summary()
    assert len(report.outputs) == 14 and report.num_partitions == 8
    assert report.sharded is not None
    assert report.sharded.parameters[13].sharding == "{devices=[8,1]<=[8]}"  # batch x
    assert report.sharded.parameters[1].sharding == "{replicated}"
    assert " all-reduce(" in report.sharded.partitioned_hlo()  # the gradient sum
    report.raise_if_failed()


@pytest.fixture(scope="module")
def megatron_report(mlp: Module, devices: tuple[object, ...]):
    text = annotated_text(mlp, megatron_plan(mlp), strip_metadata=True)
    xb.xla_parse(text)
    return run_and_compare(print_module(mlp), text, devices, seed=1)


def test_megatron_mlp_step_matches(megatron_report) -> None:
    report = megatron_report
    assert report.ok, report.summary()
    params = report.sharded.parameters
    assert params[1].sharding == "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert params[1].shard_shape == (64, 16)  # W1: a quarter of the columns
    assert params[3].shard_shape == (16, 16)  # W2: a quarter of the rows
    assert params[13].shard_shape == (4, 64)  # x: half the batch
    assert report.sharded.outputs[2].shard_shape == (64, 16)  # the new W1 stays split


def test_a_perturbed_input_fails_verification(megatron_report, mlp: Module) -> None:
    makers = entry_inputs(mlp, seed=1)
    want = xb.execute(megatron_report.reference, [m.whole() for m in makers])
    inputs: list[object] = list(makers)
    x = makers[13].whole()
    x[3, 7] += 1.0  # one element of the batch (10 standard deviations)
    inputs[13] = x
    got = xb.execute(megatron_report.sharded, inputs)
    checks = compare_outputs(want, got)
    assert not all(c.ok for c in checks)
    assert checks[13].ok  # the step counter does not depend on x


def test_a_different_seed_fails_verification(megatron_report, mlp: Module) -> None:
    from rhino.runtime.verify import VerifyReport

    want = xb.execute(megatron_report.reference, [m.whole() for m in entry_inputs(mlp, 1)])
    got = xb.execute(megatron_report.sharded, list(entry_inputs(mlp, 2)))
    report = VerifyReport(compare_outputs(want, got), 8, 1)
    assert not report.ok
    with pytest.raises(VerificationFailed, match=r"outputs match .*\n  output 0 ") as info:
        report.raise_if_failed()
    assert info.value.exit_code == 1


def test_compile_failures_are_execution_errors(mlp: Module, devices: tuple[object, ...]) -> None:
    # b1 (f32[64]) split 8 ways is fine; f32[16] b2 split over 32 tiles is not a valid plan
    bad = {"params_1___b__.1": parse_sharding("{devices=[32]<=[32]}")}
    with pytest.raises(ExecutionError):
        run_and_compare(print_module(mlp), annotated_text(mlp, bad), devices, seed=0)


# -- a scan: the entry holds while loops -------------------------------------------------


def loop_computations(module: Module) -> list[Computation]:
    """Computations reached from while bodies and conditions (and what they call)."""
    seen: dict[str, Computation] = {}
    stack = [c for i in module.entry if i.opcode is Opcode.WHILE for c in i.called]
    while stack:
        comp = stack.pop()
        if comp.name not in seen:
            seen[comp.name] = comp
            stack.extend(c for i in comp for c in i.called)
    return list(seen.values())


def test_scan_with_replicated_loops_matches(devices: tuple[object, ...]) -> None:
    module = parse_file(ROOT / "examples" / "gpt_scan_tiny.hlo")
    split = parse_sharding("{devices=[8,1]<=[8]}")
    plan = {p.name: split for p in module.entry.parameters if p.name.startswith("batch")}
    inside = [i for c in loop_computations(module) for i in c]
    assert len(inside) > 100
    plan.update({i.name: R for i in inside})
    text = annotated_text(module, plan, strip_metadata=True)
    report = run_and_compare(print_module(module), text, devices, seed=0)
    assert report.ok, report.summary()
    # the batch inputs really are split, and nothing came out NaN (Adam's v is >= 0)
    assert report.sharded is not None
    shards = [p.shard_shape for p in report.sharded.parameters[-2:]]
    assert shards == [(1, 64), (1, 64)]
    assert all(c.nonfinite_expected == 0 for c in report.outputs)


# -- long reductions: the tolerance follows the number of terms summed ------------------

LONG_SUM = """HloModule long_sum

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  x = f32[8,16384]{1,0} parameter(0)
  w = f32[16384,4]{1,0} parameter(1)
  d = f32[8,4]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  c = f32[] constant(0)
  r = f32[8]{0} reduce(d, c), dimensions={1}, to_apply=add
  n = s32[] constant(3)
  ROOT t = (f32[8,4]{1,0}, f32[8]{0}, s32[]) tuple(d, r, n)
}
"""


def test_reduction_lengths_count_the_longest_sum_behind_each_output() -> None:
    from rhino.hlo.parser import parse_module
    from rhino.runtime.verify import reduction_lengths

    module = parse_module(LONG_SUM, "<long>")
    assert reduction_lengths(module) == (16384, 16384, 1)
    conv = parse_file(ROOT / "examples" / "vgg19_tiny.hlo")
    assert max(reduction_lengths(conv)) >= 9 * 64  # a 3x3 window over 64 features at least


def test_a_long_reduction_widens_the_tolerance_of_its_outputs_only() -> None:
    f32 = np.dtype(np.float32)
    assert tolerance_for(f32) == DEFAULT_TOLERANCES["float32"]
    assert tolerance_for(f32, reduction=16384).rtol == pytest.approx(16384 * 2.0**-24)
    assert tolerance_for(f32, reduction=10**9).rtol == 1e-2  # capped: wrong plans still fail
    assert tolerance_for(np.dtype(np.int32), reduction=16384).rtol == 0  # integers stay exact
    bf16 = np.dtype(ml_dtypes.bfloat16)
    assert tolerance_for(bf16, reduction=16384) == DEFAULT_TOLERANCES["bfloat16"]


@pytest.fixture(scope="module")
def long_sum_split() -> str:
    """LONG_SUM with the 16384-term contraction split 8 ways: partial sums, all-reduced."""
    from rhino.hlo.parser import parse_module

    module = parse_module(LONG_SUM, "<long>")
    plan = {
        "x": parse_sharding("{devices=[1,8]<=[8]}"),
        "w": parse_sharding("{devices=[8,1]<=[8]}"),
    }
    return annotated_text(module, plan, strip_metadata=True)


def test_a_correct_plan_on_a_long_reduction_verifies(
    long_sum_split: str, devices: tuple[object, ...]
) -> None:
    report = run_and_compare(LONG_SUM, long_sum_split, devices, seed=0)
    assert report.ok, report.summary()
    assert report.outputs[0].allowed > 1e-4 * report.outputs[0].scale  # widened by n * u
    assert report.sharded is not None and " all-reduce(" in report.sharded.partitioned_hlo()


def test_a_wrong_layout_on_a_long_reduction_still_fails(
    long_sum_split: str, devices: tuple[object, ...]
) -> None:
    from rhino.hlo.parser import parse_module
    from rhino.runtime.verify import reduction_lengths

    report = run_and_compare(LONG_SUM, long_sum_split, devices, seed=0)
    assert report.reference is not None and report.sharded is not None
    makers = entry_inputs(parse_module(LONG_SUM, "<long>"), seed=0)
    want = xb.execute(report.reference, [m.whole() for m in makers])
    # x's column blocks one device off: every device reads its neighbour's block of x
    x = np.roll(makers[0].whole(), 16384 // 8, axis=1)
    got = xb.execute(report.sharded, [x, makers[1].whole()])
    lengths = reduction_lengths(parse_module(LONG_SUM, "<long>"))
    checks = [
        compare_output(k, w, g, tolerance_for(w.dtype, reduction=n))
        for k, (w, g, n) in enumerate(zip(want, got, lengths, strict=True))
    ]
    assert not checks[0].ok and not checks[1].ok
    assert checks[0].max_rel_error > 100 * checks[0].allowed / checks[0].scale
    assert checks[2].ok  # the constant does not depend on x
