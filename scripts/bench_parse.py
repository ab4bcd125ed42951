#!/usr/bin/env python
"""Parse throughput of rhino against XLA's own HLO parser, side by side, same files.

    python scripts/bench_parse.py                 # examples + a 72-layer GPT
    python scripts/bench_parse.py --layers 112    # a bigger GPT (about 75k instructions)
    python scripts/bench_parse.py --out bench/parse.json FILE.hlo ...

For each file it reports instructions/s of rhino's lazy parse (attribute values decoded
on demand), rhino's eager parse (every attribute and literal decoded and checked), and
XLA's `hlo_module_from_text`, each the best of --repeat runs, interleaved so that load on
this shared machine hits all of them alike. Large models are generated with scripts/zoo.py
into generated/ (not committed).

It also times the whole command as a user runs it: `python -m rhino.cli.main parse FILE`
(and with `--json`) in a fresh process, wall clock from start to exit (interpreter start,
imports, read, parse, eager check, verify, summary, output), against XLA's in-process
parse of the same text measured in the same rounds; and the command's peak RSS (the
child's ru_maxrss). The command runs from compiled bytecode, as an installed rhino does
(one untimed run first writes it). `--no-command` leaves the command out.
"""

from __future__ import annotations

import gc
import json
import os
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


_LAUNCHER = """
import json, os, subprocess, sys, time
for line in sys.stdin:
    t = time.perf_counter()
    proc = subprocess.Popen(json.loads(line), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    code = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    print(json.dumps([wall, cpu, usage.ru_maxrss * 1024, code, err.decode()]), flush=True)
"""


class CommandTimer:
    """Runs commands from a small launcher process and reports each one's wall time, CPU
    time and peak RSS.

    Not straight from this process: Linux carries a process's peak RSS over `exec` into
    the child's `ru_maxrss`, so a child of this process (jax loaded: hundreds of MiB)
    would report this process's peak, not its own. The launcher is a bare Python.
    """

    def __init__(self) -> None:
        # as an installed rhino runs: from compiled bytecode (PYTHONDONTWRITEBYTECODE,
        # set in some development shells, would have every run compile rhino's sources)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def run(self, args: list[str]) -> tuple[float, float, int]:
        """Run `python -m rhino.cli.main ARGS` (output discarded); its wall and CPU (user
        + system) time in seconds and peak resident memory in bytes. Exits if it fails."""
        cmd = [sys.executable, "-m", "rhino.cli.main", *args]
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        wall, cpu, rss, code, err = json.loads(self.proc.stdout.readline())
        if code != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({code}):\n{err}")
        return wall, cpu, rss

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


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
    "--command/--no-command",
    default=True,
    show_default=True,
    help="Also time the whole `rhino parse FILE` command (and with --json).",
)
@click.option(
    "--out", default="bench/parse.json", show_default=True, type=click.Path(dir_okay=False)
)
def main(files: tuple[str, ...], layers: int, repeat: int, command: bool, out: str) -> None:
    from rhino.hlo.parser import parse_module
    from rhino.runtime.xla_bridge import xla_parse_only

    paths = [Path(f) for f in files] or [
        *sorted((ROOT / "examples").glob("*.hlo")),
        ensure_gpt(layers),
    ]
    timer = CommandTimer() if command else None
    if timer is not None:  # untimed: writes the bytecode of the modules parse imports
        timer.run(["parse", str(paths[0])])
    rows = []
    for path in paths:
        text = path.read_text()
        n = parse_module(text).instruction_count
        lazy = eager = xla = cmd = cmd_json = cmd_cpu = float("inf")
        rss = 0
        for _ in range(repeat):  # interleaved: each round runs every one of them once
            lazy = min(lazy, best_of(lambda text=text: parse_module(text), 1))
            eager = min(eager, best_of(lambda text=text: parse_module(text, lazy=False), 1))
            xla = min(xla, best_of(lambda text=text: xla_parse_only(text), 1))
            if timer is not None:
                wall, cpu, peak = timer.run(["parse", str(path)])
                cmd, cmd_cpu = min(cmd, wall), min(cmd_cpu, cpu)
                wall, _, peak_json = timer.run(["parse", str(path), "--json"])
                cmd_json = min(cmd_json, wall)
                rss = max(rss, peak, peak_json)
        whole = (
            {
                "command_s": cmd,
                "command_cpu_s": cmd_cpu,
                "command_json_s": cmd_json,
                "command_peak_rss_bytes": rss,
                "xla_vs_command": xla / cmd,
                "xla_vs_command_json": xla / cmd_json,
            }
            if command
            else {}
        )
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
                **whole,
            }
        )
    if timer is not None:
        timer.close()
    table = Table(
        title=f"parse throughput (instructions/s, best of {repeat}); the whole command "
        "(`rhino parse FILE` / `--json`, wall s) against XLA's in-process parse"
    )
    for col in (
        "file",
        "instructions",
        "rhino lazy",
        "rhino eager",
        "XLA",
        "lazy/XLA",
        "eager/XLA",
        *(("XLA s", "command s", "--json s", "XLA/command", "peak RSS") if command else ()),
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
            *(
                (
                    f"{r['xla_s']:.3f}",
                    f"{r['command_s']:.3f}",
                    f"{r['command_json_s']:.3f}",
                    f"{r['xla_vs_command']:.2f}x / {r['xla_vs_command_json']:.2f}x",
                    f"{r['command_peak_rss_bytes'] / 2**20:.0f} MiB",
                )
                if command
                else ()
            ),
        )
    Console(width=160).print(table)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(
        json.dumps({"benchmark": "parse", "repeat": repeat, "rows": rows}, indent=2)
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
