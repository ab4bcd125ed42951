"""rhino.runtime.request: the devices a request needs, how they are asked of XLA before
jax starts, a job's transfer address; the mesh in a plan file."""

from __future__ import annotations

import functools
import os

import pytest

from rhino.hlo.errors import ConfigError
from rhino.hlo.parser import parse_file
from rhino.runtime import request as run
from rhino.runtime.job import Job
from rhino.runtime.pipeline.programs import StagePlan
from rhino.runtime.request import RunRequest, devices_needed, execute, simulate_cpu_devices
from rhino.search.cluster import load_cluster
from rhino.search.mesh import DeviceMesh
from rhino.search.spmd.plan import Plan
from rhino.search.spmd.planner import PlanRequest, make_plan
from tests.hlo.corpus import ROOT

MLP = ROOT / "tests" / "data" / "mlp_step.hlo"
FLAG = "--xla_force_host_platform_device_count"


@functools.cache
def plan_1x4() -> Plan:
    return make_plan(parse_file(MLP), PlanRequest(DeviceMesh((1, 4)), load_cluster("m8")))


def stage_plan(stages: int, mesh: DeviceMesh | None = None) -> StagePlan:
    return StagePlan("m", stages, 8, {}, {}, {}, mesh)


def test_a_plan_file_keeps_the_mesh_as_its_sizes() -> None:
    plan = plan_1x4()
    assert plan.mesh == DeviceMesh((1, 4))
    doc = plan.to_dict()
    assert doc["mesh"] == [1, 4]
    assert Plan.from_dict(doc) == plan
    with pytest.raises(ConfigError, match="<plan>: malformed plan: mesh '1x4': expected a list"):
        Plan.from_dict({**doc, "mesh": "1x4"})
    with pytest.raises(ConfigError, match="malformed plan: mesh shape must be one or more"):
        Plan.from_dict({**doc, "mesh": [2, 0]})


def test_the_devices_a_request_needs() -> None:
    module = parse_file(MLP)
    assert devices_needed(RunRequest(module, None, DeviceMesh((2, 4)))) == 8
    assert devices_needed(RunRequest(module, plan_1x4())) == 4
    assert devices_needed(RunRequest(module, stage_plan(3))) == 3
    assert devices_needed(RunRequest(module, stage_plan(2, DeviceMesh((2, 4))))) == 8
    # a mesh given with a stage plan is the one it runs on
    assert devices_needed(RunRequest(module, stage_plan(2), DeviceMesh((2, 2)))) == 4


def test_a_request_names_a_plan_or_a_mesh_to_plan_on() -> None:
    module = parse_file(MLP)
    with pytest.raises(ConfigError, match="without a plan needs a mesh"):
        RunRequest(module, None)
    with pytest.raises(ConfigError, match="mesh 2x2: the plan is for mesh 1x4"):
        RunRequest(module, plan_1x4(), DeviceMesh((2, 2)))
    assert RunRequest(module, plan_1x4(), DeviceMesh((1, 4))).mesh == DeviceMesh((1, 4))


@pytest.mark.parametrize(
    ("before", "n", "exactly", "after"),
    [
        ("", 8, False, f"{FLAG}=8"),
        (f"--xla_dump_to=/tmp/x {FLAG}=16", 8, False, f"--xla_dump_to=/tmp/x {FLAG}=16"),
        (f"--xla_dump_to=/tmp/x {FLAG}=16", 8, True, f"--xla_dump_to=/tmp/x {FLAG}=8"),
        (f"{FLAG}=2 --xla_dump_to=/tmp/x", 4, False, f"--xla_dump_to=/tmp/x {FLAG}=4"),
    ],
)
def test_simulated_devices_are_asked_of_xla_before_jax_starts(
    monkeypatch: pytest.MonkeyPatch, before: str, n: int, exactly: bool, after: str
) -> None:
    monkeypatch.setattr(run.xb, "backends_started", lambda: False)
    monkeypatch.setenv("XLA_FLAGS", before)
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    asked: list[int] = []  # jax_num_cpu_devices, for an XLA that has read its flags
    monkeypatch.setattr(run.xb, "set_cpu_device_count", asked.append)
    simulate_cpu_devices(n, exactly=exactly)
    assert os.environ["XLA_FLAGS"] == after
    assert asked == ([n] if after != before else [])  # jax is loaded in this process
    assert os.environ["JAX_PLATFORMS"] == "cpu"


def test_too_few_devices_once_jax_started_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run.xb, "backends_started", lambda: True)
    monkeypatch.setattr(run.xb, "device_count", lambda platform: 4)
    monkeypatch.setenv("XLA_FLAGS", "")
    simulate_cpu_devices(4, exactly=False)  # enough: nothing to do
    with pytest.raises(ConfigError, match="already initialised with 4 CPU devices"):
        simulate_cpu_devices(8, exactly=False)


def test_a_stage_plan_job_moves_arrays_through_ports_after_the_coordinators() -> None:
    assert Job("127.0.0.1:1234", 2, 1).transfer_address() == "127.0.0.1:1236"
    assert Job("[::1]:50", 3, 0).transfer_address() == "[::1]:51"
    # another host: this one's own address, the port after the coordinator's by default
    assert Job("10.0.0.1:1234", 2, 1, "10.0.0.2").transfer_address() == "10.0.0.2:1236"
    assert Job("10.0.0.1:1234", 2, 1, "10.0.0.2:7000").transfer_address() == "10.0.0.2:7000"
    assert Job("[fd00::1]:1234", 2, 0, "[fd00::2]:9").transfer_address() == "[fd00::2]:9"


def test_a_job_s_address_defaults_to_the_one_its_routes_reach_the_coordinator_from() -> None:
    assert Job("127.0.0.1:1234", 2, 0).host() == "127.0.0.1"
    assert Job("localhost:1234", 2, 0).host() in ("127.0.0.1", "::1")
    assert Job("10.0.0.1:1234", 2, 0, "10.0.0.9:5").host() == "10.0.0.9"
    with pytest.raises(ConfigError, match="cannot resolve 'no-such-host.invalid'") as info:
        Job("no-such-host.invalid:1234", 2, 1).host()
    assert info.value.option == "coordinator"


def test_a_stage_plan_on_too_few_devices_is_refused_before_anything_runs() -> None:
    module = parse_file(MLP)
    request = RunRequest(module, stage_plan(2, DeviceMesh((2, 2))), devices=3)
    with pytest.raises(ConfigError, match="2 stages of 2 device\\(s\\), but `devices` 3 x 1"):
        execute(request)
    with pytest.raises(ConfigError, match="mesh 3x2: the pipeline is mesh axis 0"):
        execute(RunRequest(module, stage_plan(2), DeviceMesh((3, 2))))


def test_a_job_s_devices_must_make_the_plan_s_mesh() -> None:
    request = RunRequest(parse_file(MLP), plan_1x4(), devices=4, job=Job("127.0.0.1:1", 2, 0))
    with pytest.raises(ConfigError, match="devices 4 per process x 2 processes = 8") as info:
        execute(request)
    assert info.value.option == "devices"
