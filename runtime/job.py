"""A run shared by several processes (hosts): what `rhino run --coordinator ...
--num-processes ... --process-id ...` names, and the SPMD and pipeline runs take."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Job:
    """A run shared by several processes (hosts) through jax's distributed runtime."""

    coordinator: str
    """HOST:PORT where process 0 serves and every process connects."""
    num_processes: int
    process_id: int
    """This process's index, 0 .. num_processes-1."""
