"""Layouts a user fixes before the search: `--pin NAME=SPEC` flags and `--pins FILE.yaml`,
read and checked against the module (the planner takes them as `PlanRequest.pins`)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass

import yaml

from rhino.hlo.errors import ConfigError
from rhino.hlo.ir import Module
from rhino.search.mesh import DeviceMesh
from rhino.search.spmd.spec import ShardingSpec, parse_spec
from rhino.search.yamldoc import kind_of, load, read_text

EXPECTED = "expected a mapping of instruction name to layout, e.g. `params_0_.1: RS1`"


@dataclass(frozen=True)
class Pin:
    """A layout the user fixed for one instruction's result."""

    name: str
    """Instruction name, without the `%`."""
    spec: ShardingSpec
    """The layout, one token per mesh axis."""
    where: str
    """Where it was given, to start error messages: `--pin w1=RS1`,
    `pins.yaml:3:1: key 'w1'`."""


def pin_from_text(text: str, ndim: int, where: str) -> Pin:
    """The pin `NAME=SPEC` (a leading % on the name is allowed), given at `where`."""
    name, sep, spec = text.partition("=")
    if not sep or not name:
        raise ConfigError(f"pin {text!r}: expected NAME=SPEC, e.g. w1=RS1", "pin")
    return Pin(name.lstrip("%"), parse_spec(spec, ndim), where)


def read_pins_file(path: str, ndim: int) -> list[Pin]:
    """The pins of a `--pins` file: a YAML mapping of instruction name to layout,

        params_0_.1: RS1        # one token per mesh axis (see `rhino plan --help`)
        "%dot.5": S0R           # a leading % is allowed (quote it: % starts a YAML directive)

    Keys and values are read as written (no YAML typing). Every error is a ConfigError
    naming the file, line:col and key.
    """
    reader, root = load(read_text(path, "the pins file"), path)
    if not isinstance(root, yaml.MappingNode) or not root.value:
        got = "an empty file" if root is None else kind_of(root)
        line = f":{root.start_mark.line + 1}:{root.start_mark.column + 1}" if root else ""
        raise ConfigError(f"{path}{line}: {EXPECTED}, got {got}")
    out: dict[str, Pin] = {}
    first_line: dict[str, int] = {}
    for key_node, value_node in root.value:
        at = reader.at(key_node)
        if not isinstance(key_node, yaml.ScalarNode) or not key_node.value:
            raise ConfigError(f"{at}: {EXPECTED}, got the key {kind_of(key_node)}")
        name = key_node.value.lstrip("%")
        where = f"{at}: key '{name}'"
        if name in out:
            raise ConfigError(f"{where}: given twice (first on line {first_line[name]})")
        if not isinstance(value_node, yaml.ScalarNode) or not value_node.value:
            raise ConfigError(f"{where}: expected a layout such as RS1, got {kind_of(value_node)}")
        try:
            spec = parse_spec(value_node.value, ndim)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        out[name], first_line[name] = Pin(name, spec, where), key_node.start_mark.line + 1
    return list(out.values())


def check_pins(pins: Iterable[Pin], module: Module, mesh: DeviceMesh, file: str) -> None:
    """Raise ConfigError for a pin that names no instruction of `module` (read from
    `file`), or whose layout does not fit that instruction's array shape on `mesh`."""
    by_name = {inst.name: inst for inst in module.instructions()}
    for pin in pins:
        inst = by_name.get(pin.name)
        if inst is None:
            close = difflib.get_close_matches(pin.name, by_name, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ConfigError(f"{pin.where}: no instruction %{pin.name} in {file}{hint}")
        problem = None if inst.shape.is_tuple else pin.spec.problem(inst.shape.dims, mesh)
        if problem is not None:
            raise ConfigError(f"{pin.where}: {problem} (%{pin.name} is {inst.shape})")
