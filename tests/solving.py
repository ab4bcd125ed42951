"""Solver options for tests that assert what a search proves (optimality, equality with
another level), not how fast: the limit is far beyond what any test's instance needs,
so the outcome does not depend on the machine's speed or load."""

from __future__ import annotations

from rhino.search.problem import SolveOptions

TO_THE_END = SolveOptions(time_limit_s=3600)
