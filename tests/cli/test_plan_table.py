"""`rhino plan`'s table of instructions: drawn line by line off a terminal, as rich
would draw it (rich takes seconds on a large model's thousands of rows), and every
layout shown as it is written (a strided one's `[s=1]` is no markup)."""

from __future__ import annotations

import io
import random
import string

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rhino.cli import plan_cmd
from rhino.cli.main import cli
from rhino.cli.plan_cmd import SHARDING, _drawn_table
from tests.hlo.corpus import ROOT


def drawn_by_rich(
    head: tuple[str, tuple[str, ...]], rows: list[tuple[str, ...]], width: int
) -> str:
    console = Console(file=io.StringIO(), width=width, highlight=False, soft_wrap=False)
    table = Table(title=head[0], title_justify="left")
    for col in head[1]:
        table.add_column(col)
    for row in rows:
        table.add_row(*map(Text, row))
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined, no-any-return]


def test_tables_are_drawn_as_rich_draws_them() -> None:
    rng = random.Random(29)
    alphabet = string.ascii_letters + string.digits + "%._[]{},=x "
    drawn = 0
    for _ in range(200):
        rows = [
            tuple("".join(rng.choices(alphabet, k=rng.randint(0, 40))) for _ in range(4))
            for _ in range(rng.randint(0, 20))
        ]
        width = rng.choice([60, 120, 10_000])
        mine = _drawn_table(SHARDING, rows, width)
        if mine is not None:
            drawn += 1
            assert mine == drawn_by_rich(SHARDING, rows, width), (rows, width)
    assert drawn > 50  # most fit; the others (a title or table wider) are rich's


def test_what_rich_would_fold_or_measure_is_left_to_it() -> None:
    assert _drawn_table(("a title wider than the table", ("a", "b")), [("x", "y")]) is None
    assert _drawn_table(SHARDING, [("%x", "dot", "f32[8]", "R" * 200)], width=100) is None
    assert _drawn_table(SHARDING, [("%ẋ", "dot", "f32[8]", "RR")]) is None


STRIDED = ROOT / "tests" / "data" / "strided_reshape.hlo"


@pytest.mark.parametrize("drawn", [True, False])
def test_a_strided_layout_is_shown_whole(drawn: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not drawn:  # as at a terminal: rich draws the table
        monkeypatch.setattr(plan_cmd, "_drawn_table", lambda *_args: None)
    args = ["plan", str(STRIDED), "--mesh", "1x4", "--pin", "p=RS1", "--pin", "out=RS1", "--all"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    row = next(line for line in r.output.splitlines() if "│ %r " in line)
    assert "RS0[s=1]" in row, row
