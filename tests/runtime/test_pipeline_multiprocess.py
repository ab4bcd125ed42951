"""A hybrid stage plan (made for mesh 2x2) as a job of two processes on loopback: the
MLP's 2 stages, each process one stage on its own 2 simulated CPU devices (SPMD in the
stage, planned when the run starts), arrays moving
between the processes through jax's transfer server in the order both derive from the
static schedule; each process verifies the outputs its stage makes, and together they
verify all of them."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

from rhino.search.cluster import load_cluster
from rhino.search.mesh import DeviceMesh
from rhino.search.pipeline import PipelineRequest, plan_pipeline
from rhino.search.problem import SolveOptions
from tests.hlo.corpus import ROOT
from tests.runtime.stage_plans import EPSILON, example
from tests.runtime.test_multihost import _run_all

MLP = ROOT / "examples" / "mlp.hlo"


def _free_port() -> int:
    """A free port whose next two (the processes' transfer servers) are free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        try:
            for extra in (1, 2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + extra))
        except OSError:
            continue
        return port


def test_two_processes_run_a_hybrid_stage_plan(tmp_path: Path) -> None:
    plan = tmp_path / "stages.json"
    request = PipelineRequest(
        2,
        EPSILON[("mlp", 2)],
        2,
        load_cluster("m8"),
        SolveOptions(time_limit_s=20, threads=1, work_limit=2.0),
        mesh=DeviceMesh((2, 2)),
    )
    plan_pipeline(example("mlp"), request).write(plan)
    port = _free_port()
    commands = [
        [
            sys.executable,
            "-m",
            "rhino.cli",
            "run",
            str(MLP),
            "--plan",
            str(plan),  # its mesh: 2x2
            "--cluster",
            "cpu",
            "--devices",
            "2",
            "--microbatches",
            "2",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--coordinator",
            f"127.0.0.1:{port}",
            "--num-processes",
            "2",
            "--process-id",
            str(i),
            "--json",
        ]
        for i in (0, 1)
    ]
    results = _run_all(commands)
    for code, _, err in results:
        assert code == 0, err[-3000:]
    docs = [json.loads(out) for _, out, _ in results]
    assert [d["local_stages"] for d in docs] == [[0], [1]]
    assert all(d["verify"]["ok"] for d in docs)
    assert sum(len(d["verify"]["outputs"]) for d in docs) == 14  # every output, once
    for d in docs:
        assert d["process_count"] == 2 and d["order"]["same"]
        assert d["bytes"]["measured"] == d["bytes"]["planned"] and d["bytes"]["measured_total"] > 0
        assert len(d["devices"]) == 4
