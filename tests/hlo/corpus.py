"""The HLO files the hlo tests run over: committed examples, snippets, test data."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def corpus_files() -> list[Path]:
    files = sorted((ROOT / "examples").glob("*.hlo"))
    files += sorted((ROOT / "tests" / "data" / "snippets").glob("*.hlo"))
    files += sorted((ROOT / "tests" / "data").glob("*.hlo"))
    files += sorted((ROOT / "tests" / "data" / "partitioned").glob("*.hlo"))
    return files


def corpus_ids() -> list[str]:
    return [str(p.relative_to(ROOT)) for p in corpus_files()]
