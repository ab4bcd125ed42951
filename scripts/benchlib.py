"""What the benchmark scripts share: the revision a run measured, JSON of dataclasses, and
the instruction count of HLO text.

Imported as `benchlib` by scripts run as `python scripts/<bench>.py` (scripts/ is then
on sys.path).
"""

from __future__ import annotations

import subprocess
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def revision(*paths: str) -> str:
    """HEAD's short hash, with "+dirty" when `paths` (e.g. "search", "hlo") differ from it."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--", *paths], capture_output=True, text=True
    )
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def count_instructions(text: str) -> int:
    """Instructions of an HLO module: lines with `` = `` inside computation bodies."""
    count, inside = 0, False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith("{") and not line.startswith((" ", "HloModule")):
            inside = True
        elif stripped == "}":
            inside = False
        elif inside and " = " in line:
            count += 1
    return count


def json_default(value: object) -> object:
    """`json.dumps(default=...)`: dataclasses as dicts, anything else as its str."""
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)  # type: ignore[call-overload]
    return str(value)
