"""Model zoo: HLO text of full JAX training steps (forward, backward, Adam update).

Every model is plain jax.numpy, lowered from ``jax.ShapeDtypeStruct`` inputs (no weights
are allocated) for the CPU platform, and written as XLA's pre-optimization HLO text:
``jax.jit(step).trace(*args).lower(lowering_platforms=("cpu",)).as_text(dialect="hlo")``.
The step's inputs, in order, are (params, adam_m, adam_v, adam_count, batch), each flattened
by JAX (dict keys sorted); its outputs are (loss, params, adam_m, adam_v, adam_count).

Usable as a script (``python scripts/zoo.py --help``) and as a module (tests put scripts/ on
``sys.path`` and ``import zoo``).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import jax
from benchlib import count_instructions
from jax._src import config as jax_config
from zoo_models import dnabert, encdec, gpt, mlp, moe, unet, vgg, wresnet
from zoo_models.common import ModelSpec, ZooError, abstract_args, make_train_step

REPO = Path(__file__).resolve().parent.parent
EXAMPLES_DIR = REPO / "examples"
EXPORTED_WITH_JAX = "0.10.2"
"""The jax the committed examples were lowered with: another names and orders some
instructions differently (same programs), so only this one reproduces them exactly."""


@dataclass(frozen=True)
class Family:
    """A model family: its named configs and how to build a spec from one."""

    name: str
    """Name on the command line, e.g. ``gpt``."""
    summary: str
    """One line for ``--list``."""
    configs: Mapping[str, Any]
    """Config name -> frozen config dataclass."""
    build: Callable[[str, Any], ModelSpec]
    """(spec name, config) -> spec."""
    default: str = "tiny"
    """Config used when ``--config`` is not given."""


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("mlp", "MLP regression (relu, MSE)", mlp.CONFIGS, mlp.build),
        Family("gpt", "GPT decoder, layers unrolled", gpt.CONFIGS, gpt.build),
        Family("gpt_scan", "GPT decoder, layers under lax.scan", gpt.CONFIGS, gpt.build_scan),
        Family("moe", "GShard MoE decoder, top-2 gating", moe.CONFIGS, moe.build),
        Family("wresnet", "Wide-ResNet, bottleneck blocks, BN", wresnet.CONFIGS, wresnet.build),
        Family("unet", "UNet, skip connections by concat", unet.CONFIGS, unet.build),
        Family("dnabert", "BERT encoder, long sequences, MLM", dnabert.CONFIGS, dnabert.build),
        Family(
            "encdec", "Encoder-decoder transformer, cross-attention", encdec.CONFIGS, encdec.build
        ),
        Family("vgg19", "VGG19 with a huge classifier", vgg.CONFIGS, vgg.build),
    )
}


@dataclass(frozen=True)
class Example:
    """A small committed configuration under examples/."""

    file: str
    """File name under examples/."""
    family: str
    """Key of ``FAMILIES``."""
    config: str = "tiny"
    """Config name in that family."""
    optimized: bool = False
    """Write XLA's post-optimization (compiled, CPU) HLO instead of the lowered one."""

    def arguments(self) -> list[str]:
        """scripts/zoo.py's arguments that print this one file's text."""
        return [self.family, "--config", self.config, *(["--optimized"] if self.optimized else [])]

    def command(self) -> str:
        """The command that writes this one file."""
        return f"python scripts/zoo.py {' '.join(self.arguments())} --out examples/{self.file}"


EXAMPLES: tuple[Example, ...] = (
    Example("mlp.hlo", "mlp"),
    Example("gpt_tiny.hlo", "gpt"),
    Example("gpt_scan_tiny.hlo", "gpt_scan"),
    Example("moe_tiny.hlo", "moe"),
    Example("wresnet_tiny.hlo", "wresnet"),
    Example("unet_tiny.hlo", "unet"),
    Example("dnabert_tiny.hlo", "dnabert"),
    Example("vgg19_tiny.hlo", "vgg19"),
    Example("mlp_optimized.hlo", "mlp", optimized=True),
)


def _spec_name(family: str, config: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", f"{family}_{config}")


def model_spec(
    family: str, config: str | None = None, overrides: Mapping[str, Any] = {}
) -> ModelSpec:
    """The spec of ``family`` at ``config`` (the family default when None) with fields replaced.

    Raises ``ZooError`` for an unknown family, config or field.
    """
    if family not in FAMILIES:
        raise ZooError(f"unknown model {family!r}; expected one of {', '.join(FAMILIES)}")
    fam = FAMILIES[family]
    name = config or fam.default
    if name not in fam.configs:
        raise ZooError(
            f"unknown config {name!r} for {family}; expected one of {', '.join(fam.configs)}"
        )
    cfg = fam.configs[name]
    fields = {f.name for f in dataclasses.fields(cfg)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ZooError(
            f"{family} has no setting {', '.join(unknown)}; settings: {', '.join(sorted(fields))}"
        )
    suffix = "".join(f"_{k}{v}" for k, v in sorted(overrides.items()))
    return fam.build(_spec_name(family, name + suffix), dataclasses.replace(cfg, **overrides))


def lower(spec: ModelSpec) -> jax.stages.Lowered:
    """The training step of ``spec`` traced on abstract inputs and lowered for CPU."""
    traced = jax.jit(make_train_step(spec)).trace(*abstract_args(spec))
    return traced.lower(lowering_platforms=("cpu",))


def hlo_text(spec: ModelSpec) -> str:
    """Pre-optimization HLO text of the training step (no metadata, no fusions)."""
    return lower(spec).as_text(dialect="hlo")


def optimized_hlo_text(spec: ModelSpec) -> str:
    """Post-optimization HLO text of the training step, compiled for the host CPU.

    Locations are reduced to the innermost user frame and file names to their path under
    scripts/, so the text depends neither on the checkout's location nor on the caller.
    """
    with (
        jax_config.hlo_source_file_canonicalization_regex(r".*/scripts/"),
        jax_config.include_full_tracebacks_in_locations(False),
        jax.default_device(jax.devices("cpu")[0]),
    ):
        text = lower(spec).compile().as_text()
    if text is None:
        raise ZooError(f"{spec.name}: XLA returned no text for the compiled module")
    return text


def example_text(example: Example) -> str:
    """The text of one committed example, regenerated."""
    spec = model_spec(example.family, example.config)
    return optimized_hlo_text(spec) if example.optimized else hlo_text(spec)


def examples_readme(texts: Mapping[str, str]) -> str:
    """examples/README.md for the given example texts (file name -> text)."""
    lines = [
        "# Example HLO modules",
        "",
        "Generated by `python scripts/zoo.py --examples`; do not edit by hand",
        "(tests/test_zoo.py regenerates them and compares byte for byte).",
        "Each is one full training step (forward, backward, Adam update) of a tiny",
        "configuration, all float32 apart from int32 token ids, labels and the Adam step",
        "count; every batch dimension (and GPT/BERT sequence, MoE expert count) is a",
        "multiple of 8. All are pre-optimization HLO except `mlp_optimized.hlo`, XLA's",
        "CPU-compiled module (fusions, metadata, FileNames/StackFrames sections).",
        "",
        "Entry parameters, in order: the leaves of `params`, `adam_m`, `adam_v` (same",
        "structure; dict keys sorted, list order kept), `adam_count` (s32[]), then the",
        "leaves of `batch`. JAX names them by path, e.g. `params__layers___0___attn____wq__.1`,",
        "`adam_m__head__.1`, `adam_count.1`, `batch__tokens__.1`. The root tuple is",
        "(loss, new params..., new adam_m..., new adam_v..., new adam_count).",
        "",
        "| file | model | bytes | instructions | regenerate |",
        "|---|---|---:|---:|---|",
    ]
    for ex in EXAMPLES:
        text = texts[ex.file]
        model = f"{ex.family} --config {ex.config}" + (" (optimized)" if ex.optimized else "")
        lines.append(
            f"| `{ex.file}` | {model} | {len(text.encode())} | {count_instructions(text)}"
            f" | `{ex.command()}` |"
        )
    lines += ["", "Larger models are generated on demand; `python scripts/zoo.py --list`.", ""]
    return "\n".join(lines)


def write_examples(out_dir: Path) -> dict[str, str]:
    """Regenerate every example and the README into ``out_dir``; file name -> text."""
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = {ex.file: example_text(ex) for ex in EXAMPLES}
    texts["README.md"] = examples_readme(texts)
    for file, text in texts.items():
        (out_dir / file).write_text(text)
    return texts


def listing() -> str:
    """Human-readable list of families and their configs."""
    lines = []
    for fam in FAMILIES.values():
        lines.append(f"{fam.name:10s} {fam.summary}")
        for name, cfg in fam.configs.items():
            fields = ", ".join(f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg))
            lines.append(f"  {name:10s} {fields}")
    return "\n".join(lines)


def parse_sets(sets: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs from ``--set``; values are ints, else floats."""
    out: dict[str, Any] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise ZooError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                raise ZooError(f"--set {key}: expected a number, got {value!r}") from None
    return out


EPILOG = """\b
Examples:
  python scripts/zoo.py --list
  python scripts/zoo.py gpt --config medium --out /tmp/gpt_medium.hlo
  python scripts/zoo.py gpt --config hidden512 --layers 72 --out /tmp/gpt72.hlo
  python scripts/zoo.py moe --config 32e-10b --batch 16 --out /tmp/moe10b.hlo
  python scripts/zoo.py wresnet --config wr-1.3b --set width_factor=4 --out /tmp/wr.hlo
  python scripts/zoo.py --examples
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model", required=False)
@click.option("--config", "config", help="Named configuration (default: tiny).")
@click.option("--layers", type=int, help="Override the layer count (depth for wresnet).")
@click.option("--batch", type=int, help="Override the batch size.")
@click.option("--seq", type=int, help="Override the sequence length.")
@click.option("--vocab", type=int, help="Override the vocabulary size.")
@click.option("--experts", type=int, help="Override the MoE expert count.")
@click.option("--classes", type=int, help="Override the classifier width.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override any field.")
@click.option("--optimized", is_flag=True, help="Write XLA's compiled (CPU) HLO instead.")
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="Output file (default: stdout)."
)
@click.option("--list", "list_", is_flag=True, help="List models and configs.")
@click.option("--examples", is_flag=True, help="Regenerate the committed examples.")
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=EXAMPLES_DIR,
    show_default=True,
    help="Where --examples writes.",
)
def main(
    model: str | None,
    config: str | None,
    layers: int | None,
    batch: int | None,
    seq: int | None,
    vocab: int | None,
    experts: int | None,
    classes: int | None,
    sets: tuple[str, ...],
    optimized: bool,
    out: Path | None,
    list_: bool,
    examples: bool,
    out_dir: Path,
) -> None:
    """Write HLO text of MODEL's full training step (see --list for models and configs)."""
    try:
        if list_:
            click.echo(listing())
        elif examples:
            for file, text in write_examples(out_dir).items():
                click.echo(f"{out_dir / file}: {len(text.encode())} bytes", err=True)
        elif model is None:
            raise ZooError("give a MODEL, --list or --examples (see --help)")
        else:
            named = dict(
                layers=layers, batch=batch, seq=seq, vocab=vocab, experts=experts, classes=classes
            )
            overrides = {k: v for k, v in named.items() if v is not None} | parse_sets(sets)
            start = time.perf_counter()
            spec = model_spec(model, config, overrides)
            text = optimized_hlo_text(spec) if optimized else hlo_text(spec)
            seconds = time.perf_counter() - start
            if out is None:
                click.echo(text, nl=False)
            else:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(text)
            click.echo(
                f"{spec.name}: {count_instructions(text)} instructions, {len(text.encode())} bytes,"
                f" {seconds:.1f} s" + (f" -> {out}" if out else ""),
                err=True,
            )
    except ZooError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
