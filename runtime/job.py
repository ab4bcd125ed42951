"""A run shared by several processes (hosts): what `rhino run --coordinator ...
--num-processes ... --process-id ...` names, and the SPMD and pipeline runs take."""

from __future__ import annotations

from dataclasses import dataclass

from rhino.hlo.errors import ConfigError

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
"""Coordinator hosts under which a stage plan runs as several processes."""


@dataclass(frozen=True)
class Job:
    """A run shared by several processes (hosts) through jax's distributed runtime."""

    coordinator: str
    """HOST:PORT where process 0 serves and every process connects."""
    num_processes: int
    process_id: int
    """This process's index, 0 .. num_processes-1."""

    def transfer_address(self) -> str:
        """HOST:PORT of this process's transfer server, through which a stage plan's
        arrays cross processes: the coordinator's host, at its port plus 1 + process id.
        Raises ConfigError unless that host is this machine (`LOOPBACK`)."""
        host, port = self.coordinator.rsplit(":", 1)
        if host not in LOOPBACK:
            raise ConfigError(
                f"coordinator {self.coordinator}: a stage plan runs as several "
                "processes on one machine only for now (coordinator on 127.0.0.1 or "
                "localhost): arrays cross processes through transfer servers on the "
                "coordinator's host",
                "coordinator",
            )
        return f"{host}:{int(port) + 1 + self.process_id}"
