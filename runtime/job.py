"""A run shared by several processes (hosts): what `rhino run --coordinator ...
--num-processes ... --process-id ... [--address ...]` names, and the SPMD and pipeline
runs take."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from rhino.hlo.errors import ConfigError

JOIN_TIMEOUT_S = 60
"""Seconds a process waits for the whole job to join (the coordinator reachable and
every process connected) before it stops with an error."""
LOST_S = 6
"""Seconds without a sign of life from another process (or an answer from the
coordinator) after which every process of the job stops, naming the one lost
(`rhino.runtime.xla_bridge.JobWatch`): a job that loses a process ends within about
this, plus the half second between checks."""
HEARTBEAT_S = 15
"""jax's own heartbeat timeout, the backstop above LOST_S: past it jax's coordination
service aborts every process of the job (with a stack trace)."""


@dataclass(frozen=True)
class Job:
    """A run shared by several processes (hosts) through jax's distributed runtime."""

    coordinator: str
    """HOST:PORT where process 0 serves and every process connects."""
    num_processes: int
    process_id: int
    """This process's index, 0 .. num_processes-1."""
    address: str | None = None
    """HOST or HOST:PORT the other processes reach this one at: its CPU collectives (gloo)
    listen on HOST, and a stage plan's transfer server at HOST:PORT. None: the address
    this machine reaches the coordinator from (`reached_from`), port as in
    `transfer_address`."""
    join_timeout_s: int = JOIN_TIMEOUT_S

    def host(self) -> str:
        """The host part of `address`, or the address this machine reaches the
        coordinator from."""
        if self.address is not None:
            host, _ = split_address(self.address)
            return host
        return reached_from(split_address(self.coordinator)[0], self.coordinator)

    def transfer_address(self) -> str:
        """HOST:PORT of this process's transfer server, through which a stage plan's
        arrays cross processes: `address`, its port by default the coordinator's plus
        1 + process id (distinct for processes that share a machine)."""
        port = split_address(self.address)[1] if self.address is not None else None
        if port is None:
            port = int(split_address(self.coordinator)[1] or 0) + 1 + self.process_id
        host = self.host()
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_address(text: str) -> tuple[str, int | None]:
    """HOST[:PORT] (an IPv6 host in brackets when a port follows) -> (host, port)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else None
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, int(port)
    return text, None


def reached_from(host: str, coordinator: str) -> str:
    """The local address this machine's routes use to reach `host` (no packet is sent:
    a UDP socket is only connected); ConfigError when `host` cannot be resolved or has
    no route from here."""
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise ConfigError(
            f"coordinator {coordinator}: cannot resolve {host!r} ({exc.strerror or exc})",
            "coordinator",
        ) from None
    failures = []
    for family, kind, proto, _, target in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.connect(target)
            except OSError as exc:
                failures.append(str(exc.strerror or exc))
                continue
            return str(probe.getsockname()[0])
    raise ConfigError(
        f"coordinator {coordinator}: no route from this machine to {host} "
        f"({'; '.join(failures)}); give this host's address with --address",
        "coordinator",
    )
