"""Values as plain JSON: dataclasses, tuples and numpy scalars as JSON types (`jsonable`),
for every command's `--json` document and the plan file. Nothing here imports numpy: a
`--json` of `rhino parse` needs no array library."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Any

from rhino.hlo.collector import collector_paused

_PLAIN = frozenset({str, int, float, bool, type(None)})
"""The types JSON takes as they are (exactly these: a subclass, say a numpy float, goes the
long way)."""


def jsonable(value: Any) -> Any:
    """Dataclasses (field by field, or by their own `to_json` where they have one: a mesh
    as its axis sizes, the solver's report as in the plan file), tuples and numpy scalars
    as plain JSON types; what `dataclasses.asdict` gives, without its deep copies.

    A 40k-instruction plan is some 600k values, most of them strings and numbers in
    dataclasses and tuples: those take a short path (`_PLAIN`, `_converter`). The
    collector is paused meanwhile, as in the parser: many objects are made and none freed,
    and it would rescan the search's whole heap over and over."""
    with collector_paused():
        return _json(value)


def _json(value: Any) -> Any:
    """`jsonable`, the collector left as it is."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is tuple or kind is list:
        if all(type(v) in _PLAIN for v in value):
            return list(value)
        return [_json(v) for v in value]
    if kind is dict:
        return {str(k): v if type(v) in _PLAIN else _json(v) for k, v in value.items()}
    convert = _CONVERTERS.get(kind)
    if convert is None:
        convert = _CONVERTERS[kind] = _converter(kind)
    return convert(value)


_CONVERTERS: dict[type, Callable[[Any], Any]] = {}
"""Type -> `_converter(type)`, decided as values of the type are met."""


def _converter(kind: type) -> Callable[[Any], Any]:
    """How `jsonable` turns a value of type `kind` (not plain, not a tuple, list or dict)
    into JSON, decided once per type."""
    if issubclass(kind, str | int | float | bool):
        return lambda value: value
    if callable(getattr(kind, "to_json", None)) and not issubclass(kind, type):
        return lambda value: _json(value.to_json())
    if issubclass(kind, dict | list | tuple):
        return _jsonable_slowly
    if is_dataclass(kind):
        names = tuple(f.name for f in fields(kind))

        def fields_of(value: Any) -> dict[str, Any]:
            return {
                name: v if type(v := getattr(value, name)) in _PLAIN else _json(v) for name in names
            }

        return fields_of
    return _jsonable_slowly


def _jsonable_slowly(value: Any) -> Any:
    """`jsonable` of a value whose type `_converter` has no short way for (a subclass of
    dict, list or tuple, a numpy scalar, ...)."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    own = getattr(value, "to_json", None)
    if callable(own) and not isinstance(value, type):
        return _json(own())
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _json(getattr(value, f.name)) for f in fields(value)}
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value
