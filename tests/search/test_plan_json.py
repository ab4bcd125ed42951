"""A plan as JSON (`jsonable`) and its use of the mesh (`mesh_use`), each against the
straightforward version it replaced: the same answers, only faster (issue 29)."""

from __future__ import annotations

import enum
import json
from collections import defaultdict
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, NamedTuple

import numpy as np
import pytest

from rhino.hlo.jsonable import jsonable
from rhino.hlo.parser import parse_file
from rhino.search.cluster import load_cluster
from rhino.search.mesh import DeviceMesh, parse_mesh
from rhino.search.spmd.plan import MeshUse, Plan, mesh_use
from rhino.search.spmd.planner import PlanRequest, make_plan
from rhino.search.spmd.spec import parse_spec
from rhino.search.spmd.strategy import dividing_axes, work_fraction
from tests.hlo.corpus import ROOT


def reference_jsonable(value: Any) -> Any:
    """`jsonable` as it was: every value down the whole tree by isinstance checks."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    own = getattr(value, "to_json", None)
    if callable(own) and not isinstance(value, type):
        return reference_jsonable(own())
    if isinstance(value, dict):
        return {str(k): reference_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [reference_jsonable(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: reference_jsonable(getattr(value, f.name)) for f in fields(value)}
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


def reference_mesh_use(plan: Plan) -> MeshUse:
    """`mesh_use` as it was: every layout of every instruction parsed."""
    import re

    mesh = plan.mesh
    used: set[int] = set()
    ideal = actual = 0.0
    sizes: set[int] = set()
    for inst in plan.instructions:
        specs = [parse_spec(text, mesh.ndim) for text in inst.outs]
        specs += [parse_spec(text, mesh.ndim) for text in inst.ins if text is not None]
        used |= dividing_axes(specs)
        cost = inst.compute_s * inst.weight
        ideal += cost / (work_fraction(specs, mesh) * mesh.size)
        actual += cost
        dims = re.findall(r"\[([\d,]*)\]", inst.shape)
        sizes.update(int(d) for text in dims for d in text.split(",") if d)
    idle = tuple(a for a, size in enumerate(mesh.shape) if size > 1 and a not in used)
    undividable = tuple(a for a in idle if not any(d % mesh.shape[a] == 0 for d in sizes if d > 1))
    return MeshUse(ideal / actual if actual > 0 else 1.0, idle, undividable)


def typed(value: Any) -> Any:
    """`value` with the type of every part beside it (so that 1 and 1.0, a list and a
    tuple, a float and a numpy float tell apart)."""
    if isinstance(value, dict):
        return ("dict", [(typed(k), typed(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value).__name__, [typed(v) for v in value])
    return (type(value).__name__, value)


@pytest.fixture(scope="module")
def plans() -> list[Plan]:
    """Plans that split along every axis, along some, and along none."""
    made = []
    for file, mesh in [("gpt_tiny.hlo", "2x4"), ("mlp.hlo", "1x7"), ("mlp.hlo", "3x3")]:
        request = PlanRequest(parse_mesh(mesh), load_cluster("m8"))
        made.append(make_plan(parse_file(ROOT / "examples" / file), request))
    return made


def test_a_plan_as_json_is_what_it_was(plans: list[Plan]) -> None:
    for plan in plans:
        assert typed(jsonable(plan)) == typed(reference_jsonable(plan))
        assert plan.to_dict()["instructions"][0]["outs"] == list(plan.instructions[0].outs)


class Colour(enum.Enum):
    RED = "red"


class Pair(NamedTuple):
    a: int
    b: tuple[str, ...]


@dataclass(frozen=True)
class Holder:
    name: str
    mesh: DeviceMesh
    pair: Pair
    values: tuple[float | None, ...]


@pytest.mark.parametrize(
    "value",
    [
        np.float32(1.5),
        np.float64(2.25),
        np.int64(3),
        np.bool_(True),
        (1, 2.5, "x", None, True),
        [np.int32(4), (5, (6,))],
        {True: 1, 2: "two", 2.5: [3], None: (np.float32(0.5),)},
        defaultdict(list, {"a": [1, np.int64(2)]}),
        Pair(1, ("p", "q")),
        Holder("h", DeviceMesh((2, 4)), Pair(2, ()), (0.5, None)),
        [Holder("i", DeviceMesh((8,)), Pair(3, ("r",)), ())] * 3,
        Holder,
        Colour.RED,
        {"k": Colour.RED},
    ],
)
def test_odd_values_as_json_are_what_they_were(value: Any) -> None:
    assert typed(jsonable(value)) == typed(reference_jsonable(value))


def test_json_text_of_a_plan_is_what_it_was(plans: list[Plan]) -> None:
    plan = plans[0]
    assert json.dumps(jsonable(plan)) == json.dumps(reference_jsonable(plan))


def test_mesh_use_is_what_it_was(plans: list[Plan]) -> None:
    found = [mesh_use(plan) for plan in plans]
    assert found == [reference_mesh_use(plan) for plan in plans]
    assert found[0].idle_axes == () and 0 < found[0].share <= 1
    assert found[1].idle_axes == (1,) and found[1].undividable_axes == (1,)
    assert found[2].idle_axes == (0, 1)
