"""Every command on every real training step of the corpus (tests/data/corpus, or another
export of scripts/export_corpus.py), as a user runs them, on simulated CPU devices.

    python scripts/bench_corpus.py                                  # the committed corpus
    python scripts/bench_corpus.py --dir /tmp/corpus_b8 --out bench/corpus.json
    python scripts/bench_corpus.py --only hf_gpt2 --only keras_t5

Per file, each through the `rhino` CLI with `--json` (8 simulated devices), timed:
    parse; plan --mesh 2x4 (O2); run of that plan (SPMD, verified);
    pipeline --stages 2 and 4; run --plan of each with 4 micro-batches (verified, bytes
    between stages predicted/measured, task order as planned);
    pipeline --mesh 2x4 (hybrid) and its run with 4 micro-batches; pipeline --compare 8.
The table has, per file: the loss found and its forward's share of the dot FLOPs, the
cut bytes against the best baseline's (2 and 4 stages), the micro-batch runs verified,
bytes predicted/measured, order as planned, the seconds of every command together and the
largest peak RSS of one command (`benchlib.measure`; the JSON has every command's). A step that
cannot be cut into micro-batches exactly is refused (exit 2, the reason kept) and run
again with 1. A command that exits non-zero otherwise is a failure (its message is kept);
the script exits 1 if any did.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from benchlib import ROOT, measure, mib, revision, rhino_command
from rich.console import Console
from rich.table import Table

CORPUS = ROOT / "tests" / "data" / "corpus"
MICROBATCHES = "4"


def commands(hlo: Path, work: Path) -> list[tuple[str, list[str]]]:
    """(name, rhino arguments) in the order they run; later ones read earlier outputs."""
    f = str(hlo)
    m = MICROBATCHES
    out = [
        ("parse", ["parse", f]),
        ("plan", ["plan", f, "--mesh", "2x4", "--out", str(work / "plan.json")]),
        ("run", ["run", f, "--plan", str(work / "plan.json"), "--devices", "8"]),
    ]
    for d in (2, 4):
        stages = str(work / f"stages{d}.json")
        out.append((f"pipeline{d}", ["pipeline", f, "--stages", str(d), "--out", stages]))
        out.append(
            (f"run{d}", ["run", f, "--plan", stages, "--devices", str(d), "--microbatches", m])
        )
    hybrid = str(work / "hybrid.json")
    out.append(("hybrid", ["pipeline", f, "--mesh", "2x4", "--out", hybrid]))
    out.append(
        (
            "run_hybrid",
            ["run", f, "--plan", hybrid, "--mesh", "2x4", "--devices", "8", "--microbatches", m],
        )
    )
    out.append(("compare", ["pipeline", f, "--compare", "8"]))
    return out


def run_rhino(args: list[str]) -> tuple[int, dict[str, Any] | None, str, float, int]:
    """Exit code, the --json document (None when there is none), stderr's last error
    line, wall seconds and peak RSS bytes (`benchlib.measure`)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    done = measure(rhino_command([*args, "--json"]), env=env, cwd=Path.cwd())
    try:
        doc = json.loads(done.stdout) if done.stdout.strip() else None
    except json.JSONDecodeError:
        doc = None
    errors = [line for line in done.stderr.splitlines() if line.startswith(("error", "internal"))]
    return done.returncode, doc, errors[-1] if errors else "", done.wall_s, done.peak_rss_bytes


def bench_file(hlo: Path, say: Any) -> dict[str, Any]:
    """Every command on one file (module docstring)."""
    name = hlo.name.removesuffix(".gz").removesuffix(".hlo")
    row: dict[str, Any] = {"file": name, "commands": {}}
    with tempfile.TemporaryDirectory(prefix=f"rhino-{name}-") as tmp:
        for command, args in commands(hlo, Path(tmp)):
            say(f"{name}: {command}")
            code, doc, error, seconds, peak = run_rhino(args)
            refused = ""
            if code == 2 and "cannot cut the step into micro-batches" in error:
                # a step that truly cannot be cut: refused with the reason, run with one
                refused = error
                say(f"{name}: {command} with 1 micro-batch")
                code, doc, error, more, again = run_rhino([*args[:-1], "1"])
                seconds, peak = seconds + more, max(peak, again)
            row["commands"][command] = {
                "exit": code,
                "seconds": round(seconds, 2),
                "peak_rss_bytes": peak,
                "error": error,
                "refused": refused,
                **_facts(command, doc),
            }
    return row


def _facts(command: str, doc: dict[str, Any] | None) -> dict[str, Any]:
    """What the table shows of one command's --json output."""
    if doc is None:
        return {}
    if command.startswith(("pipeline", "hybrid")):
        balanced = [b for b in doc["baselines"] if b["within_balance"]]
        return {
            "loss": doc["loss"],
            "forward_share": doc["forward_share"],
            "cut_bytes": doc["cut_bytes"],
            "epsilon": doc["epsilon"],
            "best_baseline_bytes": min((b["cut_bytes"] for b in balanced), default=None),
        }
    if command == "run":
        return {"verified": doc["verify"]["ok"] if doc.get("verify") else None}
    if command.startswith("run"):
        sent = doc["bytes"]
        return {
            "verified": doc["verify"]["ok"] if doc.get("verify") else None,
            "predicted_bytes": sent["predicted_total"],
            "measured_bytes": sent["measured_total"],
            "order_as_planned": doc["order"]["same"],
            "microbatches": doc["microbatches"],
        }
    if command == "compare":
        best = doc.get("best") or {}
        return {"best": f"{best.get('kind')} {best.get('mesh')}"}
    return {}


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.2f}"


def render(rows: list[dict[str, Any]], console: Console) -> None:
    t = Table(title="every command on every corpus file (4 micro-batches, 8 CPU devices)")
    for col in (
        "file",
        "loss (fwd share)",
        "cut MiB d=2 / best baseline",
        "cut MiB d=4 / best baseline",
        "runs verified",
        "micro-batches",
        "bytes pred / meas MiB",
        "order",
        "failed",
        "seconds",
        "peak RSS (command)",
    ):
        t.add_column(col, overflow="fold")
    for row in rows:
        c = row["commands"]
        p2, p4 = c.get("pipeline2", {}), c.get("pipeline4", {})
        runs = [c[k] for k in ("run", "run2", "run4", "run_hybrid") if k in c]
        staged = [c[k] for k in ("run2", "run4", "run_hybrid") if k in c]
        failed = [k for k, v in c.items() if v["exit"] != 0]
        peak_name, peak = max(c.items(), key=lambda kv: kv[1]["peak_rss_bytes"])
        t.add_row(
            row["file"],
            f"%{p2.get('loss')} ({p2.get('forward_share', 0):.0%})" if p2.get("loss") else "-",
            f"{_mib(p2.get('cut_bytes'))} / {_mib(p2.get('best_baseline_bytes'))}",
            f"{_mib(p4.get('cut_bytes'))} / {_mib(p4.get('best_baseline_bytes'))}",
            f"{sum(1 for r in runs if r.get('verified'))}/{len(runs)}",
            "1 (refused 4)" if any(r.get("refused") for r in staged) else MICROBATCHES,
            "; ".join(
                f"{_mib(r.get('predicted_bytes'))}/{_mib(r.get('measured_bytes'))}" for r in staged
            ),
            f"{sum(1 for r in staged if r.get('order_as_planned'))}/{len(staged)}",
            ", ".join(failed) or "-",
            f"{sum(v['seconds'] for v in c.values()):.0f}",
            f"{mib(peak['peak_rss_bytes'])} ({peak_name})",
        )
    console.print(t)


@click.command()
@click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    default=CORPUS,
    show_default=True,
    help="Folder of NAME.hlo.gz training steps.",
)
@click.option("--only", multiple=True, help="Only these files (name without .hlo.gz).")
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="Write the rows as JSON here."
)
def main(folder: Path, only: tuple[str, ...], out: Path | None) -> None:
    """Every rhino command on every real training step of a corpus folder."""
    files = sorted(folder.glob("*.hlo.gz"))
    if only:
        files = [f for f in files if f.name.removesuffix(".hlo.gz") in only]
    if not files:
        raise click.UsageError(f"no .hlo.gz file in {folder}" + (f" named {only}" if only else ""))
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    rows = []
    for hlo in files:
        rows.append(bench_file(hlo, lambda text: console.print(text, style="dim")))
        if out:  # rows as they finish
            out.write_text(json.dumps({"revision": revision(), "rows": rows}, indent=1) + "\n")
    render(rows, Console())
    if any(v["exit"] != 0 for row in rows for v in row["commands"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
