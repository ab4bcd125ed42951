"""The model zoo (scripts/zoo.py): committed examples never drift, and every one parses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from jax._src.lib import xla_client

from tests.compile_flags import FUSION_EMITTERS_OFF

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import zoo  # noqa: E402
from zoo_models import moe  # noqa: E402

REGENERATE = "regenerate with `python scripts/zoo.py --examples` and review the diff"
EXAMPLE_IDS = [ex.file for ex in zoo.EXAMPLES]


@pytest.fixture(scope="module")
def regenerated() -> dict[str, str]:
    """Every example regenerated in memory (a compiled one by `scripts/zoo.py` in a
    process of its own, `_compiled_as_by_default`), plus the README built from them."""
    texts = {
        ex.file: _compiled_as_by_default(ex) if ex.optimized else zoo.example_text(ex)
        for ex in zoo.EXAMPLES
    }
    texts["README.md"] = zoo.examples_readme(texts)
    return texts


def _compiled_as_by_default(example: zoo.Example) -> str:
    """A compiled example as `python scripts/zoo.py` writes it with XLA's own code
    generation: in a process without FUSION_EMITTERS_OFF, which the tests compile with and
    which fuses differently (tests/compile_flags.py)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if f != FUSION_EMITTERS_OFF]
    argv = [sys.executable, str(REPO / "scripts" / "zoo.py"), *example.arguments()]
    env = {**os.environ, "XLA_FLAGS": " ".join(flags)}
    made = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert made.returncode == 0, made.stderr
    return made.stdout


@pytest.mark.skipif(
    jax.__version__ != zoo.EXPORTED_WITH_JAX,
    reason=f"the examples were lowered with jax {zoo.EXPORTED_WITH_JAX}; jax {jax.__version__} "
    "names some instructions differently",
)
@pytest.mark.parametrize("file", [*EXAMPLE_IDS, "README.md"])
def test_committed_example_matches_regenerated(file: str, regenerated: dict[str, str]) -> None:
    committed = (zoo.EXAMPLES_DIR / file).read_text()
    assert committed == regenerated[file], (
        f"examples/{file} differs from the zoo's output; {REGENERATE}"
    )


@pytest.mark.parametrize("file", EXAMPLE_IDS)
def test_example_parses_with_xla_and_counts_agree(file: str) -> None:
    text = (zoo.EXAMPLES_DIR / file).read_text()
    module = xla_client.hlo.hlo_module_from_text(text)
    xla_count = sum(len(c.instructions()) for c in module.computations())
    assert zoo.count_instructions(text) == xla_count
    assert len(text.encode()) < 300_000, f"examples/{file} is {len(text.encode())} bytes"


@pytest.mark.parametrize("file", EXAMPLE_IDS)
def test_example_sizes_split_over_eight_devices(file: str) -> None:
    example = next(ex for ex in zoo.EXAMPLES if ex.file == file)
    spec = zoo.model_spec(example.family, example.config)
    for name, arg in spec.batch.items():
        assert arg.shape[0] % 8 == 0, f"{file}: batch input {name} has shape {arg.shape}"
    cfg = zoo.FAMILIES[example.family].configs[example.config]
    for field in ("seq", "experts"):
        if hasattr(cfg, field):
            assert getattr(cfg, field) % 8 == 0, f"{file}: {field} = {getattr(cfg, field)}"


def test_step_signature_holds_params_adam_state_and_batch() -> None:
    spec = zoo.model_spec("mlp")
    text = zoo.hlo_text(spec)
    entry = text[text.index("\nENTRY ") :]
    n_params = 2 * 2  # two dense layers, w and b each
    assert entry.count(" parameter(") == 3 * n_params + 1 + len(spec.batch)
    for name in ("params_0___w__", "adam_m_0___w__", "adam_v_1___b__", "adam_count", "batch__x__"):
        assert f"\n  {name}.1 = " in entry, f"no parameter named {name} in the entry computation"


def test_optimized_example_is_compiled_hlo() -> None:
    text = (zoo.EXAMPLES_DIR / "mlp_optimized.hlo").read_text()
    assert "is_scheduled=true" in text.splitlines()[0]
    assert "\nFileNames\n" in text and "\nStackFrames\n" in text and " fusion(" in text
    assert "/work/" not in text, "absolute paths leaked into the optimized example"


def test_scan_gpt_holds_the_layer_stack_in_while_loops() -> None:
    text = (zoo.EXAMPLES_DIR / "gpt_scan_tiny.hlo").read_text()
    unrolled = (zoo.EXAMPLES_DIR / "gpt_tiny.hlo").read_text()
    assert text.count(" while(") == 2  # forward and backward
    assert " while(" not in unrolled


def test_moe_gating_respects_capacity_and_gate_weights() -> None:
    cfg = moe.CONFIGS["tiny"]
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, cfg.group_size, cfg.hidden)), jnp.float32)
    wg = jnp.asarray(rng.normal(size=(cfg.hidden, cfg.experts)), jnp.float32)
    combine, dispatch, aux = (np.asarray(a) for a in moe.top2_gating(x, wg, cfg))
    c = moe.capacity(cfg)
    assert combine.shape == dispatch.shape == (2, cfg.group_size, cfg.experts, c)
    assert dispatch.sum(axis=1).max() <= 1.0  # one token per expert slot
    per_token = dispatch.sum(axis=(2, 3))
    assert per_token.max() <= 2.0 and (per_token == 2.0).any() and (per_token < 2.0).any()
    kept_both = per_token == 2.0
    np.testing.assert_allclose(combine.sum(axis=(2, 3))[kept_both], 1.0, rtol=1e-5)
    assert np.isfinite(aux) and aux > 0.0


def test_cli_writes_one_model(tmp_path: Path) -> None:
    out = tmp_path / "gpt.hlo"
    result = CliRunner().invoke(
        zoo.main, ["gpt", "--layers", "1", "--batch", "16", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("HloModule jit_gpt_tiny_batch16_layers1_train_step,")
    assert "s32[16,64]" in text


def test_cli_lists_models_and_configs() -> None:
    result = CliRunner().invoke(zoo.main, ["--list"])
    assert result.exit_code == 0
    for name in ("gpt", "gpt_scan", "moe", "32e-10b", "hidden512", "wresnet", "vgg19"):
        assert name in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["transformer"], "unknown model 'transformer'"),
        (["gpt", "--config", "huge"], "unknown config 'huge' for gpt"),
        (["mlp", "--experts", "8"], "mlp has no setting experts"),
        (["moe", "--seq", "63"], "not a multiple of group_size 64"),
        (["gpt", "--set", "layers"], "--set expects KEY=VALUE"),
        ([], "give a MODEL"),
    ],
)
def test_cli_bad_input_exits_2_with_message(args: list[str], message: str) -> None:
    result = CliRunner().invoke(zoo.main, args)
    assert result.exit_code == 2
    assert message in result.output
