"""Every command on every real training step of the corpus (tests/data/corpus: steps
exported from HF transformers Flax + optax, Flax NNX, Equinox and Keras 3 `fit()`, with
dropout keys, schedules, metrics and masks), as a user runs them: parse, plan O2, run
the plan (verified), pipeline at 2 and 4 stages, each run with 4 micro-batches (verified,
bytes as predicted, tasks in the planned order), a hybrid plan and its run, and
--compare (of 4 devices). scripts/bench_corpus.py runs the same on larger exports and
times them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from tests.hlo.corpus import ROOT

CORPUS = ROOT / "tests" / "data" / "corpus"
FILES = sorted(CORPUS.glob("*.hlo.gz"))
MICROBATCHES = "4"
FAST = ("--steps", "1", "--warmup", "0")
"""Runs time one step: the numbers are checked, not the speed."""

CANNOT_MICROBATCH = {
    "keras_resnet18": "batch statistics",  # batch normalization
    "keras_qwen_moe": "needs the whole batch first",  # the router's load over the batch
}
"""Steps that truly cannot be cut into micro-batches: statistics over the whole batch
feed back into every example (batch normalization's mean and variance; a mixture of
experts' auxiliary loss, whose gradient weighs every token by the experts' load over the
batch), and the reason rhino gives. They run with 1 micro-batch."""


def name_of(path: Path) -> str:
    return path.name.removesuffix(".hlo.gz")


def rhino(*args: str) -> dict[str, Any]:
    """`rhino ARGS --json`, which must exit 0; its JSON document."""
    r = CliRunner().invoke(cli, [*args, "--json"])
    assert r.exit_code == 0, f"rhino {' '.join(args)}: exit {r.exit_code}\n{r.output}"
    return dict(json.loads(r.output))


def test_the_corpus_holds_every_library() -> None:
    names = {name_of(f) for f in FILES}
    versions = json.loads((CORPUS / "VERSIONS.json").read_text())
    assert names == set(versions)
    libraries = {v["library"].split(" ")[0].lower() for v in versions.values()}
    assert {"transformers", "flax", "equinox", "keras"} <= libraries
    assert all(v["config"]["batch"] == 8 for v in versions.values())


@pytest.mark.parametrize("path", FILES, ids=name_of)
def test_every_command_on_a_real_training_step(path: Path, tmp_path: Path) -> None:
    f = str(path)
    name = name_of(path)
    assert rhino("parse", f)["instructions"] > 500

    plan = str(tmp_path / "plan.json")
    rhino("plan", f, "--mesh", "2x4", "--time-limit", "2", "--out", plan)
    spmd = rhino("run", f, "--plan", plan, "--devices", "8", *FAST)
    assert spmd["verify"]["ok"], spmd["verify"]

    for d in (2, 4):
        stages = str(tmp_path / f"stages{d}.json")
        found = rhino("pipeline", f, "--stages", str(d), "--out", stages)
        # the loss the gradients differentiate: its forward is a third of the dot FLOPs
        assert 0.2 <= found["forward_share"] <= 0.5, found["loss"]
        assert found["cut_bytes"] <= min(
            b["cut_bytes"] for b in found["baselines"] if b["within_balance"]
        )
        run_stages(name, f, stages, d)

    hybrid = str(tmp_path / "hybrid.json")
    rhino("pipeline", f, "--mesh", "2x4", "--out", hybrid)
    run_stages(name, f, hybrid, 8, "--mesh", "2x4")

    # 4 devices: SPMD, pipeline and hybrid layouts all weighed, in half the time of 8
    compared = rhino("pipeline", f, "--compare", "4", "--time-limit", "2")
    assert compared["best"] is not None


def run_stages(name: str, f: str, plan: str, devices: int, *more: str) -> None:
    args = ("run", f, "--plan", plan, "--devices", str(devices), *more, *FAST)
    if name in CANNOT_MICROBATCH:
        r = CliRunner().invoke(cli, [*args, "--microbatches", MICROBATCHES])
        assert r.exit_code == 2 and CANNOT_MICROBATCH[name] in r.output, r.output
        assert "Traceback" not in r.output
        m = "1"
    else:
        m = MICROBATCHES
    doc = rhino(*args, "--microbatches", m)
    assert doc["verify"]["ok"], doc["verify"]["summary"]
    sent = doc["bytes"]
    assert sent["measured"] == sent["planned"] == sent["predicted"], sent
    assert doc["order"]["same"]
