"""Sweeps: a batch of plans, (model x mesh x level x cluster x memory), read from YAML.

A sweep file (configs/sweeps/*.yaml):

    models: ["../../examples/*.hlo"]   # files or globs, relative to this YAML file: HLO or
                                       #   StableHLO text, HloModuleProtos, XLA dump folders
                                       #   (a folder by its path: globs match files; a
                                       #   dump's module is picked as `rhino.runtime.sources`
                                       #   says)
    meshes: ["1x8", "2x4"]             # device meshes, outermost axis first
    levels: [O2, O3]                   # optional, default [O2]
    clusters: [m8]                     # optional, default [m8]; a name or a YAML path
                                       #   (a path is relative to this YAML file)
    memory: [null, 16GiB]              # optional, default [null]: per-device budgets;
                                       #   null = the cluster's device memory,
                                       #   "unlimited" = no budget
    time_limit: 60                     # optional, default 60: solver seconds per entry
    threads: 2                         # optional, default as `rhino plan`: solver threads
    entries:                           # optional: more entries, after the product above
      - {model: ../../generated/gpt_medium.hlo, mesh: "1x8", memory: 16GiB}
      - {model: "../../examples/mlp*.hlo", mesh: ["1x2", "1x4"], time_limit: 5}

The top-level lists make a cartesian product (model outermost, then mesh, level,
cluster, memory). Each item of `entries` is a small product of its own: `model` is
required; `mesh`, `level`, `cluster`, `memory` take one value or a list and default to
the top-level lists; `time_limit` and `threads` default to the top-level values.
`models` needs `meshes` (or every entry its own `mesh`). A single value may stand where a
list is expected. A glob that matches no file is an error in the sweep file; a plain path
that does not exist is not: its rows fail when they run.

An entry's row holds what `rhino plan MODEL --mesh M --opt L --cluster C --memory B
--time-limit T` would predict. Rows come back in the order above, whatever order the
worker processes finish in. A row that fails (a RhinoError such as an infeasible memory
budget or an unreadable model, or a bug) carries status "error" and the message; the
other rows still run.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import signal
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, dataclass, fields
from itertools import product
from pathlib import Path
from typing import Any

import yaml

from rhino.hlo.errors import ConfigError, RhinoError
from rhino.hlo.verify import verify
from rhino.runtime import sources
from rhino.search.cluster import Cluster, load_cluster, parse_quantity
from rhino.search.mesh import DeviceMesh, parse_mesh
from rhino.search.problem import SolveOptions
from rhino.search.spmd.planner import LEVELS, PlanRequest, make_plan
from rhino.search.workers import worker_context, workers_can_start
from rhino.search.yamldoc import YamlReader, load, read_text

SWEEP_SCHEMA = "rhino.sweep/1"
"""`schema` of the JSON documents `rhino sweep` writes."""

UNLIMITED = "unlimited"
DEVICE = "device"

_TOP_KEYS = ("models", "meshes", "levels", "clusters", "memory", "time_limit", "threads", "entries")
_ENTRY_KEYS = ("model", "mesh", "level", "cluster", "memory", "time_limit", "threads")


@dataclass(frozen=True)
class SweepEntry:
    """One plan to make: everything resolved, ready to send to a worker process."""

    model: str
    """The model (HLO or StableHLO text, an HloModuleProto, an XLA dump folder: see
    `rhino.runtime.sources`), relative to the working directory when inside it."""
    mesh: DeviceMesh
    """The device mesh to plan for."""
    level: str
    """Search level (one of `rhino.search.spmd.plan.LEVELS`)."""
    cluster: Cluster
    """The cluster, loaded (workers need no cluster files)."""
    memory: str
    """The budget as written: "16GiB", "device" (the cluster's memory) or "unlimited"."""
    budget_bytes: float | None
    """The budget in bytes; None for no budget."""
    time_limit_s: float
    """Solver time limit (the best plan so far is kept when it is hit)."""
    threads: int
    """Solver threads."""


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep file."""

    source: str
    """The file, as given."""
    entries: tuple[SweepEntry, ...]
    """In the order of the file (see the module doc)."""


@dataclass(frozen=True)
class SweepRow:
    """The outcome of one entry. Field names are the stable CSV/JSON column names."""

    model: str
    """HLO file (see `SweepEntry.model`)."""
    mesh: str
    """"1x8"."""
    level: str
    """Search level."""
    cluster: str
    """The cluster's name."""
    memory: str
    """The budget as written (see `SweepEntry.memory`)."""
    budget_bytes: float | None
    """The budget in bytes; None for no budget."""
    status: str
    """"ok" or "error"."""
    message: str
    """Why the entry failed; "" when it did not."""
    step_ms: float | None = None
    """Estimated step time: compute plus communication."""
    compute_ms: float | None = None
    """Estimated compute time (FLOPs over device throughput)."""
    comm_ms: float | None = None
    """Estimated communication time (collectives in instructions and reshards)."""
    peak_memory_bytes: float | None = None
    """Predicted peak memory per device."""
    search_s: float | None = None
    """Planning time (strategies, ILP), without parsing."""
    solver_status: str | None = None
    """"optimal", or "feasible" when the time limit stopped the solver."""
    solver_gap: float | None = None
    """Relative gap between the plan and the solver's lower bound."""
    nodes: int | None = None
    """Nodes of the sharding problem."""
    warnings: int | None = None
    """How many warnings the plan carries (e.g. replicated fallbacks)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(SweepRow))
"""Column names, in order, of the CSV and JSON outputs."""


# -- reading a sweep file ----------------------------------------------------------------------


def load_sweep(path: str | os.PathLike[str]) -> Sweep:
    """Read and check a sweep file; every error is a ConfigError naming file, key, line:col."""
    name = os.fspath(path)
    return load_sweep_text(read_text(name, "the sweep file"), name, Path(name).parent)


def load_sweep_text(
    text: str, source: str = "<string>", base: str | os.PathLike[str] = "."
) -> Sweep:
    """Read a sweep from YAML text; paths in it are relative to `base`."""
    reader, node = load(text, source)
    if node is None:
        raise ConfigError(f"{source}: empty sweep file (expected keys {', '.join(_TOP_KEYS)})")
    return _SweepReader(reader, Path(base)).sweep(node)


class _SweepReader(YamlReader):
    """The sweep's keys, read from its node tree (errors carry file, key and line:col)."""

    def __init__(self, reader: YamlReader, base: Path) -> None:
        super().__init__(reader.source, reader.loader)
        self.base = base
        self.clusters: dict[str, Cluster] = {}

    def sweep(self, root: yaml.Node) -> Sweep:
        top = self.mapping(root, "", _TOP_KEYS)
        time_limit = self.time_limit(top.get("time_limit"), "time_limit", 60.0)
        threads = self.threads(top.get("threads"), "threads", SolveOptions().threads)
        defaults = {
            "mesh": self.meshes(top["meshes"], "meshes") if "meshes" in top else None,
            "level": self.levels(top["levels"], "levels") if "levels" in top else ["O2"],
            "cluster": self.clusters_of(top.get("clusters"), "clusters"),
            "memory": self.memory(top.get("memory"), "memory"),
        }
        entries: list[SweepEntry] = []
        if "models" in top:
            if defaults["mesh"] is None:
                raise self.fail(root, "meshes", "missing (every sweep of `models` needs meshes)")
            models = self.models(top["models"], "models")
            entries += self.expand(models, defaults, time_limit, threads)
        for i, item in enumerate(self.items(top["entries"], "entries") if "entries" in top else []):
            entries += self.entry(item, f"entries[{i}]", defaults, time_limit, threads)
        if not entries:
            raise self.fail(root, "", "no entries: give `models` and `meshes`, or `entries`")
        return Sweep(self.source, tuple(entries))

    def entry(
        self, node: yaml.Node, key: str, defaults: dict[str, Any], time_limit: float, threads: int
    ) -> list[SweepEntry]:
        doc = self.mapping(node, key, _ENTRY_KEYS)
        if "model" not in doc:
            raise self.fail(node, f"{key}.model", "missing")
        own = dict(defaults)
        if "mesh" in doc:
            own["mesh"] = self.meshes(doc["mesh"], f"{key}.mesh")
        elif defaults["mesh"] is None:
            raise self.fail(node, f"{key}.mesh", "missing (and no top-level `meshes`)")
        if "level" in doc:
            own["level"] = self.levels(doc["level"], f"{key}.level")
        if "cluster" in doc:
            own["cluster"] = self.clusters_of(doc["cluster"], f"{key}.cluster")
        if "memory" in doc:
            own["memory"] = self.memory(doc["memory"], f"{key}.memory")
        models = self.models(doc["model"], f"{key}.model")
        time_limit = self.time_limit(doc.get("time_limit"), f"{key}.time_limit", time_limit)
        threads = self.threads(doc.get("threads"), f"{key}.threads", threads)
        return self.expand(models, own, time_limit, threads)

    def expand(
        self, models: list[str], d: dict[str, Any], time_limit: float, threads: int
    ) -> list[SweepEntry]:
        """The product models x meshes x levels x clusters x memory, model outermost."""
        out = []
        for model, mesh, level, cluster, (key, node) in product(
            models, d["mesh"], d["level"], d["cluster"], d["memory"]
        ):
            label, budget = self.budget(node, key, cluster)
            out.append(SweepEntry(model, mesh, level, cluster, label, budget, time_limit, threads))
        return out

    # -- one key each --------------------------------------------------------------------------

    def models(self, node: yaml.Node, key: str) -> list[str]:
        out = []
        for i, item in enumerate(self.items(node, key)):
            text = self.string(item, f"{key}[{i}]")
            path = self.base / Path(text).expanduser()
            if not glob.has_magic(text):
                out.append(_shown(path))
                continue
            matches = sorted(p for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
            if not matches:
                raise self.fail(
                    item, f"{key}[{i}]", f"{text!r} matches no file (looked for {_shown(path)})"
                )
            out += [_shown(Path(p)) for p in matches]
        return out

    def meshes(self, node: yaml.Node, key: str) -> list[DeviceMesh]:
        out = []
        for i, item in enumerate(self.items(node, key)):
            value = self.scalar(item)
            if isinstance(value, bool) or not isinstance(value, str | int):
                raise self.fail(item, f"{key}[{i}]", f'expected a mesh like "2x4", got {value!r}')
            try:
                out.append(parse_mesh(str(value)))
            except ConfigError as e:
                raise self.fail(item, f"{key}[{i}]", str(e)) from None
        return out

    def levels(self, node: yaml.Node, key: str) -> list[str]:
        out = []
        for i, item in enumerate(self.items(node, key)):
            level = self.string(item, f"{key}[{i}]")
            if level not in LEVELS:
                raise self.fail(
                    item,
                    f"{key}[{i}]",
                    f"level {level!r} is not available; choose one of {', '.join(LEVELS)}",
                )
            out.append(level)
        return out

    def clusters_of(self, node: yaml.Node | None, key: str) -> list[Cluster]:
        if node is None:
            return [self.cluster("m8", node, key)]
        return [
            self.cluster(self.string(item, f"{key}[{i}]"), item, f"{key}[{i}]")
            for i, item in enumerate(self.items(node, key))
        ]

    def cluster(self, text: str, node: yaml.Node | None, key: str) -> Cluster:
        looks_like_path = text.endswith((".yaml", ".yml")) or "/" in text or os.sep in text
        name = _shown(self.base / text) if looks_like_path else text
        if name not in self.clusters:
            try:
                self.clusters[name] = load_cluster(name)
            except ConfigError as e:
                if node is None:
                    raise ConfigError(f"{self.source}: default cluster: {e}") from None
                raise self.fail(node, key, str(e)) from None
        return self.clusters[name]

    def memory(self, node: yaml.Node | None, key: str) -> list[tuple[str, yaml.Node | None]]:
        """(key, node) per budget; no node stands for the default, null."""
        if node is None:
            return [(key, None)]
        if isinstance(node, yaml.SequenceNode):
            return [(f"{key}[{i}]", item) for i, item in enumerate(self.items(node, key))]
        return [(key, node)]

    def budget(
        self, node: yaml.Node | None, key: str, cluster: Cluster
    ) -> tuple[str, float | None]:
        """(label, bytes) of one budget, for `cluster` (null: its device memory)."""
        value = None if node is None else self.scalar(node)
        if value is None:
            return DEVICE, cluster.memory_bytes
        if value == UNLIMITED:
            return UNLIMITED, None
        try:
            return str(value), parse_quantity(value, "bytes")
        except ValueError as e:
            assert node is not None
            raise self.fail(
                node, key, f"{e}, null (the cluster's memory) or {UNLIMITED!r}"
            ) from None

    def time_limit(self, node: yaml.Node | None, key: str, default: float) -> float:
        if node is None:
            return default
        value = self.scalar(node)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise self.fail(node, key, f"expected seconds greater than 0, got {value!r}")
        return float(value)

    def threads(self, node: yaml.Node | None, key: str, default: int) -> int:
        return default if node is None else self.positive_int(node, key)


def _shown(path: Path) -> str:
    """A path as a user would write it: relative to the working directory when inside it,
    else absolute (normalized, symbolic links kept)."""
    absolute = os.path.abspath(path)
    try:
        rel = os.path.relpath(absolute)
    except ValueError:  # another drive
        return absolute
    return absolute if rel.startswith("..") else rel


# -- running -----------------------------------------------------------------------------------


def run_entry(entry: SweepEntry, tracebacks: bool = False) -> SweepRow:
    """Parse, verify and plan one entry; never raises (a failure is a row with status error)."""
    head = _row_head(entry)
    try:
        module = sources.load(entry.model).module
        verify(module)
        solve = SolveOptions(time_limit_s=entry.time_limit_s, threads=entry.threads)
        request = PlanRequest(
            entry.mesh, entry.cluster, entry.level, entry.budget_bytes, solve=solve
        )
        plan = make_plan(module, request)
    except RhinoError as e:
        return SweepRow(**head, status="error", message=str(e))
    except Exception as e:  # a bug in rhino: reported in the row, the sweep goes on
        return SweepRow(**head, status="error", message=_internal(e, tracebacks))
    return SweepRow(
        **head,
        status="ok",
        message="",
        step_ms=plan.objective_s * 1e3,
        compute_ms=plan.compute_s * 1e3,
        comm_ms=plan.comm_s * 1e3,
        peak_memory_bytes=plan.peak_memory_bytes,
        search_s=plan.search_time_s,
        solver_status=plan.solver.status.value,
        solver_gap=plan.solver.gap,
        nodes=plan.problem.get("nodes"),
        warnings=len(plan.warnings),
    )


def run_sweep(
    entries: Sequence[SweepEntry],
    jobs: int = 1,
    on_row: Callable[[int, SweepRow], None] | None = None,
    tracebacks: bool = False,
) -> list[SweepRow]:
    """One row per entry, in the order of `entries`.

    jobs > 1 runs the entries in that many worker processes (each parses its model);
    jobs == 1 runs them here, one after the other, as does a process whose workers
    cannot start (`workers_can_start`). `on_row(index, row)` is called as each
    entry finishes (in completion order). `tracebacks` appends the Python traceback to
    the message of an internal error.
    """
    if jobs < 1:
        raise ConfigError(f"jobs must be at least 1, got {jobs}")
    report = on_row or (lambda _i, _row: None)
    rows: list[SweepRow | None] = [None] * len(entries)
    if jobs == 1 or len(entries) <= 1 or not workers_can_start():
        for i, entry in enumerate(entries):
            rows[i] = run_entry(entry, tracebacks)
            report(i, rows[i])  # type: ignore[arg-type]
        return rows  # type: ignore[return-value]
    pool = ProcessPoolExecutor(
        max_workers=min(jobs, len(entries)),
        mp_context=worker_context("rhino.runtime.sweep"),
        initializer=ignore_interrupts,
    )
    try:
        futures: dict[Future[SweepRow], int] = {
            pool.submit(run_entry, entry, tracebacks): i for i, entry in enumerate(entries)
        }
        for future in as_completed(futures):
            i = futures[future]
            try:
                row = future.result()
            except BrokenProcessPool:  # a worker was killed: the pool and what is left are lost
                message = (
                    "a worker process died (killed, or out of memory?) before this entry finished"
                )
                row = SweepRow(**_row_head(entries[i]), status="error", message=message)
            except Exception as e:  # e.g. an entry that cannot be pickled
                row = SweepRow(
                    **_row_head(entries[i]), status="error", message=_internal(e, tracebacks)
                )
            rows[i] = row
            report(i, row)
    except BaseException:  # KeyboardInterrupt: stop now, not after the running entries
        _stop(pool)
        raise
    pool.shutdown()
    return rows  # type: ignore[return-value]


def ignore_interrupts() -> None:
    """In a worker: leave Ctrl-C to the parent, which ends the workers itself (a worker
    that took it would print its own traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Cancel the entries not started and end the workers at once. Left alone, workers
    finish their entries first (CP-SAT catches SIGINT and just stops early), and the
    interpreter waits for them at exit. ProcessPoolExecutor has no terminate() before
    Python 3.14, hence its private `_processes`."""
    workers = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in workers:
        process.terminate()


def _row_head(entry: SweepEntry) -> dict[str, Any]:
    return {
        "model": entry.model,
        "mesh": str(entry.mesh),
        "level": entry.level,
        "cluster": entry.cluster.name,
        "memory": entry.memory,
        "budget_bytes": entry.budget_bytes,
    }


def _internal(e: BaseException, tracebacks: bool) -> str:
    text = f"internal error: {type(e).__name__}: {e}"
    if tracebacks:
        text += "\n" + "".join(traceback.format_exception(e)).rstrip()
    return text


# -- writing rows ------------------------------------------------------------------------------


def output_format(path: str | os.PathLike[str]) -> str:
    """ "csv" or "json", from the file's extension; ConfigError for anything else."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".csv", ".json"):
        raise ConfigError(f"out {os.fspath(path)}: expected a .csv or .json file name", "out")
    return suffix[1:]


def rows_document(rows: Sequence[SweepRow]) -> dict[str, Any]:
    """The JSON document of a sweep: `{"schema": "rhino.sweep/1", "rows": [...]}`."""
    return {"schema": SWEEP_SCHEMA, "rows": [asdict(r) for r in rows]}


def rows_csv(rows: Sequence[SweepRow]) -> str:
    """CSV text, a header of `COLUMNS` then one line per row; None is an empty cell."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if v is None else v for k, v in asdict(r).items()})
    return buffer.getvalue()


def write_rows(rows: Sequence[SweepRow], path: str | os.PathLike[str]) -> None:
    """Write rows as CSV or JSON, by the file's extension."""
    if output_format(path) == "csv":
        text = rows_csv(rows)
    else:
        text = json.dumps(rows_document(rows), indent=2) + "\n"
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"out {os.fspath(path)}: cannot write: {e.strerror}", "out") from None
