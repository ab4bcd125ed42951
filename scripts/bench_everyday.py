"""Issue 29's commands ("Plans in seconds") as a user runs them: wall time and peak memory
against the issue's targets, and beside a base revision's.

    python scripts/bench_everyday.py                          # this tree, 3 runs a row
    python scripts/bench_everyday.py --base 4a55e77 --repeat 5 --out bench/everyday.json
    python scripts/bench_everyday.py --only demo --only help

Rows, with the issue's targets (for a quiet 2-core machine):

    demo       rhino plan examples/gpt_tiny.hlo --mesh 2x8 --opt O2      <= 1.5 s
    devices    rhino plan examples/gpt_tiny.hlo --devices 8              <= 4 s
    gpt72      rhino plan generated/gpt_hidden512_layers72.hlo --mesh 2x8
                                                        <= 10 s, peak RSS <= 0.7 GiB
    gpt2_48    rhino plan generated/real/hf_gpt2.hlo --mesh 2x4 --opt O2      <= 15 s
    t5_large   rhino plan generated/real/hf_t5.hlo --mesh 2x4 --opt O2        <= 15 s
    qwen_moe   rhino plan generated/real/keras_qwen_moe.hlo --mesh 2x4 --opt O2  <= 15 s
    parse      rhino parse generated/real/keras_qwen_moe.hlo  (the whole command)
                                                 at least as fast as XLA's parser in-process
    help       rhino --help                                              <= 0.15 s

The real steps are exported by scripts/export_corpus.py, each from the virtual
environment that has its library: GPT-2 with 48 layers (transformers' Flax GPT-2, 32.9k
instructions), T5-large's depth and widths (transformers' Flax T5, 24 + 24 blocks,
d_model 1024, d_ff 4096; 32 heads of 32 where T5-large has 16 of 64, the same projection
shapes; 30.2k instructions) and Qwen-MoE with 24 layers (keras_hub, 37.9k instructions),
all with the corpus's vocabulary of 1000, batch 8 and sequence 64.
Only the 72-layer GPT and the real steps are not committed (generated/ is git-ignored); a
row whose input is missing, or was exported with another config (read from
generated/real/VERSIONS.json), is skipped with the command that makes it. Each
<name>.hlo.gz is unzipped beside it once, and the rows read that text (as the 72-layer GPT
is read).

Each run is a fresh `python -m rhino.cli.main ARGS` (`benchlib.measure`: wall time, and
the peak RSS of the process, or of its largest worker for `--devices`), `--repeat` runs a
row, from compiled bytecode (one untimed plan of examples/mlp.hlo at each revision writes
it first); with `--base REV` the base revision (installed by `benchlib.installed`) and
this tree run in turn, base first, so that the machine's load hits both alike. A target
is met when the best run meets it (on a loaded machine the best run is the nearest to a
quiet one); the table also shows the median. The parse row's reference is XLA's
`hlo_module_from_text` on the same text in this process, timed as scripts/bench_parse.py
does, once in each round. The JSON (`--out`) has every run and the load average at the
start, at each row's start and at the end.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from bench_parse import best_of
from benchlib import (
    ROOT,
    count_instructions,
    installed,
    measure,
    mib,
    revision,
    rhino_command,
    rhino_env,
)
from rich.console import Console
from rich.table import Table

REAL = ROOT / "generated" / "real"
"""Where the real steps are exported (git-ignored)."""
GPT72 = ROOT / "generated" / "gpt_hidden512_layers72.hlo"


@dataclass(frozen=True)
class Input:
    """A file a row reads, and how to make it when it is not committed."""

    path: Path
    make: str = ""
    """The command that writes it (empty: committed)."""
    config: dict[str, int] = field(default_factory=dict)
    """Knobs that generated/real/VERSIONS.json must record for it (a real step)."""


def _real(name: str, venv: str, **config: int) -> Input:
    knobs = " ".join(f"--{k} {v}" for k, v in config.items())
    make = f"{venv}/bin/python scripts/export_corpus.py --out generated/real --only {name} {knobs}"
    return Input(REAL / f"{name}.hlo.gz", make, config)


TINY = Input(ROOT / "examples" / "gpt_tiny.hlo")
GPT72_INPUT = Input(
    GPT72,
    "python scripts/zoo.py gpt --config hidden512 --layers 72 --out "
    + str(GPT72.relative_to(ROOT)),
)
GPT2_48 = _real("hf_gpt2", ".venv-corpus", layers=48)
T5_LARGE = _real("hf_t5", ".venv-corpus", layers=24, hidden=1024)
QWEN_MOE_24 = _real("keras_qwen_moe", ".venv-keras", layers=24)


@dataclass(frozen=True)
class Row:
    """One command of the issue's table and its target."""

    key: str
    """Short name (for --only)."""
    args: tuple[str, ...]
    """rhino's arguments; the input file's path is written `{}`."""
    source: Input | None
    """The input file (None: the command reads none)."""
    target_s: float | None = None
    """Wall-time target in seconds."""
    target_rss_bytes: int | None = None
    """Peak-RSS target in bytes."""
    xla_parse: bool = False
    """Target: the whole command at least as fast as XLA's parser on the same text."""


ROWS = (
    Row("demo", ("plan", "{}", "--mesh", "2x8", "--opt", "O2"), TINY, target_s=1.5),
    Row("devices", ("plan", "{}", "--devices", "8"), TINY, target_s=4.0),
    Row(
        "gpt72",
        ("plan", "{}", "--mesh", "2x8"),
        GPT72_INPUT,
        target_s=10.0,
        target_rss_bytes=int(0.7 * 2**30),
    ),
    Row("gpt2_48", ("plan", "{}", "--mesh", "2x4", "--opt", "O2"), GPT2_48, target_s=15.0),
    Row("t5_large", ("plan", "{}", "--mesh", "2x4", "--opt", "O2"), T5_LARGE, target_s=15.0),
    Row("qwen_moe", ("plan", "{}", "--mesh", "2x4", "--opt", "O2"), QWEN_MOE_24, target_s=15.0),
    Row("parse", ("parse", "{}"), QWEN_MOE_24, xla_parse=True),
    Row("help", ("--help",), None, target_s=0.15),
)


WARM_UP = ("plan", "examples/mlp.hlo", "--mesh", "2x2")
"""Run once, untimed, at each revision first: a quick plan that imports the parser and the
planner, so that no timed run compiles rhino's sources to bytecode."""


def short_hash(rev: str) -> str:
    """`rev` (a branch, a tag, HEAD~2) as the commit it names now."""
    git = ["git", "-C", str(ROOT), "rev-parse", "--short", rev]
    return subprocess.run(git, check=True, capture_output=True, text=True).stdout.strip()


def missing(source: Input) -> str | None:
    """Why `source` cannot be used as it is (absent, or exported with another config), with
    the command that makes it; None when it can."""
    rel = source.path.relative_to(ROOT)
    if not source.path.exists():
        return f"{rel} is missing: make it with `{source.make}`"
    if source.config:
        record = source.path.parent / "VERSIONS.json"
        versions = json.loads(record.read_text()) if record.exists() else {}
        got = versions.get(source.path.name.removesuffix(".hlo.gz"), {}).get("config", {})
        wrong = {k: got.get(k) for k, v in source.config.items() if got.get(k) != v}
        if wrong:
            return f"{rel} was exported with {wrong}, not {source.config}: `{source.make}`"
    return None


def plain_text(source: Input) -> Path:
    """`source` as plain HLO text: itself, or its .hlo.gz unzipped beside it (once), so that
    rhino reads text as a user's exported step would be (and, in the parse row, as XLA
    does)."""
    if source.path.suffix != ".gz":
        return source.path
    plain = source.path.with_suffix("")
    if not plain.exists() or plain.stat().st_mtime < source.path.stat().st_mtime:
        plain.write_text(gzip.decompress(source.path.read_bytes()).decode())
    return plain


def xla_parse_s(text: str) -> float:
    """XLA's `hlo_module_from_text` on `text` in this process, seconds (one run, as
    scripts/bench_parse.py times it)."""
    from rhino.runtime.xla_bridge import xla_parse_only

    return best_of(lambda: xla_parse_only(text), 1)


def run_once(
    row: str, args: tuple[str, ...], name: str, site: Path | None, timeout_s: float
) -> dict[str, Any]:
    """`rhino ARGS` once with rhino from `site` (None: this tree): wall, peak RSS, exit
    status (and the end of stderr when it failed)."""
    done = measure(rhino_command(args), env=rhino_env(site), timeout_s=timeout_s)
    run = {"wall_s": done.wall_s, "peak_rss_bytes": done.peak_rss_bytes, "exit": done.returncode}
    say = f"{row} {name}: {done.wall_s:.2f} s, {mib(done.peak_rss_bytes)}"
    if done.returncode:
        run["stderr"] = done.stderr[-2000:]
        say += f", exit {done.returncode}"
    print(say, file=sys.stderr)
    return run


def run_row(
    row: Row, sites: dict[str, Path | None], repeat: int, timeout_s: float
) -> dict[str, Any]:
    """`repeat` rounds of the row, each one run at each revision in turn (and, for the parse
    row, one XLA parse); or the row skipped, saying why."""
    doc: dict[str, Any] = {"key": row.key, "target_s": row.target_s}
    doc.update(target_rss_bytes=row.target_rss_bytes, loadavg=os.getloadavg())
    why = missing(row.source) if row.source else None
    if why:
        return {**doc, "skipped": why}
    path = plain_text(row.source) if row.source else None
    args = tuple(str(path.relative_to(ROOT)) if a == "{}" and path else a for a in row.args)
    doc["command"] = "rhino " + " ".join(args)
    text = path.read_text() if path else ""
    if path:
        doc["instructions"] = count_instructions(text)
    if row.xla_parse:
        xla_parse_s(text)  # untimed: the first call also imports jax and starts its client
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sites}
    xla: list[float] = []
    for _ in range(repeat):
        for name, site in sites.items():
            runs[name].append(run_once(row.key, args, name, site, timeout_s))
        if row.xla_parse:
            xla.append(xla_parse_s(text))
    xla_s = min(xla) if xla else None
    doc.update(runs=runs, xla_parse_s=xla_s)
    doc["summary"] = {name: summarize(row, rows, xla_s) for name, rows in runs.items()}
    return doc


def summarize(row: Row, runs: list[dict[str, Any]], xla_s: float | None) -> dict[str, Any]:
    """Best and median wall time and peak RSS of one revision's successful runs, how many
    failed, and whether the best run meets the row's targets (not if any run failed)."""
    ok = [r for r in runs if r["exit"] == 0]
    out: dict[str, Any] = {"failed": len(runs) - len(ok)}
    if not ok:
        return {**out, "met": False}
    walls = [r["wall_s"] for r in ok]
    rss = [r["peak_rss_bytes"] for r in ok]
    out.update(best_s=min(walls), median_s=statistics.median(walls))
    out.update(best_rss_bytes=min(rss), median_rss_bytes=statistics.median(rss))
    met = len(ok) == len(runs)
    if row.target_s is not None:
        met = met and out["best_s"] <= row.target_s
    if row.target_rss_bytes is not None:
        met = met and out["best_rss_bytes"] <= row.target_rss_bytes
    if xla_s is not None:
        out["vs_xla"] = xla_s / out["best_s"]  # above 1: the command beats XLA's parse alone
        met = met and out["vs_xla"] >= 1.0
    return {**out, "met": met}


def _target(row: Row, doc: dict[str, Any]) -> str:
    parts = [f"<= {row.target_s:g} s"] if row.target_s is not None else []
    if row.target_rss_bytes is not None:
        parts.append(f"<= {mib(row.target_rss_bytes)}")
    if row.xla_parse:
        parts.append(f">= XLA's {doc['xla_parse_s']:.2f} s")
    return ", ".join(parts)


def _met(summary: dict[str, Any]) -> str:
    ratio = f" ({summary['vs_xla']:.2f}x XLA)" if "vs_xla" in summary else ""
    failed = f", {summary['failed']} failed" if summary["failed"] else ""
    return ("yes" if summary["met"] else "NO") + ratio + failed


def _s(x: float | None) -> str:
    """Seconds: three decimals under one (--help's target is 0.15 s), two above."""
    return "-" if x is None else f"{x:.3f}" if x < 1 else f"{x:.2f}"


def render(rows: list[dict[str, Any]], names: list[str], title: str) -> Table:
    """Per row, one line per revision: its runs, best and median wall time, median peak
    RSS, whether the target is met; with a base, this tree's line ends with this tree over
    the base (best wall, median RSS; below 1: faster, smaller)."""
    table = Table(title=title, show_lines=True)
    table.add_column("command", overflow="fold", max_width=40)
    for col in ("instr.", "target", "revision", "runs s", "best s", "median s", "RSS", "met"):
        table.add_column(col, justify="left" if col in ("revision", "runs s") else "right")
    if len(names) == 2:
        table.add_column("this/base wall, RSS", justify="right")
    by_key = {r.key: r for r in ROWS}
    for doc in rows:
        if "skipped" in doc:
            table.add_row(doc["key"], "", "", "skipped: " + doc["skipped"])
            continue
        stats = [doc["summary"][name] for name in names]
        for i, (name, s) in enumerate(zip(names, stats, strict=True)):
            head = ["", "", ""]
            if i == 0:
                n = doc.get("instructions")
                head = [doc["command"], f"{n:,}" if n else "", _target(by_key[doc["key"]], doc)]
            runs = " / ".join(
                _s(r["wall_s"]) + (f" (exit {r['exit']})" if r["exit"] else "")
                for r in doc["runs"][name]
            )
            cells = [*head, name, runs, _s(s.get("best_s")), _s(s.get("median_s"))]
            cells += [mib(s.get("median_rss_bytes")), _met(s)]
            if i == 1 and "best_s" in s and "best_s" in stats[0]:
                base = stats[0]
                wall = s["best_s"] / base["best_s"]
                rss = s["median_rss_bytes"] / base["median_rss_bytes"]
                cells.append(f"{wall:.2f}x, {rss:.2f}x")
            table.add_row(*cells)
    return table


@click.command()
@click.option("--base", help="Also run each row at this revision, in turn with this tree.")
@click.option("--repeat", default=3, show_default=True, help="Runs of each row (per revision).")
@click.option(
    "--only", multiple=True, type=click.Choice([r.key for r in ROWS]), help="Run only these rows."
)
@click.option(
    "--timeout",
    "timeout_s",
    default=600.0,
    show_default=True,
    help="Seconds before a run is killed.",
)
@click.option(
    "--out", default="bench/everyday.json", show_default=True, type=click.Path(dir_okay=False)
)
def main(base: str | None, repeat: int, only: tuple[str, ...], timeout_s: float, out: str) -> None:
    """Time issue 29's commands against their targets (and a base revision's)."""
    here = revision("search", "hlo", "runtime", "cli")
    load_start = os.getloadavg()
    rows = [r for r in ROWS if not only or r.key in only]
    with contextlib.ExitStack() as stack:
        sites: dict[str, Path | None] = {}
        if base:
            base = short_hash(base)
            sites[base] = stack.enter_context(installed(base))
        sites[here if here != base else f"{here} (tree)"] = None
        for site in sites.values():  # untimed: writes the bytecode of what plan imports
            measure(rhino_command(WARM_UP), env=rhino_env(site))
        docs = [run_row(row, sites, repeat, timeout_s) for row in rows]
    doc = {
        "benchmark": "everyday",
        "revision": here,
        "base": base,
        "repeat": repeat,
        "cpus": os.cpu_count(),
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "rows": docs,
    }
    load = ", ".join(f"{x:.1f}" for x in load_start)
    title = f"issue 29's commands, best of {repeat} (load average at the start: {load})"
    Console(width=180).print(render(docs, list(sites), title))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"JSON: {out}")


if __name__ == "__main__":
    main()
