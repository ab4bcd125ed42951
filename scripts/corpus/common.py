"""Shared pieces of the corpus: the step record, its config, the exporter and VERSIONS.json.

A corpus step is one real training step written with a mainstream JAX library (Hugging Face
transformers' Flax models, Flax, Equinox, Keras), exported as XLA's pre-optimization HLO text:

    jax.jit(fn, donate_argnums=...).trace(*args).lower(lowering_platforms=("cpu",))
        .as_text(dialect="hlo")

``args`` are ``jax.ShapeDtypeStruct`` pytrees wherever possible (initial states come from
``jax.eval_shape``), so nothing big is allocated. Each library module (``hf_flax``,
``flax_eqx``, ``keras_steps``) exposes ``STEPS: dict[str, Step]``; ``scripts/export_corpus.py``
merges them and writes ``<out>/<name>.hlo.gz`` (gzip with mtime 0 and no file name: the same
text gives the same bytes) plus ``<out>/VERSIONS.json``.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.metadata
import io
import json
import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax

LIBRARIES = ("jax", "jaxlib", "flax", "optax", "transformers", "equinox", "keras", "keras-hub")
"""Distributions whose versions VERSIONS.json records, when installed."""


@dataclass(frozen=True)
class StepConfig:
    """The knobs every step takes; ``None`` means "the step's own default"."""

    batch: int | None = None
    """Examples per step."""
    layers: int | None = None
    """Transformer layers / conv blocks."""
    hidden: int | None = None
    """Model width (embedding size, conv channels)."""
    seq: int | None = None
    """Sequence length (image side for image models)."""

    def over(self, defaults: StepConfig) -> StepConfig:
        """This config with its unset knobs taken from ``defaults``."""
        return StepConfig(
            **{
                f.name: getattr(defaults, f.name)
                if getattr(self, f.name) is None
                else getattr(self, f.name)
                for f in dataclasses.fields(self)
            }
        )

    def get(self, name: str) -> int:
        """A knob that must be set (after :meth:`over`)."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(f"config knob {name!r} is not set")
        return int(value)

    def as_dict(self) -> dict[str, int | None]:
        """The knobs by name."""
        return dataclasses.asdict(self)


class Built(NamedTuple):
    """What a step's ``build`` returns: the function to lower and its (abstract) arguments."""

    fn: Callable[..., Any]
    """The training step."""
    args: tuple[Any, ...]
    """Its positional arguments: pytrees of ``jax.ShapeDtypeStruct`` (or arrays)."""
    donate_argnums: tuple[int, ...] = ()
    """Arguments donated to the step (the train state, as the libraries' scripts do)."""


@dataclass(frozen=True)
class Step:
    """One corpus entry: a named training step and how to build it for a config."""

    name: str
    """File stem, e.g. ``hf_gpt2`` (written as ``hf_gpt2.hlo.gz``)."""
    library: str
    """The library the step is written with, e.g. ``transformers (Flax) + optax``."""
    description: str
    """One line: model, loss, optimizer, what the state holds."""
    build: Callable[[StepConfig], Built | tuple[Any, ...]]
    """Config (all knobs set) -> ``Built`` (or a ``(fn, args[, donate_argnums])`` tuple)."""
    defaults: StepConfig = StepConfig(batch=8, layers=2, hidden=64, seq=32)
    """The config used for knobs the caller leaves unset."""

    def built(self, config: StepConfig) -> tuple[StepConfig, Built]:
        """The resolved config and the built step."""
        resolved = config.over(self.defaults)
        return resolved, Built(*self.build(resolved))


def abstract(tree: Any) -> Any:
    """``tree`` with every array replaced by a ``jax.ShapeDtypeStruct`` of its shape and dtype."""

    def leaf(x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct) or not hasattr(x, "shape"):
            return x
        return jax.ShapeDtypeStruct(x.shape, x.dtype)

    return jax.tree.map(leaf, tree)


def export(
    fn: Callable[..., Any], args: tuple[Any, ...], donate_argnums: tuple[int, ...] = ()
) -> str:
    """Pre-optimization HLO text of ``fn`` jitted on ``args`` (lowered for the CPU platform)."""
    traced = jax.jit(fn, donate_argnums=donate_argnums).trace(*abstract(args))
    return traced.lower(lowering_platforms=("cpu",)).as_text(dialect="hlo")


def gzip_bytes(text: str) -> bytes:
    """``text`` gzipped deterministically: no file name, mtime 0, level 9."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(text.encode())
    return buf.getvalue()


def write_step(out: Path, name: str, text: str) -> Path:
    """Write ``<out>/<name>.hlo.gz``; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.hlo.gz"
    path.write_bytes(gzip_bytes(text))
    return path


def library_versions() -> dict[str, str]:
    """Installed versions of :data:`LIBRARIES` (those not installed are left out), and Python's."""
    versions = {"python": platform.python_version()}
    for dist in LIBRARIES:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def write_versions(out: Path, entries: Mapping[str, Mapping[str, Any]]) -> Path:
    """Merge ``entries`` (step name -> record) into ``<out>/VERSIONS.json``; returns its path.

    Entries of steps not written this time are kept, so steps exported from different
    environments (the Keras steps come from their own venv) share one file.
    """
    path = out / "VERSIONS.json"
    merged: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    merged.update(entries)
    path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    return path
