"""The XLA flags the tests compile with: the CPU backend's slow code generation turned
off, the partitioning and the collectives (what the tests check) the same.

Read before jax is imported (jax reads XLA_FLAGS when it first starts), so the jaxlib
release is taken from its installed metadata, not from jaxlib itself.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

OPTIMIZATION_OFF = "--xla_backend_optimization_level=0"
"""LLVM's optimizations off: a corpus step's `rhino run` 11.9 -> 8.2 s."""
FUSION_EMITTERS_OFF = "--xla_cpu_use_fusion_emitters=false"
"""XLA's CPU backend emits its fusions through its older LLVM IR emitters instead of
the MLIR fusion emitters. It fuses differently (the tiny MoE's step on 2x4: 422 fusions
against 480), but partitions alike: the same 87 collectives, of the same kinds, shapes
and device groups, in the optimized HLO (`--xla_dump_to`). Compiled faster: the run of
that plan (`rhino run examples/moe_tiny.hlo --devices 8 --steps 1 --warmup 0`, with
OPTIMIZATION_OFF): 7.7-8.5 -> 5.2 s; tests/corpus and tests/runtime/test_zoo_runs.py
with `-n 2`: 394 -> 269 s. jaxlib 0.10 has the flag; 0.11 and 0.12 no longer do (the
fusion emitters are their only path) and stop at start-up on a flag they do not know."""


def _has_fusion_emitters_flag() -> bool:
    try:
        release = version("jaxlib")
    except PackageNotFoundError:
        return False
    major, minor = (int(part) for part in release.split(".")[:2])
    return (major, minor) < (0, 11)


FAST_COMPILE = " ".join(
    [OPTIMIZATION_OFF, *([FUSION_EMITTERS_OFF] if _has_fusion_emitters_flag() else [])]
)
"""XLA_FLAGS for compiling fast (both, where this jaxlib has the second flag)."""
