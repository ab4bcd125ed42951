"""Jobs of several processes on hosts with their own addresses: each process of
`rhino run --coordinator ...` in a network namespace of its own on a private test subnet
(`tests/netns.py`), as on separate machines. An SPMD plan, a stage plan and a hybrid plan
run and verify across two hosts; and the faults end cleanly, in bounded time: a process
killed mid-step, the coordinator killed, a coordinator nobody serves, processes given
different plans, modules or rhino versions, a port in use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from rhino.runtime.job import LOST_S
from tests.compile_flags import FAST_COMPILE
from tests.hlo.corpus import ROOT
from tests.netns import Host, private_hosts
from tests.runtime.test_multihost import finish

MLP = ROOT / "examples" / "mlp.hlo"
GPT = ROOT / "examples" / "gpt_tiny.hlo"
PORT = 4321
BOUND_S = LOST_S + 5
"""A job that loses a process ends within this (LOST_S, the checks' half second, and
the process's own exit)."""


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[Host]]:
    with private_hosts(2) as found:
        yield found


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("plans")
    made = {
        "mlp": ["plan", str(MLP), "--mesh", "2x4"],
        "mlp_pinned": ["plan", str(MLP), "--mesh", "2x4", "--pin", "batch__x__.1=RR"],
        "gpt": ["plan", str(GPT), "--mesh", "2x4"],
        "gpt_stages": ["pipeline", str(GPT), "--stages", "2"],
    }
    found = {}
    for name, args in made.items():
        found[name] = folder / f"{name}.json"
        r = CliRunner().invoke(cli, [*args, "--out", str(found[name])])
        assert r.exit_code == 0, r.output
    assert found["mlp"].read_text() != found["mlp_pinned"].read_text()
    return found


def _env() -> dict[str, str]:
    """Each process picks its device count (--devices), and compiles fast (the same
    partitioning and collectives, tests/compile_flags.py)."""
    return {**os.environ, "XLA_FLAGS": FAST_COMPILE, "JAX_PLATFORMS": "cpu"}


def _argv(
    hosts: list[Host], i: int, hlo: Path, plan: Path, *more: str, python: str = ""
) -> list[str]:
    start = [sys.executable, "-c", python + "from rhino.cli.main import main; main()"]
    job = f"--coordinator {hosts[0].address}:{PORT} --num-processes 2 --process-id {i}"
    run = ["run", str(hlo), "--plan", str(plan), "--platform", "cpu", "--json"]
    return hosts[i].command([*start, *run, *job.split(), *more])


def _start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT
    )


def _both(hosts: list[Host], hlo: Path, plan: Path, *more: str) -> list[dict]:
    """Run the job on both hosts; each process's report (both must succeed)."""
    results = finish([_start(_argv(hosts, i, hlo, plan, *more)) for i in range(2)])
    for i, (code, _, err) in enumerate(results):
        assert code == 0, f"process {i} exited {code}:\n{err[-3000:]}"
    return [json.loads(out) for _, out, _ in results]


def test_an_spmd_plan_runs_on_two_hosts_as_on_one(
    hosts: list[Host], plans: dict[str, Path]
) -> None:
    steps = ("--steps", "1", "--warmup", "0")
    docs = _both(hosts, GPT, plans["gpt"], "--devices", "4", *steps)
    for i, doc in enumerate(docs):
        assert (doc["process_index"], doc["process_count"]) == (i, 2)
        assert doc["verify"]["ok"], doc["verify"]["summary"]
        assert doc["local_partitions"] == [4 * i + k for k in range(4)]
    assert len(docs[0]["devices"]) == 8
    # the same partitioned program, the same collectives as on one host of 8 devices
    one = CliRunner().invoke(
        cli, ["run", str(GPT), "--plan", str(plans["gpt"]), "--devices", "8", "--json", *steps]
    )
    assert one.exit_code == 0, one.output
    alone = json.loads(one.stdout)["fidelity"]
    assert docs[0]["fidelity"] == docs[1]["fidelity"]
    assert docs[0]["fidelity"]["measured_bytes"] == alone["measured_bytes"] > 0
    assert docs[0]["fidelity"]["predicted_bytes"] == alone["predicted_bytes"]


@pytest.mark.parametrize(
    ("mesh", "devices"), [(None, "1"), ("2x4", "4")], ids=["one device a stage", "hybrid 2x4"]
)
def test_a_stage_plan_runs_each_stage_on_its_own_host(
    hosts: list[Host], plans: dict[str, Path], mesh: str | None, devices: str
) -> None:
    more = ["--devices", devices, "--steps", "1", "--warmup", "0", "--cluster", "cpu"]
    docs = _both(hosts, GPT, plans["gpt_stages"], *more, *(["--mesh", mesh] if mesh else []))
    assert [d["local_stages"] for d in docs] == [[0], [1]]
    for d in docs:
        assert d["verify"]["ok"], d["verify"]["summary"]
        assert d["order"]["same"]
        assert d["bytes"]["measured"] == d["bytes"]["planned"]
        assert d["bytes"]["measured_total"] > 0
    assert len(docs[0]["devices"]) == 2 * int(devices)


def _wait_for(proc: subprocess.Popen[str], text: str, timeout: float = 120) -> str:
    """Read `proc`'s stderr until a line holds `text`; what was read."""
    assert proc.stderr is not None
    seen = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"no {text!r} within {timeout} s:\n{''.join(seen)[-3000:]}")


@pytest.mark.parametrize("victim", [1, 0], ids=["a process", "the coordinator"])
def test_a_job_that_loses_a_process_mid_step_ends_everywhere(
    hosts: list[Host], plans: dict[str, Path], victim: int
) -> None:
    more = ("--devices", "4", "--no-verify", "--steps", "1000000", "--warmup", "0")
    procs = [_start(_argv(hosts, i, MLP, plans["mlp"], *more)) for i in range(2)]
    try:
        for p in procs:  # gloo connects at the first collective: both are stepping
            _wait_for(p, "[Gloo] Rank")
        procs[victim].kill()
        killed = time.monotonic()
        survivor = procs[1 - victim]
        _, err = survivor.communicate(timeout=120)
        took = time.monotonic() - killed
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for host in hosts:  # process 0's coordination service outlives it on purpose
            host.kill_all()
    assert survivor.returncode == 4, err[-3000:]
    assert took < BOUND_S, f"{took:.1f} s"
    lost = f"process {1 - victim} lost process {victim} of 2 (at {hosts[victim].address})"
    assert lost in err
    assert "Terminating process" not in err  # not jax's abort


def test_a_coordinator_nobody_serves_is_reported_with_its_address_and_timeout(
    hosts: list[Host], plans: dict[str, Path]
) -> None:
    started = time.monotonic()
    [(code, _, err)] = finish(
        [_start(_argv(hosts, 1, MLP, plans["mlp"], "--devices", "4", "--join-timeout", "3"))]
    )
    assert code == 2, err[-2000:]
    assert (
        f"process 1 of 2 could not join the job at {hosts[0].address}:{PORT} within 3 s: "
        "nothing serves there, connection refused" in err
    )
    assert time.monotonic() - started < 60
    unroutable = [*_argv(hosts, 1, MLP, plans["mlp"], "--devices", "4")]
    unroutable[unroutable.index("--coordinator") + 1] = f"10.214.0.1:{PORT}"
    [(code, _, err)] = finish([_start(unroutable)])
    assert code == 2 and "no route from this machine to 10.214.0.1" in err, err[-2000:]


@pytest.mark.parametrize("differ", ["plan", "module", "rhino version"])
def test_processes_given_different_work_are_refused_before_compiling(
    hosts: list[Host], plans: dict[str, Path], tmp_path: Path, differ: str
) -> None:
    hlo, plan, python = [MLP, MLP], [plans["mlp"], plans["mlp"]], ["", ""]
    if differ == "plan":
        plan[1] = plans["mlp_pinned"]
        key = "plan (sha256)"
    elif differ == "module":  # another module, with a plan of its own
        hlo[1] = tmp_path / "mlp_renamed.hlo"
        hlo[1].write_text(MLP.read_text().replace("HloModule ", "HloModule renamed_", 1))
        plan[1] = tmp_path / "renamed.json"
        made = CliRunner().invoke(
            cli, ["plan", str(hlo[1]), "--mesh", "2x4", "--out", str(plan[1])]
        )
        assert made.exit_code == 0, made.output
        key = "HLO module (sha256)"
    else:
        python[1] = (
            "import rhino.runtime.environment as e; v = e.versions; "
            "e.versions = lambda: {**v(), 'rhino': '0.0.9'}\n"
        )
        key = "rhino version"
    results = finish(
        [
            _start(_argv(hosts, i, hlo[i], plan[i], "--devices", "4", python=python[i]))
            for i in range(2)
        ]
    )
    for i, (code, _, err) in enumerate(results):
        assert code == 2, err[-2000:]
        assert f"process {i} and process {1 - i} differ in their {key} (" in err
        assert "[Gloo]" not in err  # refused before any collective ran


@pytest.mark.parametrize("held", ["coordinator", "transfer"])
def test_a_port_in_use_is_reported(hosts: list[Host], plans: dict[str, Path], held: str) -> None:
    port = PORT if held == "coordinator" else PORT + 1  # process 0's transfer server
    hold = (
        "import socket, sys; s = socket.socket(socket.AF_INET6); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "  # past TIME_WAITs
        f"s.bind(('::', {port})); s.listen(); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        hosts[0].command([sys.executable, "-c", hold]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    plan = plans["mlp"] if held == "coordinator" else plans["gpt_stages"]
    hlo = MLP if held == "coordinator" else GPT
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        [(code, _, err)] = finish([_start(_argv(hosts, 0, hlo, plan, "--devices", "4"))])
    finally:
        holder.kill()
        holder.wait()
    assert code == 2, err[-2000:]
    if held == "coordinator":
        assert f"the coordinator's port {PORT} is in use on this host" in err
    else:
        assert f"the transfer server's port {port} (at {hosts[0].address}) is in use" in err
