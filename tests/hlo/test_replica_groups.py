"""`rhino.hlo.analysis.replica_groups`: every form XLA prints, including the mesh form
whose device order comes in a separate `device_ids=` attribute."""

from __future__ import annotations

import pytest

from rhino.hlo.analysis import replica_groups
from rhino.hlo.errors import HloParseError
from rhino.hlo.ir import Instruction
from rhino.hlo.parser import parse_module
from tests.hlo.corpus import ROOT

MODULE = """\
HloModule m, num_partitions=8

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY e {
  x = f32[8] parameter(0)
  ROOT r = f32[8] all-reduce(x), channel_id=1, REPLICA_GROUPS, use_global_device_ids=true, to_apply=add
}
"""

# the mesh of XLA's MLP module: axis_0=1, axis_1=4, axis_2=2 with devices [0,4,1,5,2,6,3,7]
MLP_MESH = "replica_groups=mesh['axis_0'=1,'axis_1'=4,'axis_2'=2]"


def all_reduce(groups_text: str) -> Instruction:
    module = parse_module(MODULE.replace("REPLICA_GROUPS", groups_text), "m.hlo")
    root = module.entry.root
    assert root is not None
    return root


CASES = [
    ("replica_groups={{0,1},{2,3},{4,5},{6,7}}", [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ("replica_groups={{3,1},{0,2}}", [[3, 1], [0, 2]]),  # XLA's order kept
    ("replica_groups=[2,4]<=[8]", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=[4,2]<=[2,4]T(1,0)", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups=[1,8]<=[8]", [list(range(8))]),
    # mesh form, iota devices: one group per setting of the other axes
    (
        "replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4] {'axis_0'}",
        [[0, 4], [1, 5], [2, 6], [3, 7]],
    ),
    ("replica_groups=mesh['a'=2,'b'=4] {'b'}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("replica_groups=mesh['a'=2,'b'=4] {'b','a'}", [[0, 4, 1, 5, 2, 6, 3, 7]]),
    ("replica_groups=mesh['a'=2,'b'=4] {}", [[d] for d in range(8)]),
    # mesh form with device_ids (the MLP's W1 all-gather: groups {0..3},{4..7})
    (f"{MLP_MESH}, device_ids=([2,4]T(1,0)) {{'axis_1'}}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (f"{MLP_MESH}, device_ids=([2,4]T(1,0)) {{'axis_2'}}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (f"{MLP_MESH}, device_ids=([2,4]T(1,0)) {{'axis_2','axis_1'}}", [list(range(8))]),
    (f"{MLP_MESH}, device_ids=(0,4,1,5,2,6,3,7) {{'axis_1'}}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    (f"{MLP_MESH}, device_ids=(7,6,5,4,3,2,1,0) {{'axis_2'}}", [[7, 6], [5, 4], [3, 2], [1, 0]]),
    # sub-axis 'axis_1':(2)2 = the minor half of axis_1 (size 4 -> [2 major, 2 minor])
    (f"{MLP_MESH}, device_ids=([2,4]T(1,0)) {{'axis_1':(2)2}}", [[0, 1], [4, 5], [2, 3], [6, 7]]),
    ("replica_groups=mesh['a'=8] {'a':(1)2}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("replica_groups=mesh['a'=8] {'a':(4)2}", [[0, 1], [2, 3], [4, 5], [6, 7]]),
]


@pytest.mark.parametrize("text, expected", CASES, ids=[c[0] for c in CASES])
def test_replica_groups_of_every_form(text: str, expected: list[list[int]]) -> None:
    assert replica_groups(all_reduce(text)) == expected


def test_empty_or_absent_groups_are_none() -> None:
    assert replica_groups(all_reduce("replica_groups={}")) is None
    module = parse_module(MODULE.replace(", REPLICA_GROUPS", ""))
    assert module.entry.root is not None
    assert replica_groups(module.entry.root) is None


def test_groups_of_the_partitioned_mlp_module() -> None:
    module = parse_module((ROOT / "tests/data/partitioned/all_gather_mesh.hlo").read_text())
    entry = module.entry
    assert replica_groups(entry["all-gather"]) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert replica_groups(entry["all-gather.1"]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert replica_groups(entry["all-reduce"]) == [[0, 1, 2, 3], [4, 5, 6, 7]]


BAD = [
    (f"{MLP_MESH}, device_ids=([2,4]T(1,0)) {{'axis_9'}}", "not an axis of mesh"),
    (f"{MLP_MESH}, device_ids=([2,2]T(1,0)) {{'axis_1'}}", "holds 4 ids, the mesh 8"),
    (f"{MLP_MESH}, device_ids=(0,1,2,3,4,5,6,6) {{'axis_1'}}", "not a permutation"),
    (f"{MLP_MESH}, device_ids=([2,4]T(0,0)) {{'axis_1'}}", "not a permutation"),
    (f"{MLP_MESH}, device_ids=([2,4]T(1,0)) {{'axis_1':(1)3}}", "does not divide"),
    (f"{MLP_MESH}, device_ids=[2,4] {{'axis_1'}}", "expected device_ids="),
]


@pytest.mark.parametrize("text, message", BAD, ids=[b[1] for b in BAD])
def test_bad_mesh_forms_are_located_errors(text: str, message: str) -> None:
    inst = all_reduce(text)
    with pytest.raises(HloParseError, match=message) as info:
        replica_groups(inst)
    assert info.value.line == 11  # the all-reduce's line
    assert "device_ids=" in info.value.span.source_line


def test_xla_accepts_the_mesh_forms_tested_here() -> None:
    """The texts above are real XLA syntax (XLA's parser takes them)."""
    from rhino.runtime import xla_bridge as xb

    for text, _ in CASES:
        if "{}" in text:  # XLA wants at least one grouped axis; rhino reads {} anyway
            continue
        xb.xla_parse_only(MODULE.replace("REPLICA_GROUPS", text))
