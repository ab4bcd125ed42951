"""`rhino.jax.plan`: a JAX function's SPMD plan, its shardings, and a callable realizing it.

    fn, example args --jax.jit(keep_unused).lower--> HLO (one device)
      --rhino.hlo parse, verify--> Module --make_plan (the user's mesh shape)--> Plan
      --runtime.spmd.boundary--> the realized program, every parameter's and result's layout
      --> in_shardings / out_shardings (NamedSharding on the user's mesh)
      --jit(): compile through rhino.runtime.xla_bridge on the mesh's devices--> callable

Rhino's mesh axis a is the user's mesh axis a (`mesh.axis_names[a]`, size
`mesh.devices.shape[a]`), and rhino's device d (row-major over the mesh shape) is
`mesh.devices.flat[d]`, so the program's shardings are the NamedShardings' layouts.
Public jax APIs are used here directly; jax internals only through the bridge.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rhino.hlo.errors import ConfigError, RhinoError
from rhino.hlo.ir import Module
from rhino.hlo.parser import parse_module
from rhino.hlo.verify import verify
from rhino.runtime import xla_bridge as xb
from rhino.runtime.spmd.boundary import Boundary, Layout, boundary, partition_spec
from rhino.runtime.spmd.runner import compile_realized
from rhino.search.cluster import load_cluster, parse_quantity
from rhino.search.mesh import DeviceMesh
from rhino.search.problem import SolveOptions
from rhino.search.spmd.pins import check_pins, pin_from_text
from rhino.search.spmd.plan import Plan
from rhino.search.spmd.planner import PlanRequest, make_plan
from rhino.search.spmd.spec import ShardingSpec
from rhino.search.units import format_bytes, format_seconds
from rhino.search.workers import why_no_workers


class PlanError(RhinoError, ValueError):
    """A request `rhino.jax.plan` cannot serve: a mesh that is not a jax Mesh or does not
    match a given plan, `stages=`, a program rhino cannot run."""


class ArgumentError(RhinoError, TypeError):
    """Arguments to a plan's callable that are not the ones it was planned for: another
    pytree structure, shape or dtype. Raised before anything runs (a wrong buffer would
    crash XLA, see runtime/BRIDGE_NOTES.md)."""


@dataclass(frozen=True)
class _Leaf:
    """One flattened argument or result, as the program sees it."""

    key: str
    """Its pytree path: as fn names its arguments where the program says
    (`params['dense']['kernel']`), else counted from the positional arguments
    (`[0]['dense']['kernel']`); `result[1]` for results."""
    shape: tuple[int, ...]
    dtype: Any
    """numpy dtype, or a jax PRNG key dtype (the program holds the key's data)."""
    weak: bool = False
    """A weakly typed scalar (a Python number): any number converts."""

    @property
    def is_key(self) -> bool:
        return bool(jax.dtypes.issubdtype(self.dtype, jax.dtypes.prng_key))


def plan(
    fn: Callable[..., Any],
    *example_args: Any,
    mesh: Mesh,
    opt: str = "O2",
    cluster: str = "m8",
    memory: str | float | None = None,
    time_limit: float = 60.0,
    donate_argnums: int | Sequence[int] = (),
    pins: Mapping[str, str] | None = None,
    use_plan: Plan | str | Path | None = None,
    stages: int | None = None,
) -> JaxPlan:
    """Plan `fn` for `mesh` with rhino's SPMD search and return the plan.

    `fn` is lowered as `jax.jit(fn, keep_unused=True, donate_argnums=...)` on the
    shapes and dtypes of `example_args` (arrays, `jax.ShapeDtypeStruct`s, Python
    numbers; any pytrees; nothing is computed), planned for one device's program
    spread over `mesh` (a `jax.sharding.Mesh`, e.g. `jax.make_mesh((2, 4), ("data",
    "model"))`; rhino's mesh axes are the mesh's, in order), and returned as a
    `JaxPlan`: `in_shardings` / `out_shardings`, `jit()`, and the report.

    Options: `opt` "O2" (default) or "O3"; `cluster` a name from configs/clusters or a
    YAML file (the costs the search minimizes); `memory` a per-device budget ("16GiB"
    or bytes; default the cluster's device memory); `time_limit` seconds for the
    search; `donate_argnums` as for `jax.jit` (the callable then consumes those
    arguments); `pins` {HLO instruction name: layout}, e.g. {"dot.3": "S0R"};
    `use_plan` a plan made before for the same `fn` and argument shapes (a `Plan`, or
    the file `rhino plan --out` or `JaxPlan.plan.write` wrote) instead of searching.

    SPMD only: every device runs the whole step on its shards. Pipeline stages are out
    of scope here (`stages=` raises `PlanError`); plan those with `rhino pipeline` on
    the step's HLO (`jax.jit(fn).lower(*args).as_text(dialect="hlo")`).

    Worker processes: O2 on a large step may solve in worker processes, which start by
    importing your script's `__main__` again. Put the script's work under
    `if __name__ == "__main__":` (as for any multiprocessing code). Called from the
    unguarded top level of a script, `plan` searches in this process instead (the
    same plan, slower on large steps; `notes` says so).

    Raises `PlanError` (a `ValueError`) for a bad mesh or request, and rhino's own
    errors (`rhino.hlo.errors.RhinoError`) for what the search refuses (e.g. no plan
    within the memory budget).
    """
    _check_request(stages, mesh)
    shape = tuple(int(n) for n in mesh.devices.shape)
    donated = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    for i in donated:
        if not 0 <= i < len(example_args):
            raise PlanError(
                f"donate_argnums has {i}; fn is given {len(example_args)} positional arguments"
            )
    lowered = _lower(fn, example_args, mesh, donated)
    notes: list[str] = []
    if use_plan is not None:
        made = use_plan if isinstance(use_plan, Plan) else _read_plan(use_plan)
        if made.mesh.shape != shape:
            raise PlanError(
                f"the plan is for mesh {made.mesh} ({made.mesh.size} devices); the mesh "
                f"given has shape {'x'.join(map(str, shape))} ({mesh.devices.size} devices)"
            )
    else:
        request = PlanRequest(
            DeviceMesh(shape),
            load_cluster(cluster),
            opt,
            _budget(memory, cluster),
            _pins(pins, lowered.module, DeviceMesh(shape)),
            SolveOptions(time_limit_s=time_limit, threads=_threads(notes)),
        )
        made = make_plan(lowered.module, request)
    try:
        found = boundary(lowered.module, made)
    except ConfigError as e:
        raise PlanError(f"the plan does not fit this function and these arguments: {e}") from None
    return JaxPlan(made, mesh, found, _named_by_program(lowered, found), notes)


def _check_request(stages: int | None, mesh: Any) -> None:
    if stages is not None:
        raise PlanError(
            f"stages={stages}: rhino.jax.plan makes SPMD plans only; plan pipeline stages "
            "with `rhino pipeline FILE --stages N` on the step's HLO "
            '(jax.jit(fn).lower(*args).as_text(dialect="hlo"))'
        )
    if not isinstance(mesh, Mesh):
        raise PlanError(
            f"mesh must be a jax.sharding.Mesh with devices (e.g. jax.make_mesh((2, 4), "
            f"('data', 'model'))), got {type(mesh).__name__}"
        )


def _threads(notes: list[str]) -> int:
    """The search's threads: 2, or 1 (no worker processes, noted) where workers would
    break (`rhino.search.workers.why_no_workers`: e.g. a worker importing `__main__`
    again would run the caller's script)."""
    why = why_no_workers()
    if why is None:
        return 2
    notes.append(f"searched without worker processes: {why}")
    return 1


def _named_by_program(lowered: _Lowered, found: Boundary) -> _Lowered:
    """`lowered` with its arguments keyed by the names fn gives them (`params['w']`)
    where the program says. Checks that the program has a parameter per argument leaf
    and a result per result leaf."""
    if len(found.inputs) != len(lowered.args) or len(found.outputs) != len(lowered.results):
        raise PlanError(
            f"the lowered program has {len(found.inputs)} parameters and "
            f"{len(found.outputs)} results; fn's arguments have {len(lowered.args)} array "
            f"leaves and its results {len(lowered.results)}"
        )
    named = tuple(
        dataclasses.replace(leaf, key=x.key) if x.key != x.name else leaf
        for leaf, x in zip(lowered.args, found.inputs, strict=True)
    )
    return dataclasses.replace(lowered, args=named)


@dataclass(frozen=True)
class _Lowered:
    """`fn` lowered for one device: the program and its flattened arguments and results."""

    module: Module
    args: tuple[_Leaf, ...]
    """One per entry parameter, in order (jax keeps unused ones: `keep_unused`)."""
    args_tree: Any
    """The pytree structure of the positional arguments (a tuple)."""
    results: tuple[_Leaf, ...]
    results_tree: Any


def _lower(
    fn: Callable[..., Any], args: tuple[Any, ...], mesh: Mesh, donated: tuple[int, ...]
) -> _Lowered:
    """`fn`'s one-device program as a rhino Module, lowered for the mesh's platform."""
    abstract = jax.tree.map(_abstract, args)
    platform = mesh.devices.flat[0].platform
    jitted = jax.jit(fn, keep_unused=True, donate_argnums=donated)
    lowered = jitted.trace(*abstract).lower(lowering_platforms=(platform,))
    module = parse_module(lowered.as_text(dialect="hlo"), "<lowered fn>")
    verify(module)
    _name_parameters(module, lowered.as_text(dialect="hlo", debug_info=True))
    with_paths, args_tree = jax.tree_util.tree_flatten_with_path(abstract)
    outs, results_tree = jax.tree_util.tree_flatten_with_path(lowered.out_info)
    return _Lowered(
        module,
        tuple(
            _Leaf(jax.tree_util.keystr(path), tuple(x.shape), x.dtype, bool(x.weak_type))
            for path, x in with_paths
        ),
        args_tree,
        tuple(
            _Leaf("result" + jax.tree_util.keystr(path), tuple(x.shape), x.dtype)
            for path, x in outs
        ),
        results_tree,
    )


_PARAMETER_METADATA = re.compile(
    r'^\s*(%?[\w.\-]+) = \S+ parameter\(\d+\), metadata=(\{op_name="(?:[^"\\]|\\.)*"\})',
    re.MULTILINE,
)
"""A parameter line of jax's debug print: its name and `{op_name="<pytree path>"}`."""


def _name_parameters(module: Module, debug_text: str) -> None:
    """Give `module`'s entry parameters the `metadata={op_name=...}` (their pytree paths)
    of jax's debug print of the same lowering. Planned on the plain print: the debug one
    also holds the source locations of the call, which would change the module's hash
    (a saved plan's check) from one call site to another."""
    found = dict(_PARAMETER_METADATA.findall(debug_text))
    for param in module.entry.parameters:
        text = found.get(param.name)
        if text is not None:
            param.attrs["metadata"] = text


def _abstract(x: Any) -> jax.ShapeDtypeStruct:
    """The shape and dtype `x` is lowered with (no sharding: the one-device program)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type)
    if isinstance(x, jax.Array | np.ndarray | np.generic):
        weak = bool(getattr(x, "weak_type", False))
        return jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=weak)
    if isinstance(x, bool | int | float | complex):
        return jax.ShapeDtypeStruct((), jax.numpy.asarray(x).dtype, weak_type=True)
    raise PlanError(
        f"an example argument is a {type(x).__name__}; rhino.jax.plan takes arrays, "
        "jax.ShapeDtypeStructs and Python numbers as pytree leaves (pass other values "
        "through a closure)"
    )


def _read_plan(path: str | Path) -> Plan:
    try:
        return Plan.read(path)
    except ConfigError as e:
        raise PlanError(str(e)) from None


def _budget(memory: str | float | None, cluster: str) -> float | None:
    if memory is None:
        return load_cluster(cluster).memory_bytes
    if isinstance(memory, int | float):
        return float(memory)
    try:
        return parse_quantity(memory, "bytes")
    except ValueError as e:
        raise PlanError(f"memory={memory!r}: {e}") from None


def _pins(
    pins: Mapping[str, str] | None, module: Module, mesh: DeviceMesh
) -> tuple[tuple[str, ShardingSpec], ...]:
    """`pins` ({instruction: layout}) checked against the program, as the planner takes
    them."""
    if not pins:
        return ()
    made = [
        pin_from_text(f"{name}={layout}", mesh.ndim, f"pins[{name!r}]")
        for name, layout in pins.items()
    ]
    check_pins(made, module, mesh, "<lowered fn>")
    return tuple((p.name, p.spec) for p in made)


class JaxPlan:
    """A rhino SPMD plan of a JAX function on a jax Mesh (made by `rhino.jax.plan`).

    - `in_shardings`: a tuple with one NamedSharding pytree per positional argument;
      `out_shardings`: a NamedSharding pytree shaped like the results; both on the
      user's mesh with its axis names. A parameter or result whose planned layout no
      NamedSharding expresses (a non-maximal stride, partial sums) takes the nearest one
      that does (the maximal split over the same mesh axes; replicated instead of
      partial), and `notes` says where; the program converts it inside.
    - `jit()`: the plan as a callable taking and returning `fn`'s pytrees.
    - `plan`: the rhino `Plan` (estimates, per-instruction layouts, collectives);
      `report()` / `str()`: its summary.
    """

    def __init__(
        self,
        made: Plan,
        mesh: Mesh,
        found: Boundary,
        lowered: _Lowered,
        notes: Sequence[str] = (),
    ) -> None:
        self.plan = made
        """The underlying rhino plan."""
        self.mesh = mesh
        """The mesh planned for."""
        self._boundary = found
        self._lowered = lowered
        self._compiled: xb.Compiled | None = None
        names = tuple(str(a) for a in mesh.axis_names)
        extra: list[str] = []
        self._in_named = tuple(
            self._named(x, leaf, names, extra)
            for x, leaf in zip(found.inputs, lowered.args, strict=True)
        )
        self._out_named = tuple(
            self._named(x, leaf, names, extra)
            for x, leaf in zip(found.outputs, lowered.results, strict=True)
        )
        self.notes: tuple[str, ...] = (*notes, *found.notes, *extra)
        """What is worth knowing: layouts taken as the nearest expressible one, how the
        search ran, arguments XLA takes in another layout than planned."""

    def _named(self, x: Layout, leaf: _Leaf, names: tuple[str, ...], notes: list[str]) -> Any:
        entries = partition_spec(x.spec, len(x.dims), names)
        if leaf.is_key:  # the program holds the key's data: one more, innermost dim
            if entries[-1] is not None:
                notes.append(
                    f"{leaf.key}: the plan splits the data of PRNG keys ({x.spec}); the "
                    f"keys are laid out without that split and converted at each call"
                )
            entries = entries[:-1]
        return NamedSharding(self.mesh, PartitionSpec(*entries))

    # -- shardings ------------------------------------------------------------------------

    @property
    def in_shardings(self) -> tuple[Any, ...]:
        """One NamedSharding pytree per positional argument of `fn`."""
        return tuple(jax.tree_util.tree_unflatten(self._lowered.args_tree, self._in_named))

    @property
    def out_shardings(self) -> Any:
        """A NamedSharding pytree shaped like `fn`'s results."""
        return jax.tree_util.tree_unflatten(self._lowered.results_tree, self._out_named)

    # -- running --------------------------------------------------------------------------

    def jit(self) -> Callable[..., Any]:
        """The plan as a function: called with arguments shaped like the example
        arguments (same pytree structure, shapes and dtypes; any layout, host arrays
        too), it places them as the program takes them, runs the plan's program (every
        layout inside it included) on the mesh's devices and returns `fn`'s result pytree
        of `jax.Array`s laid out as `out_shardings`. Donated arguments are consumed. The
        first call compiles (once per JaxPlan). Raises `ArgumentError` (a `TypeError`)
        for arguments that do not match, before anything runs."""

        def run(*args: Any) -> Any:
            return self._call(args)

        run.__name__ = f"rhino_{self.plan.module}"
        run.__doc__ = f"{self.plan.module} on mesh {self.plan.mesh}, as rhino planned it."
        return run

    def compiled(self) -> xb.Compiled:
        """The program, compiled for the mesh's devices (once)."""
        if self._compiled is None:
            compiled, notes = _compile(
                self._boundary, self.plan.mesh, tuple(self.mesh.devices.flat)
            )
            self._compiled = compiled
            self.notes = (*self.notes, *notes, *self._placement_notes(compiled))
        return self._compiled

    def _placement_notes(self, compiled: xb.Compiled) -> list[str]:
        """Where XLA takes or returns a value in another layout than the NamedSharding
        (each call then moves it): none when the plan is realized as written."""
        notes = []
        for kind, leaves, named, sharding_of in (
            ("argument", self._lowered.args, self._in_named, xb.parameter_sharding),
            ("result", self._lowered.results, self._out_named, xb.output_sharding),
        ):
            for i, (leaf, want) in enumerate(zip(leaves, named, strict=True)):
                have = sharding_of(compiled, i)
                if not leaf.is_key and not have.is_equivalent_to(want, len(leaf.shape)):
                    notes.append(
                        f"{kind} {leaf.key}: XLA uses {have}, not {want.spec}; moved at each call"
                    )
        return notes

    def _call(self, args: tuple[Any, ...]) -> Any:
        lowered = self._lowered
        values, tree = jax.tree_util.tree_flatten(args)
        if tree != lowered.args_tree:
            raise ArgumentError(
                f"{self.plan.module} was planned for arguments structured otherwise: "
                f"{_difference(lowered.args_tree, args)}"
            )
        for leaf, value in zip(lowered.args, values, strict=True):
            _check_argument(leaf, value)
        compiled = self.compiled()
        placed = [
            xb.move_input(compiled, i, _program_value(leaf, value))
            for i, (leaf, value) in enumerate(zip(lowered.args, values, strict=True))
        ]
        results = xb.execute_arrays(compiled, placed)
        out = [
            _as_result(leaf, array, named)
            for leaf, array, named in zip(lowered.results, results, self._out_named, strict=True)
        ]
        return jax.tree_util.tree_unflatten(lowered.results_tree, out)

    # -- report ---------------------------------------------------------------------------

    def report(self) -> str:
        """The plan's summary: estimated step time (compute, each kind of collective),
        memory per device, the collectives, the layout of every argument, notes."""
        p = self.plan
        names = ", ".join(
            f"{n}={k}" for n, k in zip(self.mesh.axis_names, p.mesh.shape, strict=True)
        )
        lines = [
            f"{p.module} on mesh ({names}), cluster {p.cluster}, level {p.level}",
            f"  estimated step     {format_seconds(p.objective_s)}",
            f"    compute          {format_seconds(p.compute_s)}",
        ]
        lines += [f"    {kind:<16} {format_seconds(s)}" for kind, s in p.comm_by_kind.items()]
        budget = f" (budget {format_bytes(p.budget_bytes)})" if p.budget_bytes else ""
        lines.append(f"  memory per device  {format_bytes(p.peak_memory_bytes)}{budget}")
        count = sum(max(1, round(c.count)) for c in p.collectives)
        lines.append(f"  collectives        {count} per step")
        for c in p.collectives:
            axes = ",".join(str(self.mesh.axis_names[a]) for a in c.axes)
            size = format_bytes(c.nbytes)
            lines.append(f"    {c.kind} over {axes}: {size} x{c.count:g} (%{c.instruction})")
        lines.append("  arguments")
        for leaf, named in zip(self._lowered.args, self._in_named, strict=True):
            lines.append(f"    {leaf.key}: {named.spec}")
        lines += [f"  note: {n}" for n in (*p.notes, *self.notes)]
        lines += [f"  warning: {w}" for w in p.warnings]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()

    def __repr__(self) -> str:
        return (
            f"<JaxPlan {self.plan.module} on mesh {self.plan.mesh}: "
            f"{format_seconds(self.plan.objective_s)} a step, "
            f"{format_bytes(self.plan.peak_memory_bytes)} per device>"
        )


def _compile(
    found: Boundary, mesh: DeviceMesh, devices: tuple[Any, ...]
) -> tuple[xb.Compiled, list[str]]:
    """The one place rhino.jax compiles a plan's program: through Shardy, jax's own
    partitioner, as `rhino run` does (`runner.compile_realized`: GSPMD, with a note, only
    for a sharding Shardy cannot take); the compiled program and those notes."""
    compiled, _, notes = compile_realized(found.program, mesh, devices)
    return compiled, notes


def _difference(planned: Any, args: tuple[Any, ...]) -> str:
    """How the pytree `args` differs from the `planned` structure: the leaves missing and
    those not planned, by path (positional: `[0]['w']`)."""
    like = jax.tree_util.tree_unflatten(planned, [0] * planned.num_leaves)
    want = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(like)[0]]
    got = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(args)[0]]
    have, wanted = set(got), set(want)
    missing = [k for k in want if k not in have]
    extra = [k for k in got if k not in wanted]
    parts = []
    for what, keys in (("missing", missing), ("not planned", extra)):
        if keys:
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            parts.append(f"{what} {', '.join(keys[:3])}{more}")
    found = "; ".join(parts) or "the same leaves in other containers"
    return f"{found} ({len(want)} leaves planned, {len(got)} given)"


def _check_argument(leaf: _Leaf, value: Any) -> None:
    if isinstance(value, jax.Array) and value.is_deleted():
        raise ArgumentError(
            f"argument {leaf.key} was deleted (donated to an earlier call?): pass the "
            f"array that call returned"
        )
    shape = tuple(np.shape(value))
    if leaf.is_key:
        dtype = getattr(value, "dtype", None)
        if dtype != leaf.dtype or shape != leaf.shape:
            raise ArgumentError(
                f"argument {leaf.key}: expected PRNG keys {leaf.dtype}{list(leaf.shape)}, "
                f"got {dtype}{list(shape)}"
            )
        return
    if shape != leaf.shape:
        raise ArgumentError(
            f"argument {leaf.key}: expected shape {list(leaf.shape)}, got {list(shape)}"
        )
    dtype = np.result_type(value) if not hasattr(value, "dtype") else value.dtype
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        raise ArgumentError(f"argument {leaf.key}: expected {leaf.dtype}, got {dtype}")
    if np.dtype(dtype) == leaf.dtype:
        return
    host = not isinstance(value, jax.Array)
    if leaf.weak and isinstance(value, bool | int | float | complex):
        return
    if host and jax.dtypes.canonicalize_dtype(dtype) == leaf.dtype:
        return  # as jax.jit takes a float64 numpy array without x64
    raise ArgumentError(f"argument {leaf.key}: expected dtype {leaf.dtype}, got {dtype}")


def _program_value(leaf: _Leaf, value: Any) -> Any:
    """The argument as the program takes it: a jax.Array as it is (a PRNG key as its
    data), anything else as a numpy array of the program's dtype."""
    if leaf.is_key:
        return jax.random.key_data(value)
    if isinstance(value, jax.Array):
        return value
    return np.asarray(value, dtype=leaf.dtype)


def _as_result(leaf: _Leaf, array: jax.Array, named: NamedSharding) -> jax.Array:
    """A program output as `fn` returns it, laid out as `named`."""
    if leaf.is_key:  # the key's data, first laid out as the keys will be (no split inside)
        spec = (*named.spec, *([None] * (array.ndim - len(named.spec))))
        data = NamedSharding(named.mesh, PartitionSpec(*spec))
        if not array.sharding.is_equivalent_to(data, array.ndim):
            array = jax.device_put(array, data)
        array = jax.random.wrap_key_data(array, dtype=leaf.dtype)
    if array.sharding.is_equivalent_to(named, array.ndim):
        shards = [s.data for s in array.addressable_shards]
        return jax.make_array_from_single_device_arrays(array.shape, named, shards)
    return jax.device_put(array, named)
