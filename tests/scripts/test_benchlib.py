"""scripts/benchlib.py's measurement of a command, and how scripts/bench_everyday.py judges
a row against its target."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import bench_everyday  # noqa: E402
import benchlib  # noqa: E402

MIB = 2**20
ALLOCATE = "b = bytearray({n} * 2**20); b[::4096] = b'x' * len(b[::4096])"
"""Python that allocates n MiB and touches every page (resident, not only reserved)."""


def test_measure_reads_the_commands_peak_rss() -> None:
    small = benchlib.measure([sys.executable, "-c", "pass"])
    big = benchlib.measure([sys.executable, "-c", ALLOCATE.format(n=200)])
    assert small.returncode == big.returncode == 0
    assert small.peak_rss_bytes < 100 * MIB
    assert big.peak_rss_bytes >= 200 * MIB
    assert big.peak_rss_bytes < small.peak_rss_bytes + 300 * MIB


def test_measure_does_not_read_this_processs_peak() -> None:
    """Linux carries a process's peak RSS into the program it execs: a command started
    straight from a large process would read at least that process's size."""
    ballast = bytearray(300 * MIB)
    ballast[::4096] = b"x" * len(ballast[::4096])
    done = benchlib.measure([sys.executable, "-c", "pass"])
    assert benchlib.own_peak_rss() >= 300 * MIB
    assert done.peak_rss_bytes < 100 * MIB


def test_measure_counts_descendants_the_command_leaves_behind() -> None:
    """A grandchild still running when the command exits (as a multiprocessing forkserver's
    workers are) is waited for and counted."""
    allocate = ALLOCATE.format(n=200)
    leave = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {allocate!r}])"
    done = benchlib.measure([sys.executable, "-c", leave])
    assert done.returncode == 0
    assert done.peak_rss_bytes >= 200 * MIB


def test_measure_passes_exit_status_and_output_through() -> None:
    script = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"
    done = benchlib.measure([sys.executable, "-c", script])
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def _runs(*walls: float, exit: int = 0) -> list[dict[str, float | int]]:
    return [{"wall_s": w, "peak_rss_bytes": 100 * MIB, "exit": exit} for w in walls]


def test_a_target_is_met_by_the_best_run() -> None:
    row = bench_everyday.Row("r", ("--help",), None, target_s=1.0, target_rss_bytes=200 * MIB)
    met = bench_everyday.summarize(row, _runs(3.0, 0.9, 2.0), None)
    assert met["met"] and met["best_s"] == 0.9 and met["median_s"] == 2.0
    assert not bench_everyday.summarize(row, _runs(1.1, 1.2), None)["met"]
    failed = bench_everyday.summarize(row, [*_runs(0.1, exit=1), *_runs(3.0)], None)
    assert not failed["met"] and failed["failed"] == 1 and failed["best_s"] == 3.0
    tight = bench_everyday.Row("r", ("--help",), None, target_s=1.0, target_rss_bytes=50 * MIB)
    assert not bench_everyday.summarize(tight, _runs(0.5), None)["met"]


def test_the_parse_row_is_met_when_the_command_beats_xla() -> None:
    row = bench_everyday.Row("parse", ("parse", "{}"), None, xla_parse=True)
    assert bench_everyday.summarize(row, _runs(0.8), 1.0) == {
        "failed": 0,
        "best_s": 0.8,
        "median_s": 0.8,
        "best_rss_bytes": 100 * MIB,
        "median_rss_bytes": 100 * MIB,
        "vs_xla": 1.25,
        "met": True,
    }
    assert not bench_everyday.summarize(row, _runs(1.25), 1.0)["met"]


def test_a_missing_input_says_how_to_make_it() -> None:
    absent = bench_everyday.Input(REPO / "generated" / "real" / "absent.hlo.gz", "make it")
    assert bench_everyday.missing(absent) == (
        "generated/real/absent.hlo.gz is missing: make it with `make it`"
    )
