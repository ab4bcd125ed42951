"""Export the corpus: real training steps of mainstream JAX libraries as gzipped HLO text.

Each library module under ``scripts/corpus/`` (``hf_flax``: Hugging Face transformers Flax
models; ``flax_eqx``: Flax NNX and Equinox; ``keras_steps``: Keras on the JAX backend)
exposes ``STEPS: dict[str, Step]``. This script merges those whose libraries are installed
(a module whose library is missing is skipped with a message), lowers each step for the CPU
platform on abstract inputs and writes ``<out>/<name>.hlo.gz`` plus ``<out>/VERSIONS.json``
(per step: library, config, installed versions; merged with what the file already holds, so
steps exported from different virtual environments share it). The same command writes the
same bytes.

    python scripts/export_corpus.py --out tests/data/corpus
    python scripts/export_corpus.py --out /tmp/corpus4 --layers 4 --only hf_gpt2
    python scripts/export_corpus.py --list
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")  # before any keras import
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # its Flax deprecation notice

import click  # noqa: E402
from benchlib import count_instructions  # noqa: E402
from corpus.common import (  # noqa: E402
    Step,
    StepConfig,
    export,
    library_versions,
    write_step,
    write_versions,
)

REPO = Path(__file__).resolve().parent.parent
MODULES = ("corpus.hf_flax", "corpus.flax_eqx", "corpus.keras_steps")
"""Library modules, each exposing ``STEPS``; imported in this order."""


def load_steps() -> tuple[dict[str, Step], dict[str, str]]:
    """Steps of every importable module, and why each other module was skipped."""
    steps: dict[str, Step] = {}
    skipped: dict[str, str] = {}
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            missing = err.name or str(err)
            what = "the module itself" if missing == name else f"library {missing!r}"
            skipped[name] = f"{what} is not installed in this environment ({sys.executable})"
            continue
        for step_name, step in module.STEPS.items():
            if step_name in steps:
                raise click.ClickException(f"step {step_name!r} is defined twice ({name})")
            steps[step_name] = step
    return steps, skipped


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=REPO / "tests" / "data" / "corpus",
    show_default=True,
    help="Folder for <name>.hlo.gz and VERSIONS.json.",
)
@click.option("--only", multiple=True, metavar="NAME", help="Export only these steps (repeatable).")
@click.option("--batch", type=int, help="Examples per step (default: each step's own, 8).")
@click.option("--layers", type=int, help="Transformer layers / conv blocks.")
@click.option("--hidden", type=int, help="Model width (embedding size, conv channels).")
@click.option("--seq", type=int, help="Sequence length (image side for image models).")
@click.option("--list", "list_only", is_flag=True, help="List the steps and exit.")
def main(
    out: Path,
    only: tuple[str, ...],
    batch: int | None,
    layers: int | None,
    hidden: int | None,
    seq: int | None,
    list_only: bool,
) -> None:
    """Write the corpus of real JAX training steps as gzipped pre-optimization HLO text."""
    steps, skipped = load_steps()
    for module, why in skipped.items():
        click.echo(f"skipping {module}: {why}", err=True)
    if list_only:
        for step in steps.values():
            d = step.defaults
            click.echo(
                f"{step.name:18} {step.library:30} batch={d.batch} layers={d.layers} "
                f"hidden={d.hidden} seq={d.seq}\n{'':18} {step.description}"
            )
        return
    unknown = [n for n in only if n not in steps]
    if unknown:
        raise click.ClickException(
            f"unknown step(s) {', '.join(unknown)}; known: {', '.join(steps)}"
            + (f" (skipped modules: {', '.join(skipped)})" if skipped else "")
        )
    overrides = StepConfig(batch=batch, layers=layers, hidden=hidden, seq=seq)
    versions = library_versions()
    records: dict[str, dict[str, object]] = {}
    missing: list[str] = []
    for name in only or tuple(steps):
        step = steps[name]
        start = time.perf_counter()
        try:
            config, built = step.built(overrides)
        except ModuleNotFoundError as err:  # a module importing its library lazily
            click.echo(
                f"skipping {name}: library {err.name!r} is not installed in this environment "
                f"({sys.executable})",
                err=True,
            )
            missing.append(name)
            continue
        text = export(built.fn, built.args, built.donate_argnums)
        path = write_step(out, name, text)
        records[name] = {
            "library": step.library,
            "description": step.description,
            "config": config.as_dict(),
            "donate_argnums": list(built.donate_argnums),
            "versions": versions,
        }
        click.echo(
            f"{path}: {path.stat().st_size / 1024:.1f} KiB, "
            f"{count_instructions(text)} instructions, {time.perf_counter() - start:.1f}s"
        )
    if records:
        click.echo(f"{write_versions(out, records)}")
    if only and missing:
        raise click.ClickException(f"could not build {', '.join(missing)}")


if __name__ == "__main__":
    main()
