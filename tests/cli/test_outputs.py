"""Finished work is never lost to an output path: a missing folder is created, a path
that cannot be written is refused before any work, and a write that fails anyway keeps
the result in a temporary file that the error names."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from rhino.cli.main import cli
from tests.hlo.corpus import ROOT

MLP = str(ROOT / "examples" / "mlp.hlo")


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.parametrize(
    ("command", "option", "name"),
    [
        (["plan", MLP, "--mesh", "2x2"], "--out", "plan.json"),
        (["plan", MLP, "--mesh", "2x2"], "--emit-hlo", "realized.hlo"),
        (["parse", MLP], "--emit", "again.hlo"),
        (["parse", MLP], "--dot", "entry.dot"),
        (["pipeline", MLP, "--stages", "2"], "--out", "stages.json"),
        (["pipeline", MLP, "--stages", "2"], "--gantt", "schedule.svg"),
        (["pipeline", MLP, "--stages", "2"], "--dot", "stages.dot"),
    ],
)
def test_a_missing_folder_is_created(
    command: list[str], option: str, name: str, tmp_path: Path
) -> None:
    target = tmp_path / "new" / "deeper" / name
    r = invoke(*command, option, str(target))
    assert r.exit_code == 0, r.output
    assert target.stat().st_size > 0


@pytest.mark.parametrize(
    "command",
    [
        ["plan", MLP, "--mesh", "2x2", "--out"],
        ["parse", MLP, "--emit"],
        ["pipeline", MLP, "--stages", "2", "--gantt"],
        ["sweep", "nothing.yaml", "--out"],
        ["run", MLP, "--mesh", "2", "--gantt"],
    ],
)
def test_an_unwritable_path_is_refused_before_any_work(command: list[str], tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    start = time.perf_counter()
    r = invoke(*command, str(blocker / "out.json"))
    assert r.exit_code == 2
    assert "cannot create the folder" in r.output and str(blocker) in r.output
    assert time.perf_counter() - start < 5  # refused while parsing the options
    r = invoke(*command, str(tmp_path))  # a folder, not a file name
    assert r.exit_code == 2 and "is a directory" in r.output


def test_a_failed_write_keeps_the_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "plan.json"
    real = Path.write_text

    def full_disk(self: Path, *args: object, **kwargs: object) -> int:
        if self == target:
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    r = invoke("plan", MLP, "--mesh", "2x2", "--out", str(target))
    assert r.exit_code == 2
    assert f"cannot write the plan to {target}: No space left on device" in r.output
    kept = Path(r.output.split("it is saved in ")[1].split()[0])
    assert json.loads(kept.read_text())["schema"].startswith("rhino.plan/")
    kept.unlink()


def test_zoo_out_creates_its_folder(tmp_path: Path) -> None:
    target = tmp_path / "generated" / "mlp.hlo"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "zoo.py"), "mlp", "--out", str(target)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert target.read_text().startswith("HloModule")


def test_piped_reports_cut_and_fold_nothing() -> None:
    """CliRunner's stdout is a pipe: rich's 80 columns would cut names with '…' and fold
    lines; a pipe gets the whole width."""
    r = invoke("plan", MLP, "--mesh", "2x4", "--all")
    assert r.exit_code == 0 and "…" not in r.output
    assert "level 2 (one ILP over the merged graph): 163 nodes, 24 backbone" in r.output
    assert max(len(line) for line in r.output.splitlines()) > 80
    r = invoke("pipeline", MLP, "--stages", "2")
    assert r.exit_code == 0 and "…" not in r.output
    assert "┃ weights ┃" in r.output and "┃ sends (to stage: bytes) ┃" in r.output


@pytest.mark.parametrize("args", [["parse", MLP], ["plan", MLP, "--mesh", "2x4", "--all"]])
def test_a_reader_that_goes_away_ends_rhino_quietly_with_141(args: list[str]) -> None:
    """`rhino ... | head -1`: exit 141 as SIGPIPE would, no traceback; 1 means a check failed.
    The pipe holds one page (the least Linux allows), so a report longer than that cannot
    be all written before the reader goes away (in a 64 KiB pipe the plan's 19 kB could,
    on a loaded machine, and rhino rightly exited 0)."""
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, 4096)
    process = subprocess.Popen(
        [sys.executable, "-m", "rhino.cli", *args], stdout=write, stderr=subprocess.PIPE
    )
    os.close(write)
    assert process.stderr is not None
    os.read(read, 1)
    os.close(read)  # the reader goes away after its first byte
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err


def test_exit_codes_are_one_table_in_help_and_readme() -> None:
    from rhino.hlo.errors import EXIT_CODES

    text = invoke("--help").output
    readme = (ROOT / "README.md").read_text()
    for code, meaning in EXIT_CODES.items():
        assert f"  {code:<4} {meaning}" in text
        assert (
            f"| {code} | {meaning.replace('|', chr(92) + '|').replace('--debug', '`--debug`')} |"
            in readme
        )


def test_progress_off_a_terminal_is_lines_on_stderr(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["plan", MLP, "--mesh", "2x4"])
    lines = r.stderr.splitlines()
    assert lines[0] == f"rhino: planning {MLP} on 2x4 (0 s, limit 60 s)"
    assert any(line.endswith(": building strategies") for line in lines)
    assert "rhino:" not in r.stdout
    r = CliRunner().invoke(cli, ["plan", MLP, "--mesh", "2x4", "--json"])
    assert "rhino:" not in r.stderr  # --json: the output is for a program
    (tmp_path / "mlp.hlo").write_text(Path(MLP).read_text())
    (tmp_path / "sweep.yaml").write_text("models: [mlp.hlo]\nmeshes: [2, 4]\n")
    r = CliRunner().invoke(cli, ["sweep", str(tmp_path / "sweep.yaml"), "--jobs", "1"])
    lines = r.stderr.splitlines()
    assert lines[0] == "rhino: planning 2 entries"
    assert lines[1].startswith("rhino: [1/2, ") and "mlp.hlo 2 O2 m8" in lines[1]
    assert lines[2].startswith("rhino: [2/2, ")
