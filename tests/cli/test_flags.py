from __future__ import annotations

import pytest

from rhino.cli.flags import flag, in_flags, shown
from rhino.hlo.errors import ConfigError, ExecutionError


@pytest.mark.parametrize(
    ("parameter", "expected"),
    [("stages", "--stages"), ("time_limit", "--time-limit"), ("budget_bytes", "--memory")],
)
def test_a_parameter_is_shown_as_its_flag(parameter: str, expected: str) -> None:
    assert flag(parameter) == expected


def test_the_leading_option_and_backquoted_hints_become_flags() -> None:
    error = ConfigError("stages 0: more stages than the 3 forward instructions", "stages")
    assert shown(error) == "--stages 0: more stages than the 3 forward instructions"
    hint = ExecutionError("need 8 devices, have 1 on cpu (set `devices` / more)")
    assert shown(hint) == "need 8 devices, have 1 on cpu (set --devices / more)"


def test_only_named_parameters_in_backquotes_change() -> None:
    text = "raise `epsilon` (see `rhino pipeline --help`); epsilon is a share"
    assert in_flags(text) == "raise --epsilon (see `rhino pipeline --help`); epsilon is a share"
