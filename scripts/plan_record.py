#!/usr/bin/env python
"""Record what rhino decides on every example and corpus step, and compare two records:
the check that a refactoring changed no behaviour.

    python scripts/plan_record.py record --out before.json     # on the old tree
    python scripts/plan_record.py record --out after.json      # on the new one
    python scripts/plan_record.py compare before.json after.json

For each model (examples/*.hlo, tests/data/corpus/*.hlo.gz; `--only` picks by name):

    plan      O2 on meshes 1x8 and 2x4 (cluster m8): the objective, compute and
              communication seconds, peak memory, the solver's status, and a digest of
              every instruction's strategy (the plan itself, not only its cost)
    pipeline  2 and 4 stages (8 micro-batches, m8): the cut bytes, the imbalance, each
              schedule's simulated step, and a digest of the stage of every instruction

`compare` prints a table of every model and what differs, and exits 1 when anything
does (objectives compared to 1e-9 relative; digests exactly). A model that failed is
recorded with its error, and compared as such.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import ROOT, revision

MESHES = ("1x8", "2x4")
STAGES = (2, 4)
RELATIVE = 1e-9


def models(only: str | None) -> list[Path]:
    found = sorted((ROOT / "examples").glob("*.hlo")) + sorted(
        (ROOT / "tests" / "data" / "corpus").glob("*.hlo.gz")
    )
    names = set(only.split(",")) if only else None
    return [p for p in found if names is None or _name(p) in names]


def _name(path: Path) -> str:
    return path.name.removesuffix(".gz").removesuffix(".hlo")


def _digest(items: list[Any]) -> str:
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()[:16]


def _step_s(schedule: Any) -> float:
    """A stage plan's schedule: a `ScheduleReport`, or a dict in a tree from before it."""
    return float(schedule["step_s"] if isinstance(schedule, dict) else schedule.step_s)


def _stage_of(inst: Any) -> tuple[str, int]:
    """(name, stage) of a stage plan's instruction: an `InstructionStage`, or a dict in a
    tree from before it."""
    if isinstance(inst, dict):
        return str(inst["name"]), int(inst["stage"])
    return inst.name, inst.stage


def record_model(path: Path, time_limit_s: float) -> dict[str, Any]:
    from rhino.hlo.parser import parse_file
    from rhino.search.cluster import load_cluster
    from rhino.search.mesh import parse_mesh
    from rhino.search.pipeline import PipelineRequest, plan_pipeline
    from rhino.search.problem import SolveOptions

    try:
        from rhino.search.spmd.planner import PlanRequest, make_plan
    except ImportError:  # a tree from before search/spmd/ (the record of a refactoring's start)
        from rhino.search.planner import PlanRequest, make_plan  # type: ignore[no-redef]

    cluster = load_cluster("m8")
    module = parse_file(path)
    found: dict[str, Any] = {}
    for mesh in MESHES:
        key = f"plan {mesh}"
        try:
            request = PlanRequest(
                parse_mesh(mesh), cluster, "O2", solve=SolveOptions(time_limit_s=time_limit_s)
            )
            plan = make_plan(module, request)
            found[key] = {
                "objective_s": plan.objective_s,
                "compute_s": plan.compute_s,
                "comm_s": plan.comm_s,
                "peak_memory_bytes": plan.peak_memory_bytes,
                "status": plan.solver.status.value,
                "strategies": _digest([(i.name, i.strategy) for i in plan.instructions]),
            }
        except Exception as e:  # recorded, and compared as such
            found[key] = {"error": f"{type(e).__name__}: {e}"}
    for stages in STAGES:
        key = f"pipeline {stages}"
        try:
            staged = plan_pipeline(
                module,
                PipelineRequest(stages, None, 8, cluster, SolveOptions(time_limit_s=time_limit_s)),
            )
            found[key] = {
                "cut_bytes": staged.cut_bytes,
                "imbalance": staged.imbalance,
                "epsilon": staged.epsilon,
                "steps_s": {n: _step_s(s) for n, s in staged.schedules.items()},
                "stages": _digest(sorted(_stage_of(i) for i in staged.instructions)),
            }
        except Exception as e:
            found[key] = {"error": f"{type(e).__name__}: {e}"}
    return found


def differences(before: Any, after: Any, where: str = "") -> list[str]:
    """Where two records differ (numbers to RELATIVE, everything else exactly)."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in sorted(set(before) | set(after)):
            if key not in before or key not in after:
                out.append(f"{where}{key}: only in {'after' if key in after else 'before'}")
            else:
                out += differences(before[key], after[key], f"{where}{key}.")
        return out
    numbers = (int, float)
    if isinstance(before, numbers) and isinstance(after, numbers) and not isinstance(before, bool):
        if math.isclose(before, after, rel_tol=RELATIVE, abs_tol=1e-15):
            return []
    elif before == after:
        return []
    return [f"{where.rstrip('.')}: {before!r} -> {after!r}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="Plan and pipeline every model; write the record.")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--only", help="Comma-separated model names (default: all).")
    rec.add_argument(
        "--time-limit",
        type=float,
        default=600.0,
        help="Seconds per search (default %(default)s: long enough that every "
        "search finishes, so that records compare; a search cut short by its limit "
        "depends on the machine's load).",
    )
    cmp = sub.add_parser("compare", help="Compare two records; exit 1 on any difference.")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    cmp.add_argument(
        "--only", help="Comma-separated model names: compare these (default: every model)."
    )
    args = parser.parse_args()
    if args.command == "record":
        rows = {}
        for path in models(args.only):
            start = time.perf_counter()
            rows[_name(path)] = record_model(path, args.time_limit)
            print(
                f"{_name(path)}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True
            )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        import rhino.search

        source = str(Path(rhino.search.__file__).resolve().parent.parent)  # the rhino recorded
        args.out.write_text(
            json.dumps(
                {
                    "revision": revision("hlo", "search", "runtime", "cli"),
                    "source": source,
                    "models": rows,
                },
                indent=1,
            )
            + "\n"
        )
        print(f"wrote {args.out}: {len(rows)} models")
        return 0
    before = json.loads(args.before.read_text())
    after = json.loads(args.after.read_text())
    print(
        f"before {before['revision']} ({before.get('source', '?')}), "
        f"after {after['revision']} ({after.get('source', '?')})"
    )
    if args.only:
        names = set(args.only.split(","))
        for record in (before, after):
            record["models"] = {k: v for k, v in record["models"].items() if k in names}
    found = differences(before["models"], after["models"])
    for name in sorted(set(before["models"]) | set(after["models"])):
        mine = [d for d in found if d.startswith(f"{name}.")]
        print(f"{name:24} {'same' if not mine else f'{len(mine)} differences'}")
    for line in found:
        print(f"  {line}")
    print(f"{'no' if not found else len(found)} differences")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
