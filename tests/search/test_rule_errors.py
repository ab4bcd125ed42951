"""The dot rule skips combinations no spec can hold (SpecError) and nothing else: a bug
inside it is not swallowed (issue 13)."""

from __future__ import annotations

import pytest

from rhino.hlo.parser import parse_file
from rhino.search import rules
from rhino.search.cluster import load_cluster
from rhino.search.mesh import parse_mesh
from rhino.search.planner import PlanRequest, make_plan
from tests.hlo.corpus import ROOT


class Boom(Exception):
    pass


def test_a_bug_in_building_a_spec_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise Boom("a bug")

    monkeypatch.setattr(rules, "ShardingSpec", broken)
    with pytest.raises(Boom):
        make_plan(parse_file(ROOT / "examples/gpt_tiny.hlo"),
                  PlanRequest(parse_mesh("1x4"), load_cluster("m8")))  # fmt: skip
