"""The dot rule skips combinations no spec can hold (SpecError) and nothing else: a bug
inside it is not swallowed (issue 13)."""

from __future__ import annotations

import pytest

from rhino.hlo.parser import parse_file
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.spmd import rules
from rhino.search.spmd.planner import PlanRequest, make_plan
from tests.hlo.corpus import ROOT


class Boom(Exception):
    pass


def test_a_bug_in_building_a_spec_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise Boom("a bug")

    monkeypatch.setattr(rules, "ShardingSpec", broken)
    with pytest.raises(Boom):
        make_plan(
            parse_file(ROOT / "examples/gpt_tiny.hlo"),
            PlanRequest(parse_mesh("1x4"), load_cluster("m8")),
        )


def test_mapping_a_spec_lets_a_bug_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """map_spec and reshape_spec skip a mapping no spec can hold, and nothing else."""
    from rhino.search.spmd import strategy
    from rhino.search.spmd.spec import parse_spec

    mesh = parse_mesh("1x4")
    spec = parse_spec("RS1")
    assert strategy.map_spec(spec, {1: 0}, mesh) == parse_spec("RS0")
    rows = parse_spec("RS0")
    assert strategy.reshape_spec(rows, (8, 4), (32,), mesh) == rows  # blocks of whole rows

    def broken(*_args: object, **_kwargs: object) -> None:
        raise Boom("a bug")

    monkeypatch.setattr(strategy, "ShardingSpec", broken)
    strategy._reshape_spec.cache_clear()  # answers cached before the break
    with pytest.raises(Boom):
        strategy.map_spec(spec, {1: 0}, mesh)
    with pytest.raises(Boom):
        strategy.reshape_spec(rows, (8, 4), (32,), mesh)
