"""Fidelity: collectives measured in XLA's partitioned modules, and their comparison with
predicted ones. Bytes are per device, on the full side (rhino.search.spmd.comm's convention)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rhino.hlo.errors import ConfigError
from rhino.runtime.fidelity import (
    MeasuredCollective,
    PredictedCollective,
    compare,
    groups_axes,
    kernel_launches,
    measure_collectives,
    parse_partitioned,
    permute_axes,
)
from rhino.search.mesh import DeviceMesh

DATA = Path(__file__).resolve().parents[1] / "data" / "partitioned"
MESH_2x4 = DeviceMesh((2, 4))
MESH_8 = DeviceMesh((8,))
AXIS_0 = ((0, 4), (1, 5), (2, 6), (3, 7))  # groups along mesh axis 0 of 2x4
AXIS_1 = ((0, 1, 2, 3), (4, 5, 6, 7))  # groups along mesh axis 1 of 2x4


def measure(name: str, mesh: DeviceMesh = MESH_2x4) -> tuple[MeasuredCollective, ...]:
    return measure_collectives((DATA / name).read_text(), mesh)


def summary(m: MeasuredCollective) -> tuple[object, ...]:
    return (m.kind, m.nbytes, m.count, m.axes, m.instruction, m.sliced)


# --- XLA's partitioned modules, checked against hand-computed values ----------------------


def test_megatron_mlp_with_mesh_form_groups() -> None:
    """x gathered over mesh axis 0, W1 over axis 1 (mesh form with device_ids), and the
    Megatron all-reduce of y's partial sums over axis 1."""
    found = measure("all_gather_mesh.hlo")
    assert [summary(m) for m in found] == [
        ("all-gather", 16 * 32 * 4, 1, (0,), "h", False),  # output f32[16,32] = 2 KiB
        ("all-gather", 32 * 64 * 4, 1, (1,), "h", False),  # output f32[32,64] = 8 KiB
        ("all-reduce", 8 * 32 * 4, 1, (1,), "y", False),  # f32[8,32] = 1024 B
    ]
    assert [m.groups for m in found] == [AXIS_0, AXIS_1, AXIS_1]
    assert {m.attribution for m in found} == {"metadata"}
    assert found[2].name == "all-reduce" and found[2].computation == "main.1_spmd"


def test_all_reduce_with_device_ids_mesh_form() -> None:
    (m,) = measure("all_reduce_cols.hlo")
    assert summary(m) == ("all-reduce", 16 * 8 * 4, 1, (1,), "y", False)
    assert m.groups == AXIS_1


def test_all_reduce_feeding_a_partition_id_dynamic_slice_is_a_reduce_scatter() -> None:
    """CPU's reduce-scatter: all-reduce f32[8,32] over axis 1, then each device keeps its
    f32[8,8] quarter (the slice is inside a fusion, its offset from partition-id)."""
    (m,) = measure("allreduce_dynslice.hlo")
    assert summary(m) == ("all-reduce", 8 * 32 * 4, 1, (1,), "y", True)
    assert m.sliced_nbytes == 8 * 8 * 4
    assert m.row_kind == "reduce-scatter"


def test_tuple_all_to_all_sums_its_operands() -> None:
    for mesh, axes in ((MESH_8, (0,)), (MESH_2x4, (0, 1))):
        (m,) = measure("all_to_all.hlo", mesh)
        assert summary(m) == ("all-to-all", 8 * (8 * 1 * 8 * 4), 1, axes, "c", False)
        assert m.groups == (tuple(range(8)),)


def test_collective_permute_axes_come_from_its_pairs() -> None:
    (m,) = measure("permute_reverse.hlo", MESH_8)
    assert summary(m) == ("collective-permute", 8 * 4, 1, (0,), "c", False)
    assert m.pairs == tuple((d, 7 - d) for d in range(8))
    assert m.groups == ()
    (m,) = measure("permute_reverse.hlo", MESH_2x4)  # device d -> 7-d flips both coordinates
    assert m.axes == (0, 1)


def test_mesh_that_does_not_fit_the_module_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="num_partitions=8 but mesh 2x2 has 4 devices"):
        measure("all_reduce_cols.hlo", DeviceMesh((2, 2)))


# --- loops: trip-count weighting, through XLA ------------------------------------------------

# y = x @ w in a 3-trip loop, w row-split over mesh axis 1 of 2x4: each trip sums partial
# products over axis 1. XLA keeps the loop carry split, so each trip is an all-reduce of
# f32[16,32] followed by a slice at a partition-id offset carried into the loop.
LOOP = """\
HloModule loop_all_reduce

cond {
  p = (s32[], f32[16,32], f32[32,32]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(3)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[16,32], f32[32,32]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[16,32] get-tuple-element(p), index=1
  w = f32[32,32] get-tuple-element(p), index=2
  y = f32[16,32] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  ROOT t = (s32[], f32[16,32], f32[32,32]) tuple(i1, y, w)
}

ENTRY main {
  x = f32[16,32] parameter(0), sharding={replicated}
  w = f32[32,32] parameter(1), sharding={devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}
  zero = s32[] constant(0)
  t = (s32[], f32[16,32], f32[32,32]) tuple(zero, x, w)
  loop = (s32[], f32[16,32], f32[32,32]) while(t), condition=cond, body=body
  ROOT y = f32[16,32] get-tuple-element(loop), index=1, sharding={replicated}
}
"""


@pytest.fixture(scope="module")
def loop_module() -> str:
    from rhino.runtime import xla_bridge as xb

    compiled = xb.compile_spmd(LOOP, xb.local_devices("cpu", 8), num_partitions=8)
    return compiled.partitioned_hlo()


def test_while_body_all_reduce_counts_once_per_trip(loop_module: str) -> None:
    in_loop = [m for m in measure_collectives(loop_module, MESH_2x4) if m.count > 1]
    assert len(in_loop) == 1
    (m,) = in_loop
    assert summary(m) == ("all-reduce", 16 * 32 * 4, 3, (1,), "y", True)
    assert m.total_bytes == 3 * 2048
    assert m.sliced_nbytes == 16 * 8 * 4  # the partition-id offset comes through the loop carry
    assert m.computation != "main.3_spmd" and m.note == ""


def test_output_reshard_has_no_op_name_and_goes_to_the_root(loop_module: str) -> None:
    """XLA gathers the loop's split result for the replicated ROOT without an op_name."""
    after = [m for m in measure_collectives(loop_module, MESH_2x4) if m.count == 1]
    assert [(m.kind, m.nbytes, m.axes) for m in after] == [("all-gather", 16 * 32 * 4, (1,))]
    assert (after[0].instruction, after[0].attribution) == (None, "output")
    assert "resharding the entry's result to its output sharding" in after[0].describe()
    (gather,) = [m for m in measure_collectives(loop_module, MESH_2x4, root="y") if m.count == 1]
    assert (gather.instruction, gather.attribution) == ("y", "output")


def test_loop_report_matches_a_reduce_scatter_prediction(loop_module: str) -> None:
    predicted = [
        PredictedCollective("reduce-scatter", (1,), 2048, "y", count=3),
        PredictedCollective("all-gather", (1,), 2048, "y"),
    ]
    report = compare(predicted, measure_collectives(loop_module, MESH_2x4, root="y"))
    assert [m.rule for m in report.matches] == ["instruction", "instruction"]
    assert report.ok and report.ratio == 1.0
    report = compare(predicted, measure_collectives(loop_module, MESH_2x4))
    assert [m.rule for m in report.matches] == ["instruction", "kind+axes"]
    assert report.ok


UNKNOWN_TRIPS = """\
HloModule unknown_trips, num_partitions=8

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

cond {
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] parameter(1)
  ROOT lt = pred[] compare(i, i), direction=LT
}

body {
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[4] get-tuple-element(p), index=1
  s = f32[4] all-reduce(x), channel_id=1, replica_groups=[4,2]<=[2,4]T(1,0), use_global_device_ids=true, to_apply=add, metadata={op_name="s"}
  ROOT t = (s32[], f32[4]) tuple(i, s)
}

ENTRY main {
  x = f32[4] parameter(0)
  zero = s32[] constant(0)
  t = (s32[], f32[4]) tuple(zero, x)
  loop = (s32[], f32[4]) while(t), condition=cond, body=body, backend_config={"known_trip_count":{"n":"5"}}
  loop2 = (s32[], f32[4]) while(t), condition=cond, body=body
  ROOT r = f32[4] get-tuple-element(loop2), index=1
}
"""


def test_trip_count_from_backend_config_and_unknown_counts_once() -> None:
    found = measure_collectives(UNKNOWN_TRIPS, MESH_2x4)
    assert [(m.count, m.axes, m.nbytes) for m in found] == [(5, (0,), 16), (1, (0,), 16)]
    assert found[0].note == ""
    assert "trip count of %loop2 unknown" in found[1].note


def test_kernel_launches_count_loop_trips_and_leave_out_what_names_buffers() -> None:
    # a body of one kernel (the all-reduce) and a condition of one (compare): 5 trips run
    # the body 5 times and the condition 6; an unknown trip count runs them once and twice
    assert kernel_launches(parse_partitioned(UNKNOWN_TRIPS)) == 5 + 6 + 1 + 2
    # 3 trips of dot and add, 4 runs of the condition's compare
    assert kernel_launches(parse_partitioned(LOOP)) == 3 * 2 + 4 * 1


# --- async forms ------------------------------------------------------------------------------


def test_async_forms_and_their_bytes() -> None:
    """-start forms: all-gather-start's shape is (input, output); a reduce-scatter wrapped
    in async-start is found in its computation, and once only."""
    text = (DATA.parent / "snippets" / "23_async_collectives.hlo").read_text()
    found = measure_collectives(text, DeviceMesh((2, 2)))
    assert [(m.kind, m.nbytes, m.axes, m.name) for m in found] == [
        ("all-gather", 32 * 16 * 4, (0, 1), "all-gather-start"),
        ("all-reduce", 8 * 16 * 4, (0, 1), "all-reduce-start"),
        ("collective-permute", 8 * 16 * 4, (0, 1), "collective-permute-start"),
        ("reduce-scatter", 8 * 16 * 4, (0, 1), "rs"),
    ]
    sugar = (DATA.parent / "snippets" / "24_async_printed_sugar.hlo").read_text()
    found = measure_collectives(sugar, DeviceMesh((2, 2)))
    assert [(m.kind, m.nbytes) for m in found][-1] == ("reduce-scatter", 8 * 16 * 4)


# --- groups -> mesh axes ------------------------------------------------------------------


def test_groups_axes_keeps_xla_order_within_groups() -> None:
    assert groups_axes(AXIS_0, MESH_2x4) == (0,)
    assert groups_axes(AXIS_1, MESH_2x4) == (1,)
    assert groups_axes([list(range(8))], MESH_2x4) == (0, 1)
    assert groups_axes([[0, 4, 1, 5, 2, 6, 3, 7]], MESH_2x4) == (1, 0)  # axis 1 outer
    assert groups_axes([[d] for d in range(8)], MESH_2x4) == ()
    assert groups_axes([[0, 1], [2, 3], [4, 5], [6, 7]], MESH_2x4) is None
    assert groups_axes([[0, 1, 2, 3, 4, 5, 6, 7, 8]], MESH_2x4) is None
    # size-1 axes are never needed: 1x8 axis 1 is the whole mesh
    assert groups_axes([list(range(8))], DeviceMesh((1, 8))) == (1,)


def test_permute_axes() -> None:
    assert permute_axes([(0, 4), (4, 0)], MESH_2x4) == (0,)
    assert permute_axes([(0, 1), (1, 2), (2, 3), (3, 0)], MESH_2x4) == (1,)
    assert permute_axes([(0, 0)], MESH_2x4) == ()
    assert permute_axes([(0, 9)], MESH_2x4) is None


# --- compare ------------------------------------------------------------------------------


def measured(
    kind: str, nbytes: int, axes: tuple[int, ...] | None, at: str | None, **kw: object
) -> MeasuredCollective:
    fields: dict[str, object] = dict(
        kind=kind,
        nbytes=nbytes,
        count=1,
        axes=axes,
        groups=(),
        instruction=at,
        attribution="metadata" if at else "none",
        name=f"{kind}.{at}",
        computation="main",
    )
    fields.update(kw)
    return MeasuredCollective(**fields)


def test_compare_reports_mismatches_both_ways() -> None:
    predicted = [
        PredictedCollective("all-gather", (0,), 65536, "dot.3"),  # XLA did it over axis 1
        PredictedCollective("all-reduce", (1,), 1024, "y"),  # exact
        PredictedCollective("reduce-scatter", (1,), 1024, "z", note="P->S"),  # ~ sliced AR
        PredictedCollective("all-to-all", (0,), 2048, "c"),  # XLA moved twice the bytes
    ]
    found = [
        measured("all-reduce", 1024, (1,), "y"),
        measured("all-gather", 65536, (1,), "dot.3"),
        measured("all-reduce", 1000, (1,), "w", sliced=True, sliced_nbytes=250),
        measured("all-to-all", 4096, (0,), "c"),
    ]
    report = compare(predicted, found)
    assert report.predicted_bytes == 65536 + 1024 + 1024 + 2048
    assert report.measured_bytes == 65536 + 1024 + 1000 + 4096
    assert report.ratio == pytest.approx(report.measured_bytes / report.predicted_bytes)
    assert [
        (m.predicted.instruction, m.measured.instruction, m.rule, m.within_tolerance)
        for m in report.matches
    ] == [
        ("y", "y", "instruction", True),
        ("z", "w", "kind+axes", True),
        ("c", "c", "instruction", False),
    ]
    assert report.matches[2].ratio == 2.0
    assert [m.instruction for m in report.unpredicted] == ["dot.3"]
    assert [p.instruction for p in report.missing] == ["dot.3"]
    assert not report.ok
    assert report.messages() == [
        "XLA inserted all-gather of 64 KiB over mesh axis 1 at %dot.3 that the plan did not "
        "predict",
        "the plan predicted all-gather of 64 KiB over mesh axis 0 at %dot.3 that XLA did not "
        "insert",
        "all-to-all over mesh axis 0 at %c: predicted 2 KiB, XLA moves 4 KiB (all-to-all.c)",
    ]
    rows = {(t.kind, t.axes): (t.predicted_bytes, t.measured_bytes) for t in report.by_kind_axes}
    assert rows == {
        ("all-gather", (0,)): (65536, 0),
        ("all-gather", (1,)): (0, 65536),
        ("all-reduce", (1,)): (1024, 1024),
        ("all-to-all", (0,)): (2048, 4096),
        ("reduce-scatter", (1,)): (1024, 1000),  # the sliced all-reduce totals here
    }
    as_json = json.loads(json.dumps(report.to_dict()))
    assert as_json["ok"] is False and len(as_json["messages"]) == 3
    assert as_json["matches"][1]["predicted"]["note"] == "P->S"


def test_kind_and_axes_pairing_needs_bytes_within_tolerance() -> None:
    predicted = [PredictedCollective("all-reduce", (1,), 1000, "p")]
    assert compare(predicted, [measured("all-reduce", 1100, (1,), "q")]).ok  # +10%: ok
    report = compare(predicted, [measured("all-reduce", 1101, (1,), "q")])
    assert not report.matches and len(report.missing) == len(report.unpredicted) == 1


def test_compare_axes_as_sets_and_unmatched_groups_never_pair() -> None:
    predicted = [PredictedCollective("all-gather", (1, 0), 4096, "g")]
    assert compare(predicted, [measured("all-gather", 4096, (0, 1), "g")]).ok
    report = compare(predicted, [measured("all-gather", 4096, None, "g")])
    assert not report.matches
    assert "over unmatched replica groups at %g" in report.messages()[0]
    assert report.to_dict()["unpredicted"][0]["axes"] == "unmatched"


def test_sliced_all_reduce_pairs_with_either_kind_and_plain_one_not_with_reduce_scatter() -> None:
    sliced = measured("all-reduce", 512, (1,), "y", sliced=True, sliced_nbytes=128)
    plain = measured("all-reduce", 512, (1,), "y")
    for kind in ("all-reduce", "reduce-scatter"):
        assert compare([PredictedCollective(kind, (1,), 512, "y")], [sliced]).ok
    assert not compare([PredictedCollective("reduce-scatter", (1,), 512, "y")], [plain]).matches


def test_counts_multiply_bytes_and_empty_sides() -> None:
    predicted = [PredictedCollective("all-reduce", (0,), 100, "s", count=5)]
    found = [measured("all-reduce", 100, (0,), "s", count=5)]
    report = compare(predicted, found)
    assert report.predicted_bytes == report.measured_bytes == 500 and report.ok
    empty = compare([], [])
    assert empty.ok and empty.ratio == 1.0
    only_measured = compare([], found)
    assert only_measured.ratio is None and not only_measured.ok
    assert json.dumps(only_measured.to_dict())


NO_METADATA = """\
HloModule no_metadata, num_partitions=8

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[4] parameter(0), metadata={op_name="x"}
  ar = f32[4] all-reduce(x), channel_id=1, replica_groups=[2,4]<=[8], use_global_device_ids=true, to_apply=add
  n = f32[4] negate(ar), metadata={op_name="n"}
  ar2 = f32[4] all-reduce(n), channel_id=2, replica_groups=[2,4]<=[8], use_global_device_ids=true, to_apply=add
  c = f32[4] copy(ar2)
  ROOT t = (f32[4], f32[4]) tuple(c, n)
}
"""


def test_attribution_without_metadata_user_then_output() -> None:
    first, second = measure_collectives(NO_METADATA, MESH_2x4, root="t")
    assert (first.instruction, first.attribution) == ("n", "user")
    assert (second.instruction, second.attribution) == ("t", "output")
    assert "at %n (from its user; XLA's %ar)" in first.describe()


def test_a_combined_collective_pairs_with_every_prediction_it_merges() -> None:
    """XLA's combiner merges the collectives of several instructions into one named
    "(a:b:c)"; merged reduce-scatters are one all-reduce, sliced apart by its users."""
    from rhino.runtime.fidelity import MeasuredCollective, PredictedCollective, compare

    predicted = [
        PredictedCollective("reduce-scatter", (1,), 1000.0, "a"),
        PredictedCollective("reduce-scatter", (1,), 1000.0, "b"),
        PredictedCollective("all-reduce", (1,), 2000.0, "c"),
    ]
    merged = MeasuredCollective(
        "all-reduce", 4000, 1, (1,), ((0, 1),), "(a:b:c)", "metadata", "all-reduce.7", "main"
    )
    report = compare(predicted, [merged])
    assert not report.missing and not report.unpredicted
    assert [m.rule for m in report.matches] == ["combined"]
    assert report.matches[0].ratio == 1.0 and report.ok
    rows = {(t.kind, t.axes): (t.predicted_bytes, t.measured_bytes) for t in report.by_kind_axes}
    assert rows == {
        ("all-reduce", (1,)): (2000.0, 2000.0),
        ("reduce-scatter", (1,)): (2000.0, 2000.0),
    }
