"""Hosts with their own addresses on one machine, for the tests of jobs of several
processes: Linux network namespaces, each a "host" with one address on a private test
subnet, joined by a bridge in a namespace of its own. Nothing is added to the machine's
own namespace, no route leads out of the subnet, and everything is removed on the way
out, whatever happened (`private_hosts`).

Needs root and iproute2 (`ip netns`). Where they are missing the tests skip, except
under CI (the CI environment variable set), where they fail: CI must run them."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

SUBNET = "10.213.7"
"""The hosts' /24: an address block for private networks (RFC 1918), seen only inside
the namespaces."""

_serial = itertools.count()


@dataclass(frozen=True)
class Host:
    """One simulated host: a network namespace and its address."""

    namespace: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def kill_all(self) -> None:
        """Kill every process left on this host (between tests: what a killed job left
        behind, e.g. its coordination service, lingering on purpose)."""
        _kill_inside(self.namespace)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


def require() -> None:
    """Skip the test where namespaces cannot be made; under CI, fail it."""
    reason = unavailable()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the multi-host tests, but {reason}")
    pytest.skip(reason)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextmanager
def private_hosts(count: int) -> Iterator[list[Host]]:
    """`count` hosts at SUBNET.1, SUBNET.2, ..., each in its own namespace, on one bridge;
    removed on exit (the processes left in them killed first)."""
    require()
    _remove_stale()
    tag = f"rh{os.getpid() % 100000}x{next(_serial)}"
    switch = f"{tag}-sw"
    hosts = [Host(f"{tag}-h{i}", f"{SUBNET}.{i + 1}") for i in range(count)]
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for i, host in enumerate(hosts):
            _ip("netns", "add", host.namespace)
            made.append(host.namespace)
            inside, outside = f"{tag}h{i}", f"{tag}s{i}"
            _ip("link", "add", inside, "netns", host.namespace, "type", "veth", "peer", "name",
                outside, "netns", switch)  # fmt: skip
            _ip("-n", switch, "link", "set", outside, "master", "br0", "up")
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", inside)
            _ip("-n", host.namespace, "link", "set", inside, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
        yield hosts
    finally:
        for name in reversed(made):
            _kill_inside(name)
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def _remove_stale() -> None:
    """Remove the namespaces a test process left behind when it was killed before it
    could (named after its pid, which is gone)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    for line in listed.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        found = re.fullmatch(r"rh(\d+)x\d+-(sw|h\d+)", name)
        if found is None or _alive(int(found.group(1))):
            continue
        _kill_inside(name)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


def _alive(pid_tag: int) -> bool:
    """Is a process whose pid ends in `pid_tag` (pid modulo 100000) running?"""
    return any(entry.isdigit() and int(entry) % 100000 == pid_tag for entry in os.listdir("/proc"))


def _kill_inside(namespace: str) -> None:
    found = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30
    )
    for pid in found.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
