"""Hand plans for the zoo models, written as a practitioner would with jax shardings, and
the same layouts as rhino pins (issue 9's plan-quality suite).

A hand plan is a function `(kind, path, shape) -> PartitionSpec` over the step's
arguments on a 1xN mesh with axes ("a", "b"): `kind` is which argument ("params",
"adam_m", "adam_v", "count", "batch"), `path` the leaf's jax key path inside it
(`['layers'][0]['attn']['wq']`). Every split is over axis "b"; a dim that does not divide
stays whole. The step returns its state in the layout it was given.

    data parallel   the batch split on dim 0; weights and Adam state replicated
    zero            data parallel, and each Adam moment split on its largest dim
                    (ZeRO stage 1: the update runs on slices, new weights all-gathered)
    megatron        (transformers, MLPs) attention's q/k/v and the MLP's first layer
                    split by columns, attention's output and the MLP's second layer by
                    rows; moments as their weight; the batch replicated
    gshard          (MoE) every expert weight split on its expert dim, the rest data
                    parallel

`pins(module, spec, plan, n)` turns a hand plan into rhino pins (entry parameter name ->
ShardingSpec): entry parameters are numbered in the order jax flattens the arguments.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from rhino.hlo.ir import Module
from rhino.search.spmd.spec import ShardingSpec, parse_spec

KINDS = ("params", "adam_m", "adam_v", "count", "batch")
"""The step's arguments, in order (`zoo_models.common.make_train_step`)."""
AXIS = "b"

Layout = Callable[[str, str, tuple[int, ...], int], P]
"""(argument kind, key path, shape, devices) -> how the leaf is split."""


def _split(shape: tuple[int, ...], dim: int, n: int) -> P:
    """`dim` split over AXIS if it divides, else replicated."""
    if dim >= len(shape) or shape[dim] % n:
        return P()
    return P(*([None] * dim), AXIS)


def data_parallel(kind: str, _path: str, shape: tuple[int, ...], n: int) -> P:
    return _split(shape, 0, n) if kind == "batch" else P()


def zero(kind: str, path: str, shape: tuple[int, ...], n: int) -> P:
    if kind in ("adam_m", "adam_v") and shape:
        dims = sorted(range(len(shape)), key=lambda d: (-shape[d], d))
        return next((_split(shape, d, n) for d in dims if shape[d] % n == 0), P())
    return data_parallel(kind, path, shape, n)


COLUMN = re.compile(r"\['(wq|wk|wv)'\]$|\['fc1'\]\['w'\]$")
COLUMN_BIAS = re.compile(r"\['(bq|bk|bv)'\]$|\['fc1'\]\['b'\]$")
ROW = re.compile(r"\['wo'\]$|\['fc2'\]\['w'\]$")
MLP_LAYER = re.compile(r"^\[(\d+)\]\['(w|b)'\]$")
"""A zoo MLP's layer (a list of dense layers): even layers split by columns, odd by rows."""


def megatron(kind: str, path: str, shape: tuple[int, ...], n: int) -> P:
    if kind not in ("params", "adam_m", "adam_v") or "['moe']" in path:
        return P()
    layer = MLP_LAYER.match(path)
    if layer:
        column, weight = int(layer[1]) % 2 == 0, layer[2] == "w"
        if column:
            return _split(shape, len(shape) - 1 if weight else 0, n)
        return _split(shape, 0, n) if weight else P()
    if COLUMN.search(path):
        return _split(shape, len(shape) - 1, n)
    if COLUMN_BIAS.search(path):
        return _split(shape, 0, n)
    if ROW.search(path):
        return _split(shape, len(shape) - 2, n)
    return P()


def gshard(kind: str, path: str, shape: tuple[int, ...], n: int) -> P:
    if kind in ("params", "adam_m", "adam_v") and "['moe']" in path and "gate" not in path:
        return _split(shape, 0, n)  # [E, ...]
    return data_parallel(kind, path, shape, n)


def plans_for(family: str) -> dict[str, Layout]:
    """The hand plans that make sense for a zoo family."""
    found: dict[str, Layout] = {"data parallel": data_parallel, "zero": zero}
    if family in ("gpt", "dnabert", "mlp"):
        found["megatron"] = megatron
    if family == "moe":
        found["gshard"] = gshard
    return found


def leaves(args: tuple[Any, ...]) -> list[tuple[str, str, tuple[int, ...]]]:
    """(argument kind, key path, shape) of every leaf of the step's arguments, in the
    order jax flattens them (the entry parameters' order)."""
    found = []
    for kind, arg in zip(KINDS, args, strict=True):
        for path, leaf in jax.tree_util.tree_leaves_with_path(arg):
            found.append((kind, jax.tree_util.keystr(path), tuple(leaf.shape)))
    return found


def rhino_spec(spec: P, mesh_ndim: int = 2) -> ShardingSpec:
    """A PartitionSpec over ("a", "b") as rhino's spec on the 1xN mesh."""
    tokens = []
    for axis in ("a", "b")[:mesh_ndim]:
        dims = [d for d, name in enumerate(spec) if name == axis]
        tokens.append(f"S{dims[0]}" if dims else "R")
    return parse_spec("".join(tokens), mesh_ndim)


def pins(
    module: Module, args: tuple[Any, ...], layout: Layout, n: int
) -> tuple[tuple[str, ShardingSpec], ...]:
    """The hand plan's layout of every entry parameter, as rhino pins."""
    by_number = {p.parameter_number: p.name for p in module.entry.parameters}
    found = []
    for number, (kind, path, shape) in enumerate(leaves(args)):
        if number in by_number:
            found.append((by_number[number], rhino_spec(layout(kind, path, shape, n))))
    return tuple(found)
