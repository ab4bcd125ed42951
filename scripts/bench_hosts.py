"""Jobs of several processes on hosts with their own addresses, and how they end: each
scenario of tests/runtime/test_hosts.py run once in network namespaces (tests/netns.py,
root needed), with the processes' exit codes, the seconds each took, from its start or
from the fault, and each one's peak RSS (its `ru_maxrss` from `wait4`: the largest of the
process and the descendants it waited for). Prints a table and writes JSON.

    python scripts/bench_hosts.py [--out bench/hosts.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.netns import Host, private_hosts  # noqa: E402

MLP = ROOT / "examples" / "mlp.hlo"
GPT = ROOT / "examples" / "gpt_tiny.hlo"
PORT = 4321
RHINO = [sys.executable, "-m", "rhino.cli"]
ENV = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0", "JAX_PLATFORMS": "cpu"}


def _rhino(*args: str) -> None:
    subprocess.run([*RHINO, *args], check=True, capture_output=True, cwd=ROOT, env=ENV)


def _argv(hosts: list[Host], i: int, hlo: Path, plan: Path, *more: str) -> list[str]:
    job = f"--coordinator {hosts[0].address}:{PORT} --num-processes 2 --process-id {i}"
    run = ["run", str(hlo), "--plan", str(plan), "--platform", "cpu", "--json", *job.split()]
    return hosts[i].command([*RHINO, *run, *more])


def _start(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT
    )


def _last_error(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith(("error:", "internal error", "F1"))]
    return lines[-1][:160] if lines else ""


def _outcome(code: int, out: str, err: str) -> str:
    if code == 0:
        try:
            doc = json.loads(out)
        except ValueError:
            return "ok"
        found = doc.get("verify") or {}
        if "processes" in doc:
            found = (doc["processes"][0].get("report") or {}).get("verify") or {}
        return f"verified: {found.get('summary', '?')}"
    return _last_error(err)


Result = tuple[int, float, str, int]
"""A process's exit code, its seconds, what it ended with and its peak RSS (bytes)."""


def _ended(p: subprocess.Popen[str], timeout_s: float) -> tuple[str, str, int]:
    """`p.communicate()`, but `p` reaped by `wait4` for its peak RSS: (stdout, stderr,
    ru_maxrss in bytes); `p.returncode` set. Past `timeout_s` it is killed."""
    read: dict[str, str] = {}

    def drain(name: str) -> None:
        stream = getattr(p, name)
        read[name] = stream.read()
        stream.close()

    readers = [threading.Thread(target=drain, args=(n,)) for n in ("stdout", "stderr")]
    for r in readers:
        r.start()
    timer = threading.Timer(timeout_s, p.kill)
    timer.start()
    _, status, usage = os.wait4(p.pid, 0)
    timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    for r in readers:
        r.join()
    return read["stdout"], read["stderr"], usage.ru_maxrss * 1024  # KiB on Linux


def _run(argvs: list[list[str]]) -> list[Result]:
    started = time.monotonic()
    procs = [_start(a) for a in argvs]
    found = []
    for p in procs:
        out, err, rss = _ended(p, 300)
        outcome = _outcome(p.returncode, out, err)
        found.append((p.returncode, time.monotonic() - started, outcome, rss))
    return found


def _killed(hosts: list[Host], plan: Path, victim: int) -> list[Result]:
    more = ("--devices", "4", "--no-verify", "--steps", "1000000", "--warmup", "0")
    procs = [_start(_argv(hosts, i, MLP, plan, *more)) for i in range(2)]
    for p in procs:
        assert p.stderr is not None
        while "[Gloo] Rank" not in (p.stderr.readline() or "[Gloo] Rank"):
            pass
    procs[victim].kill()
    killed = time.monotonic()
    found = []
    for i, p in enumerate(procs):
        _, err, rss = _ended(p, 120)
        what = "killed" if i == victim else _last_error(err)
        found.append((p.returncode, time.monotonic() - killed, what, rss))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/hosts.json")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="rhino-hosts-"))
    plans = {name: folder / f"{name}.json" for name in ("mlp", "pinned", "gpt", "stages")}
    _rhino("plan", str(MLP), "--mesh", "2x4", "--out", str(plans["mlp"]))
    pin = "batch__x__.1=RR"  # another plan of the same module
    _rhino("plan", str(MLP), "--mesh", "2x4", "--pin", pin, "--out", str(plans["pinned"]))
    _rhino("plan", str(GPT), "--mesh", "2x4", "--out", str(plans["gpt"]))
    _rhino("pipeline", str(GPT), "--stages", "2", "--out", str(plans["stages"]))
    rows: list[dict[str, object]] = []

    def add(scenario: str, hosts: int, results: list[Result], since: str) -> None:
        for process, (code, seconds, outcome, rss) in enumerate(results):
            rows.append(
                {
                    "scenario": scenario,
                    "process": process,
                    "processes": len(results),
                    "hosts": hosts,
                    "exit_code": code,
                    "seconds": round(seconds, 1),
                    "since": since,
                    "outcome": outcome,
                    "peak_rss_bytes": rss,
                }
            )
            print(f"{scenario:<34} {process}/{len(results)} {hosts} {code:>4} "
                  f"{seconds:6.1f} s ({since:<5}) {rss / 2**20:6,.0f} MiB {outcome}",
                  flush=True)  # fmt: skip

    with private_hosts(2) as hosts:
        steps = ("--steps", "1", "--warmup", "0")
        spmd = [_argv(hosts, i, GPT, plans["gpt"], "--devices", "4", *steps) for i in range(2)]
        add("SPMD gpt_tiny 2x4, 4 devices a host", 2, _run(spmd), "start")
        more = ("--devices", "1", "--cluster", "cpu", *steps)
        stages = [_argv(hosts, i, GPT, plans["stages"], *more) for i in range(2)]
        add("2 stages, one a host", 2, _run(stages), "start")
        more = ("--devices", "4", "--mesh", "2x4", "--cluster", "cpu", *steps)
        hybrid = [_argv(hosts, i, GPT, plans["stages"], *more) for i in range(2)]
        add("hybrid 2 stages x 4 devices", 2, _run(hybrid), "start")
        for victim in (1, 0):
            what = "process 1" if victim else "process 0 (the coordinator)"
            add(f"{what} killed mid-step", 2, _killed(hosts, plans["mlp"], victim), "kill")
            for host in hosts:  # process 0's coordination service lingers 10 s on purpose
                host.kill_all()
        alone = [_argv(hosts, 1, MLP, plans["mlp"], "--devices", "4", "--join-timeout", "5")]
        add("no coordinator (--join-timeout 5)", 2, _run(alone), "start")
        two = (plans["mlp"], plans["pinned"])
        differ = [_argv(hosts, i, MLP, two[i], "--devices", "4") for i in (0, 1)]
        add("different plans", 2, _run(differ), "start")
        hold = (
            "import socket, sys; s = socket.socket(socket.AF_INET6); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            f"s.bind(('::', {PORT})); s.listen(); print('held', flush=True); sys.stdin.read()"
        )
        holder = subprocess.Popen(
            hosts[0].command([sys.executable, "-c", hold]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        taken = [_argv(hosts, 0, MLP, plans["mlp"], "--devices", "4")]
        add("coordinator port in use", 2, _run(taken), "start")
        holder.kill()
        holder.wait()
    launch = [*RHINO, "run", str(MLP), "--plan", str(plans["mlp"]), "--processes", "2",
              "--devices", "4", "--json", "--logs", str(folder / "logs"), *steps]  # fmt: skip
    add("rhino run --processes 2 (one host)", 1, _run([launch]), "start")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
