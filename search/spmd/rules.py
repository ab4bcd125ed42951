"""Sharding strategies per opcode: a table `{Opcode: rule}` with a replicated default.

A rule is a pure function `(instruction, context) -> list[Strategy]`. Every rule's list
includes the all-replicated strategy, so every instruction has a plan. An opcode without
a rule gets only that one (and `unmodelled()` names it, for a warning).

Compute time is the roofline of the per-device FLOPs and bytes (`rhino.search.spmd.comm`).
Collectives an instruction performs itself (partial sums of a dot or a reduce over a
split dim, halos of a spatially split convolution) are in `Strategy.comm`; XLA's
partitioner inserts them inside the instruction, so rhino does too, and the result
layout is already reduced (a plan never leaves partial sums on an edge).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

from rhino.hlo.analysis import instruction_bytes, instruction_flops
from rhino.hlo.ir import Instruction
from rhino.hlo.opcode import ELEMENTWISE, Opcode
from rhino.hlo.shape import Shape
from rhino.search.spmd.comm import collective_time, roofline_time
from rhino.search.spmd.spec import Replicate, ShardingSpec, SpecError, Split
from rhino.search.spmd.strategy import (
    CommStep,
    Context,
    Strategy,
    candidate_specs,
    keep_dims,
    map_spec,
    replicated,
    reshape_spec,
    work_fraction,
)

R = Replicate()
Rule = Callable[[Instruction, Context], list[Strategy]]


# -- helpers ---------------------------------------------------------------------------------


def _compute(inst: Instruction, ctx: Context, fraction: float) -> float:
    read, written = instruction_bytes(inst)
    return roofline_time(
        instruction_flops(inst) * fraction,
        (read + written) * fraction,
        ctx.cluster,
        inst.shape.dtype if not inst.shape.is_tuple else "f32",
    )


def _label(outs: Sequence[ShardingSpec], ins: Sequence[ShardingSpec | None]) -> str:
    left = " ".join(str(o) for o in outs)
    right = " x ".join("-" if i is None else str(i) for i in ins)
    return f"{left} = {right}" if ins else left


def _operand_spec(op: Instruction, spec: ShardingSpec | None, ctx: Context) -> ShardingSpec | None:
    """Scalars and non-array operands are read replicated."""
    if op.shape.is_tuple or op.shape.dtype == "token":
        return None
    if op.shape.rank == 0 or spec is None:
        return replicated(ctx.mesh)
    return spec


def _strategy(
    inst: Instruction,
    ctx: Context,
    outs: Sequence[ShardingSpec],
    ins: Sequence[ShardingSpec | None],
    comm: Sequence[CommStep] = (),
    work: Sequence[ShardingSpec] | None = None,
) -> Strategy:
    fraction = work_fraction(list(work if work is not None else outs), ctx.mesh)
    return Strategy(
        _label(outs, ins), tuple(outs), tuple(ins), _compute(inst, ctx, fraction), tuple(comm)
    )


def replicated_strategy(inst: Instruction, ctx: Context) -> Strategy:
    """Everything replicated: always possible, never communicates."""
    rep = replicated(ctx.mesh)
    outs = tuple(rep for _ in inst.shape.leaves()) if inst.shape.is_tuple else (rep,)
    ins = tuple(_operand_spec(op, rep, ctx) for op in inst.operands)
    return Strategy(_label(outs, ins), outs, ins, _compute(inst, ctx, 1.0))


def _dedupe(strategies: list[Strategy], ctx: Context) -> list[Strategy]:
    seen: dict[tuple[object, ...], Strategy] = {}
    for s in strategies:
        key = (s.outs, s.ins)
        if key not in seen or s.cost < seen[key].cost:
            seen[key] = s
    out = sorted(seen.values(), key=lambda s: (s.cost, s.label))
    rep_key = next((k for k, s in seen.items() if all(o.is_replicated() for o in s.outs)), None)
    kept = out[: ctx.max_strategies]
    if kept and rep_key is not None and seen[rep_key] not in kept:
        kept[-1] = seen[rep_key]  # the replicated plan always stays available
    return kept


def _reduced(
    spec: ShardingSpec,
    partial_axes: Sequence[int],
    out_dims: tuple[int, ...],
    dtype_bytes: float,
    ctx: Context,
) -> list[tuple[ShardingSpec, tuple[CommStep, ...]]]:
    """A result holding partial sums over `partial_axes`, reduced by the instruction:
    all-reduced (those axes replicate), or reduce-scattered onto a dim not yet split."""
    if not partial_axes:
        return [(spec, ())]
    axes = tuple(partial_axes)
    local = math.prod(spec.shard_shape(out_dims, ctx.mesh)) * dtype_bytes
    t = collective_time("all-reduce", local, ctx.mesh, axes, ctx.cluster)
    options: list[tuple[ShardingSpec, tuple[CommStep, ...]]] = [
        (spec, (CommStep("all-reduce", axes, local, t),))
    ]
    if len(axes) == 1:
        (a,) = axes
        for d in range(len(out_dims)):
            if d in spec.split_dims():
                # XLA's partitioner does not reduce-scatter onto a dim another axis
                # splits: the moe_tiny's dot on 2x4 read S0S1 x S0S1 into S0S0 got an
                # all-gather over axis 0 besides (XLA/predicted 1.13)
                continue
            scattered = spec.with_axis(a, Split(d))
            if scattered.is_valid(out_dims, ctx.mesh):
                ts = collective_time("reduce-scatter", local, ctx.mesh, axes, ctx.cluster)
                options.append((scattered, (CommStep("reduce-scatter", axes, local, ts),)))
    return options


# -- rules -----------------------------------------------------------------------------------


def elementwise(inst: Instruction, ctx: Context) -> list[Strategy]:
    """Every operand in the result's layout (scalar operands replicated)."""
    out = []
    for spec in ctx.candidates(inst):
        ins = [_operand_spec(op, spec, ctx) for op in inst.operands]
        out.append(_strategy(inst, ctx, [spec], ins))
    return out


def source(inst: Instruction, ctx: Context) -> list[Strategy]:
    """Parameters, iota, constants: any layout, made locally (parameters arrive in it)."""
    if inst.shape.is_tuple:
        return [replicated_strategy(inst, ctx)]
    specs = candidate_specs(inst.shape.dims, ctx.mesh)
    if inst.opcode is Opcode.CONSTANT and inst.shape.rank == 0:
        specs = specs[:1]
    return [_strategy(inst, ctx, [s], []) for s in specs]


def broadcast(inst: Instruction, ctx: Context) -> list[Strategy]:
    dims = inst.attr("dimensions", ())
    back = {d: i for i, d in enumerate(dims)}
    out = []
    for spec in candidate_specs(inst.shape.dims, ctx.mesh):
        operand = keep_dims(spec, list(dims))
        mapped = map_spec(operand, back, ctx.mesh)
        ins = [_operand_spec(inst.operands[0], mapped, ctx)]
        out.append(_strategy(inst, ctx, [spec], ins))
    return out


def transpose(inst: Instruction, ctx: Context) -> list[Strategy]:
    perm = inst.attr("dimensions", ())
    out = []
    for spec in candidate_specs(inst.shape.dims, ctx.mesh):
        operand = map_spec(spec, {d: perm[d] for d in range(len(perm))}, ctx.mesh)
        out.append(_strategy(inst, ctx, [spec], [operand]))
    return out


def reshape(inst: Instruction, ctx: Context) -> list[Strategy]:
    """Both directions of the dim mapping; a split that crosses a merged dim keeps its
    elements with a non-maximal stride on the other side (Rhino §4.1), so the reshape
    needs no communication. Where no mapping exists the operand is read replicated."""
    src, dst = inst.operands[0].shape.dims, inst.shape.dims
    out = []
    for spec in ctx.candidates(inst):
        operand = reshape_spec(spec, dst, src, ctx.mesh)
        out.append(
            _strategy(inst, ctx, [spec], [operand if operand is not None else replicated(ctx.mesh)])
        )
    for spec in ctx.candidates(inst.operands[0]):
        result = reshape_spec(spec, src, dst, ctx.mesh)
        if result is not None:
            out.append(_strategy(inst, ctx, [result], [spec]))
    return out


def _keep_unsliced(
    inst: Instruction, ctx: Context, fixed_dims: set[int], operand_count: int = 1
) -> list[Strategy]:
    """Ops that cut or extend some dims (slice, pad, concatenate, dynamic-slice): those
    dims stay whole; the others keep their layout between result and operands."""
    out = []
    for spec in candidate_specs(inst.shape.dims, ctx.mesh):
        if any(d in fixed_dims for d in spec.split_dims()):
            continue
        ins = []
        for k, op in enumerate(inst.operands):
            ins.append(
                _operand_spec(
                    op,
                    spec if k < operand_count and op.shape.rank == inst.shape.rank else None,
                    ctx,
                )
            )
        out.append(_strategy(inst, ctx, [spec], ins))
    return out


def slice_(inst: Instruction, ctx: Context) -> list[Strategy]:
    src = inst.operands[0].shape.dims
    cut = {d for d, (a, b, s) in enumerate(inst.attr("slice").dims) if (a, b, s) != (0, src[d], 1)}
    return _keep_unsliced(inst, ctx, cut)


def pad(inst: Instruction, ctx: Context) -> list[Strategy]:
    cut = {d for d, cfg in enumerate(inst.attr("padding").dims) if cfg != (0, 0, 0)}
    return _keep_unsliced(inst, ctx, cut)


def concatenate(inst: Instruction, ctx: Context) -> list[Strategy]:
    (dim,) = inst.attr("dimensions", (0,))
    return _keep_unsliced(inst, ctx, {dim}, operand_count=len(inst.operands))


def dynamic_slice(inst: Instruction, ctx: Context) -> list[Strategy]:
    src = inst.operands[0].shape.dims
    cut = {d for d in range(len(src)) if inst.shape.dims[d] != src[d]}
    return _keep_unsliced(inst, ctx, cut)


def dynamic_update_slice(inst: Instruction, ctx: Context) -> list[Strategy]:
    src, upd = inst.operands[0].shape.dims, inst.operands[1].shape.dims
    cut = {d for d in range(len(src)) if upd[d] != src[d]}
    return _keep_unsliced(inst, ctx, cut, operand_count=2)


def reduce(inst: Instruction, ctx: Context) -> list[Strategy]:
    """Input in any layout; splits of reduced dims leave partial results, reduced here."""
    n_in = len(inst.operands) // 2
    src = inst.operands[0].shape.dims
    reduced = set(inst.attr("dimensions", ()))
    kept = [d for d in range(len(src)) if d not in reduced]
    to_out = {d: i for i, d in enumerate(kept)}
    leaves = inst.shape.leaves()
    out_dims = leaves[0].dims
    out = []
    for spec in candidate_specs(src, ctx.mesh):
        partial = [a for a, e in enumerate(spec.axes) if isinstance(e, Split) and e.dim in reduced]
        result = map_spec(keep_dims(spec, kept), to_out, ctx.mesh)
        if result is None:
            continue
        ins = [spec] * n_in + [replicated(ctx.mesh)] * n_in
        for res, comm in _reduced(
            result, partial, out_dims, leaves[0].element_bytes * len(leaves), ctx
        ):
            out.append(_strategy(inst, ctx, [res] * len(leaves), ins, comm, work=[spec]))
    return out


def dot(inst: Instruction, ctx: Context) -> list[Strategy]:
    """Each mesh axis takes one role: batch, lhs free, rhs free, contracting, or none.

    Contracting splits give partial sums, all-reduced (or reduce-scattered) in the dot.
    This spans data, Megatron column/row, 2-D and batch-dim (attention heads) sharding.
    """
    lhs, rhs = inst.operands[0].shape, inst.operands[1].shape
    lb, rb = inst.attr("lhs_batch_dims", ()), inst.attr("rhs_batch_dims", ())
    lc, rc = inst.attr("lhs_contracting_dims", ()), inst.attr("rhs_contracting_dims", ())
    lfree = [d for d in range(lhs.rank) if d not in lb and d not in lc]
    rfree = [d for d in range(rhs.rank) if d not in rb and d not in rc]
    # role -> (lhs dim, rhs dim, out dim); None where the role does not touch that tensor
    roles: list[tuple[int | None, int | None, int | None]] = [(None, None, None)]
    roles += [(lb[k], rb[k], k) for k in range(len(lb))]
    roles += [(d, None, len(lb) + i) for i, d in enumerate(lfree)]
    roles += [(None, d, len(lb) + len(lfree) + i) for i, d in enumerate(rfree)]
    roles += [(lc[k], rc[k], None) for k in range(len(lc))]
    return _role_strategies(inst, ctx, roles, lhs, rhs)


def _role_strategies(
    inst: Instruction,
    ctx: Context,
    roles: list[tuple[int | None, int | None, int | None]],
    lhs: Shape,
    rhs: Shape,
) -> list[Strategy]:
    mesh = ctx.mesh
    out_shape = inst.shape
    out = []
    for choice in itertools.product(range(len(roles)), repeat=mesh.ndim):
        la: list[Replicate | Split] = []
        ra: list[Replicate | Split] = []
        oa: list[Replicate | Split] = []
        partial = []
        for axis, k in enumerate(choice):
            ld, rd, od = roles[k]
            if k and mesh.shape[axis] == 1:
                break
            la.append(Split(ld) if ld is not None else R)
            ra.append(Split(rd) if rd is not None else R)
            oa.append(Split(od) if od is not None else R)
            if k and od is None:
                partial.append(axis)
        else:
            try:
                ls, rs, os_ = (
                    ShardingSpec(tuple(la)),
                    ShardingSpec(tuple(ra)),
                    ShardingSpec(tuple(oa)),
                )
            except SpecError:  # a combination no spec can hold (e.g. one dim split twice)
                continue
            if not (
                ls.is_valid(lhs.dims, mesh)
                and rs.is_valid(rhs.dims, mesh)
                and os_.is_valid(out_shape.dims, mesh)
            ):
                continue
            for res, comm in _reduced(os_, partial, out_shape.dims, out_shape.element_bytes, ctx):
                out.append(_strategy(inst, ctx, [res], [ls, rs], comm, work=[ls, rs, os_]))
    return out


def convolution(inst: Instruction, ctx: Context) -> list[Strategy]:
    """Batch, output-feature and input-feature (contracting) splits as for a dot, and
    spatial splits of the output with the input's halo exchanged (collective-permute)."""
    labels = inst.attr("dim_labels")
    lhs, rhs = inst.operands[0].shape, inst.operands[1].shape
    if (
        labels is None
        or inst.attr("feature_group_count", 1) != 1
        or inst.attr("batch_group_count", 1) != 1
    ):
        roles: list[tuple[int | None, int | None, int | None]] = [(None, None, None)]
        if labels is not None and inst.attr("batch_group_count", 1) == 1:
            roles.append((labels.lhs_batch, None, labels.out_batch))
        return _role_strategies(inst, ctx, roles, lhs, rhs)
    roles = [
        (None, None, None),
        (labels.lhs_batch, None, labels.out_batch),
        (None, labels.kernel_output_feature, labels.out_feature),
        (labels.lhs_feature, labels.kernel_input_feature, None),
    ]
    strategies = _role_strategies(inst, ctx, roles, lhs, rhs)
    window = inst.attr("window")
    for i, (ld, od) in enumerate(zip(labels.lhs_spatial, labels.out_spatial, strict=True)):
        w = window.dims[i] if window is not None and i < len(window.dims) else None
        if w is None or w.lhs_dilate != 1 or w.rhs_dilate != 1:
            continue
        for a, size in enumerate(ctx.mesh.shape):
            if size == 1 or lhs.dims[ld] % size or inst.shape.dims[od] % size:
                continue
            spec_l = replicated(ctx.mesh).with_axis(a, Split(ld))
            spec_o = replicated(ctx.mesh).with_axis(a, Split(od))
            halo_rows = max(0, w.size - w.stride)
            row_bytes = (
                lhs.numel
                // lhs.dims[ld]
                * lhs.element_bytes
                / math.prod(ctx.mesh.shape[b] for b in range(ctx.mesh.ndim) if b != a)
                if halo_rows
                else 0
            )
            comm: tuple[CommStep, ...] = ()
            if halo_rows:
                nbytes = row_bytes * halo_rows
                t = collective_time("collective-permute", nbytes, ctx.mesh, (a,), ctx.cluster)
                comm = (CommStep("collective-permute", (a,), nbytes, t),)
            strategies.append(
                _strategy(inst, ctx, [spec_o], [spec_l, replicated(ctx.mesh)], comm, work=[spec_o])
            )
    return strategies


def gather(inst: Instruction, ctx: Context) -> list[Strategy]:
    """Embedding-style gathers: indices split on batch dims (table replicated), or the
    table split on a dim it keeps whole (result split alike)."""
    operand, indices = inst.operands[0].shape, inst.operands[1].shape
    offset_dims = inst.attr("offset_dims", ())
    collapsed = set(inst.attr("collapsed_slice_dims", ())) | set(
        inst.attr("operand_batching_dims", ())
    )
    slice_sizes = inst.attr("slice_sizes", ())
    index_vector_dim = inst.attr("index_vector_dim", indices.rank)
    batch_out = [d for d in range(inst.shape.rank) if d not in offset_dims]
    index_batch = [d for d in range(indices.rank) if d != index_vector_dim]
    out = []
    rep = replicated(ctx.mesh)
    for spec in candidate_specs(inst.shape.dims, ctx.mesh):
        if spec.is_replicated():
            continue
        split = spec.split_dims()
        if all(d in batch_out for d in split) and len(batch_out) == len(index_batch):
            idx = map_spec(
                spec, {batch_out[i]: index_batch[i] for i in range(len(batch_out))}, ctx.mesh
            )
            out.append(_strategy(inst, ctx, [spec], [rep, idx]))
        elif all(d in offset_dims for d in split):
            full = [d for d in range(operand.rank) if d not in collapsed]
            to_operand = {offset_dims[i]: full[i] for i in range(min(len(offset_dims), len(full)))}
            op_spec = map_spec(spec, to_operand, ctx.mesh)
            if op_spec is not None and all(
                slice_sizes[d] == operand.dims[d] for d in op_spec.split_dims()
            ):
                out.append(_strategy(inst, ctx, [spec], [op_spec, rep]))
    return out


def scatter(inst: Instruction, ctx: Context) -> list[Strategy]:
    """Scatter-add of an embedding gradient: updates split on their scatter (batch) dims
    give partial sums of the whole result (all-reduced here, or reduce-scattered onto a
    dim the indices address); or the operand split on a window dim it keeps whole,
    updates split alike. A result split on a window dim from updates split on their
    batch dims is the second: XLA's partitioner sends the updates to the window split (an
    all-to-all) with the indices whole, rather than reduce-scatter partial sums (the
    embedding gradient of the tiny GPT on 1x4: 32 KiB all-to-all, not a 128 KiB
    reduce-scatter)."""
    if len(inst.operands) != 3 or inst.shape.is_tuple:
        return []
    operand, indices, updates = (op.shape for op in inst.operands)
    window = inst.attr("update_window_dims", ())
    inserted = set(inst.attr("inserted_window_dims", ())) | set(
        inst.attr("input_batching_dims", ())
    )
    index_vector_dim = inst.attr("index_vector_dim", indices.rank)
    scatter_dims = [d for d in range(updates.rank) if d not in window]
    operand_window = {d for d in range(operand.rank) if d not in inserted}
    index_batch = [d for d in range(indices.rank) if d != index_vector_dim]
    rep = replicated(ctx.mesh)
    out = []
    for spec in candidate_specs(updates.dims, ctx.mesh):
        if spec.is_replicated():
            continue
        split = spec.split_dims()
        if all(d in scatter_dims for d in split) and len(scatter_dims) == len(index_batch):
            idx = map_spec(
                spec, {scatter_dims[i]: index_batch[i] for i in range(len(scatter_dims))}, ctx.mesh
            )
            partial = [a for a, e in enumerate(spec.axes) if isinstance(e, Split)]
            for res, comm in _reduced(rep, partial, operand.dims, operand.element_bytes, ctx):
                if any(d in operand_window for d in res.split_dims()):
                    continue  # XLA does not reduce-scatter onto a window dim (see below)
                out.append(
                    _strategy(
                        inst,
                        ctx,
                        [res],
                        [rep if res.is_replicated() else res, idx, spec],
                        comm,
                        work=[spec],
                    )
                )
        elif all(d in window for d in split):
            full = [d for d in range(operand.rank) if d not in inserted]
            to_operand = {window[i]: full[i] for i in range(min(len(window), len(full)))}
            op_spec = map_spec(spec, to_operand, ctx.mesh)
            if op_spec is not None and op_spec.is_valid(operand.dims, ctx.mesh):
                out.append(_strategy(inst, ctx, [op_spec], [op_spec, rep, spec]))
    return out


def along_free_dims(fixed: Callable[[Instruction], set[int]]) -> Rule:
    """Ops that work along some dims (sort, reverse, reduce-window, cumulative ops):
    those stay whole, the others keep their layout."""

    def rule(inst: Instruction, ctx: Context) -> list[Strategy]:
        dims = inst.shape.leaves()[0].dims
        n_leaves = len(inst.shape.leaves())
        out = []
        for spec in candidate_specs(dims, ctx.mesh):
            if any(d in fixed(inst) for d in spec.split_dims()):
                continue
            # an operand of the same rank whose split dims match (a pooling window
            # changes only its own dims) reads the same layout
            ins = [
                _operand_spec(
                    op, spec if _same_on(op.shape.dims, dims, spec.split_dims()) else None, ctx
                )
                for op in inst.operands
            ]
            out.append(_strategy(inst, ctx, [spec] * n_leaves, ins))
        return out

    return rule


def _same_on(a: tuple[int, ...], b: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    """Same rank, and the same size on each of `dims`."""
    return len(a) == len(b) and all(a[d] == b[d] for d in dims)


def _window_dims(inst: Instruction) -> set[int]:
    window = inst.attr("window")
    if window is None:
        return set()
    return {
        d
        for d, w in enumerate(window.dims)
        if (w.size, w.stride, w.pad_low, w.pad_high) != (1, 1, 0, 0)
    }


def _select_and_scatter_dims(inst: Instruction) -> set[int]:
    return _window_dims(inst)


RULES: dict[Opcode, Rule] = {
    **{op: elementwise for op in ELEMENTWISE},
    Opcode.PARAMETER: source,
    Opcode.CONSTANT: source,
    Opcode.IOTA: source,
    Opcode.BROADCAST: broadcast,
    Opcode.TRANSPOSE: transpose,
    Opcode.RESHAPE: reshape,
    Opcode.BITCAST: reshape,
    Opcode.SLICE: slice_,
    Opcode.PAD: pad,
    Opcode.CONCATENATE: concatenate,
    Opcode.DYNAMIC_SLICE: dynamic_slice,
    Opcode.DYNAMIC_UPDATE_SLICE: dynamic_update_slice,
    Opcode.REDUCE: reduce,
    Opcode.DOT: dot,
    Opcode.CONVOLUTION: convolution,
    Opcode.GATHER: gather,
    Opcode.SCATTER: scatter,
    Opcode.REVERSE: along_free_dims(lambda i: set(i.attr("dimensions", ()))),
    Opcode.SORT: along_free_dims(lambda i: set(i.attr("dimensions", ()))),
    Opcode.REDUCE_WINDOW: along_free_dims(_window_dims),
    Opcode.SELECT_AND_SCATTER: along_free_dims(_select_and_scatter_dims),
}

# Opcodes planned replicated on purpose (no warning): control, tokens, RNG state, etc.
REPLICATED_BY_DESIGN = frozenset(
    {
        Opcode.TUPLE,
        Opcode.GET_TUPLE_ELEMENT,
        Opcode.WHILE,
        Opcode.CALL,
        Opcode.CONDITIONAL,
        Opcode.AFTER_ALL,
        Opcode.RNG,
        Opcode.RNG_BIT_GENERATOR,
        Opcode.RNG_GET_AND_UPDATE_STATE,
        Opcode.PARTITION_ID,
        Opcode.REPLICA_ID,
        Opcode.OPTIMIZATION_BARRIER,
        Opcode.CUSTOM_CALL,
        Opcode.FUSION,
        Opcode.GET_DIMENSION_SIZE,
        Opcode.INFEED,
        Opcode.OUTFEED,
    }
)


def strategies(inst: Instruction, ctx: Context) -> list[Strategy]:
    """The strategies of `inst`: its rule's, plus the replicated one, deduplicated,
    cheapest first; only those matching a user pin when `inst` is pinned."""
    rule = RULES.get(inst.opcode)
    found = list(rule(inst, ctx)) if rule is not None else []
    found.append(replicated_strategy(inst, ctx))
    pinned = ctx.pinned.get(inst.name)
    if pinned is not None:
        found = [s for s in found if s.outs[0] == pinned]
    return _dedupe(found, ctx)


def unmodelled(inst: Instruction) -> bool:
    """Is `inst` planned replicated only because rhino has no rule for its opcode?"""
    return inst.opcode not in RULES and inst.opcode not in REPLICATED_BY_DESIGN
