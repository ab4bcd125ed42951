"""Shared pytest setup.

Runs before any test module is imported, so it is the place to configure jax: eight
simulated CPU devices, and the CPU platform only (jax reads both when it first starts).
"""

from __future__ import annotations

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count=8"

if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_FLAG}".strip()
os.environ["JAX_PLATFORMS"] = "cpu"
