#!/usr/bin/env python
"""Parse throughput of rhino against XLA's own HLO parser, side by side, same files.

    python scripts/bench_parse.py                 # examples + a 72-layer GPT
    python scripts/bench_parse.py --layers 112    # a bigger GPT (about 75k instructions)
    python scripts/bench_parse.py --out bench/parse.json FILE.hlo ...

For each file it reports instructions/s of rhino's lazy parse (attribute values decoded
on demand), rhino's eager parse (every attribute and literal decoded and checked), and
XLA's `hlo_module_from_text`, each the best of --repeat runs, interleaved so that load on
this shared machine hits all three alike. Large models are generated with scripts/zoo.py
into generated/ (not committed).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def best_of(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def ensure_gpt(layers: int) -> Path:
    path = ROOT / "generated" / f"gpt_hidden512_layers{layers}.hlo"
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "scripts" / "zoo.py"),
                "gpt",
                "--config",
                "hidden512",
                "--layers",
                str(layers),
                "--out",
                str(path),
            ],
            check=True,
        )
    return path


@click.command()
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--layers", default=72, show_default=True, help="Layers of the generated hidden-512 GPT."
)
@click.option("--repeat", default=5, show_default=True, help="Runs per parser; the best is kept.")
@click.option(
    "--out", default="bench/parse.json", show_default=True, type=click.Path(dir_okay=False)
)
def main(files: tuple[str, ...], layers: int, repeat: int, out: str) -> None:
    from rhino.hlo.parser import parse_module
    from rhino.runtime.xla_bridge import xla_parse_only

    paths = [Path(f) for f in files] or [
        *sorted((ROOT / "examples").glob("*.hlo")),
        ensure_gpt(layers),
    ]
    rows = []
    for path in paths:
        text = path.read_text()
        n = parse_module(text).instruction_count
        lazy = eager = xla = float("inf")
        for _ in range(repeat):  # interleaved: each round runs all three once
            lazy = min(lazy, best_of(lambda text=text: parse_module(text), 1))
            eager = min(eager, best_of(lambda text=text: parse_module(text, lazy=False), 1))
            xla = min(xla, best_of(lambda text=text: xla_parse_only(text), 1))
        rows.append(
            {
                "file": str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path),
                "instructions": n,
                "bytes": len(text.encode()),
                "rhino_lazy_s": lazy,
                "rhino_eager_s": eager,
                "xla_s": xla,
                "rhino_lazy_per_s": n / lazy,
                "rhino_eager_per_s": n / eager,
                "xla_per_s": n / xla,
                "lazy_vs_xla": xla / lazy,
                "eager_vs_xla": xla / eager,
            }
        )
    table = Table(title=f"parse throughput (instructions/s, best of {repeat})")
    for col in (
        "file",
        "instructions",
        "rhino lazy",
        "rhino eager",
        "XLA",
        "lazy/XLA",
        "eager/XLA",
    ):
        table.add_column(col, justify="left" if col == "file" else "right")
    for r in rows:
        table.add_row(
            r["file"],
            f"{r['instructions']:,}",
            f"{r['rhino_lazy_per_s']:,.0f}",
            f"{r['rhino_eager_per_s']:,.0f}",
            f"{r['xla_per_s']:,.0f}",
            f"{r['lazy_vs_xla']:.2f}x",
            f"{r['eager_vs_xla']:.2f}x",
        )
    Console(width=160).print(table)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps({"benchmark": "parse", "repeat": repeat, "rows": rows}, indent=2)
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
