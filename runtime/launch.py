"""A simulated multi-host job on this machine: every process of `rhino run --coordinator
... --num-processes N --process-id i` started at once, on a free loopback port, each
with its own log files; `launch_local` waits for all of them and says how each ended.

The processes watch each other (`rhino.runtime.xla_bridge.JobWatch`): one that fails or
dies makes the others stop within about `LOST_S`. The launcher still kills whatever is
left `STRAGGLER_S` after the first process ended with an error, so a job never hangs
it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rhino.hlo.errors import ConfigError
from rhino.runtime.job import JOIN_TIMEOUT_S, LOST_S

STRAGGLER_S = LOST_S + 10
"""Seconds the other processes get to stop on their own after one ended with an error."""


@dataclass(frozen=True)
class Ended:
    """How one process of the job ended."""

    process: int
    exit_code: int
    """Its exit code (negative: killed by that signal)."""
    seconds: float
    """From the start of the job to its end."""
    stdout: Path
    stderr: Path
    killed: bool = False
    """Killed by the launcher, having outlived STRAGGLER_S after another's error."""

    def to_json(self) -> dict[str, object]:
        return {
            "process": self.process,
            "exit_code": self.exit_code,
            "seconds": self.seconds,
            "stdout": str(self.stdout),
            "stderr": str(self.stderr),
            "killed": self.killed,
        }


def free_port(count: int) -> int:
    """A loopback port P with P .. P + count - 1 free (the coordinator, then one transfer
    server per process)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port + count <= 65535 and all(_free(port + k) for k in range(1, count)):
            return port
    raise ConfigError("no free run of loopback ports for the job's processes")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def log_folder(given: str | None) -> Path:
    """The folder the processes' logs go to (made now, so that a bad path stops the
    job before it starts): `given`, or a new one under the system's temporary folder."""
    if given is None:
        import tempfile

        return Path(tempfile.mkdtemp(prefix="rhino-job-"))
    path = Path(given)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".rhino-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"logs {given}: cannot write there ({exc.strerror or exc})", "logs"
        ) from None
    return path


def launch_local(
    command: Sequence[str],
    processes: int,
    logs: Path,
    *,
    port: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Ended]:
    """Run `command` (a `rhino run` argument list after the program, without the job
    options) as every process of a job of `processes` on this machine: process i gets
    `--coordinator 127.0.0.1:PORT --num-processes N --process-id i`, and writes
    `process-i.out` and `process-i.err` in `logs`. Returns how each ended, by process."""
    say = progress or (lambda _text: None)
    port = port or free_port(processes + 1)
    started = time.monotonic()
    running: dict[int, tuple[subprocess.Popen[bytes], Path, Path]] = {}
    ended: dict[int, Ended] = {}
    try:
        for i in range(processes):
            out, err = logs / f"process-{i}.out", logs / f"process-{i}.err"
            job = [f"--coordinator=127.0.0.1:{port}", f"--num-processes={processes}"]
            argv = [sys.executable, "-m", "rhino.cli", *command, *job, f"--process-id={i}"]
            with out.open("wb") as stdout, err.open("wb") as stderr:
                child = subprocess.Popen(argv, stdout=stdout, stderr=stderr, env=os.environ.copy())
            running[i] = (child, out, err)
        say(f"{processes} processes started at 127.0.0.1:{port}; logs in {logs}")
        first_error: float | None = None
        deadline = started + JOIN_TIMEOUT_S * 10
        while running:
            time.sleep(0.1)
            now = time.monotonic()
            for i, (child, out, err) in list(running.items()):
                code = child.poll()
                if code is None:
                    continue
                ended[i] = Ended(i, code, now - started, out, err)
                del running[i]
                say(f"process {i} ended ({code}); {len(running)} running")
                if code != 0 and first_error is None:
                    first_error = now
            late = first_error is not None and now - first_error > STRAGGLER_S
            if running and (late or now > deadline):
                for i, (child, out, err) in running.items():
                    child.kill()
                    child.wait()
                    ended[i] = Ended(i, child.returncode, now - started, out, err, True)
                running.clear()
    finally:
        for child, _, _ in running.values():  # interrupted: leave nothing behind
            child.kill()
            child.wait()
    return [ended[i] for i in sorted(ended)]


def job_exit_code(ended: Sequence[Ended]) -> int:
    """The job's exit code: 0 when every process succeeded, else that of the first
    process to end with an error (the cause; the others stopped because of it), a
    signal's death counted as 3."""
    failed = sorted((e for e in ended if e.exit_code != 0), key=lambda e: e.seconds)
    if not failed:
        return 0
    code = failed[0].exit_code
    return code if code > 0 else 3
