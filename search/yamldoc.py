"""YAML files read as node trees, so that every error names the file, line:col and key.

The one reader of rhino's YAML inputs (clusters, sweeps, pins): `load` composes the text
(a syntax error is a ConfigError at its line and column), and a `YamlReader` gives typed
access to the nodes, each failure a ConfigError `FILE:LINE:COL: key 'a.b': message`.
Scalars are typed as `yaml.safe_load` types them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rhino.hlo.errors import ConfigError


def read_text(path: str | Path, what: str) -> str:
    """The text of a UTF-8 file, or a ConfigError naming it (`what`: "the pins file")."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None


def load(text: str, source: str) -> tuple[YamlReader, yaml.Node | None]:
    """A reader of `text` (named `source` in messages) and its root node (None when the
    text holds no document)."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{source}{where}: not valid YAML: {problem}") from None
    finally:
        loader.dispose()  # the parser's state; constructing scalars needs none of it
    return YamlReader(source, loader), root


class YamlReader:
    """Typed access to the nodes of one YAML document (see module doc)."""

    def __init__(self, source: str, loader: yaml.SafeLoader) -> None:
        self.source = source
        self.loader = loader

    def at(self, node: yaml.Node) -> str:
        """`FILE:LINE:COL` of a node."""
        mark = node.start_mark
        return f"{self.source}:{mark.line + 1}:{mark.column + 1}"

    def fail(self, node: yaml.Node, key: str, message: str) -> ConfigError:
        where = f"key '{key}'" if key else "top level"
        return ConfigError(f"{self.at(node)}: {where}: {message}")

    def mapping(
        self, node: yaml.Node, key: str, allowed: Sequence[str] | None
    ) -> dict[str, yaml.Node]:
        """A mapping's values by key; unknown keys (when `allowed` is given) and keys given
        twice are errors."""
        if not isinstance(node, yaml.MappingNode):
            expected = (
                f"expected a mapping with keys {', '.join(allowed)}"
                if allowed
                else "expected a mapping"
            )
            raise self.fail(node, key, f"{expected}, got {kind_of(node)}")
        out: dict[str, yaml.Node] = {}
        for k, v in node.value:
            name = str(self.scalar(k))
            full = f"{key}.{name}" if key else name
            if allowed is not None and name not in allowed:
                raise self.fail(k, full, f"unknown key; expected one of {', '.join(allowed)}")
            if name in out:
                raise self.fail(k, full, "given twice")
            out[name] = v
        return out

    def required(
        self, values: dict[str, yaml.Node], name: str, key: str, node: yaml.Node
    ) -> yaml.Node:
        """`values[name]`, where `values` is the mapping `node` at `key`; missing is an error."""
        if name not in values:
            raise self.fail(node, f"{key}.{name}" if key else name, "missing")
        return values[name]

    def items(self, node: yaml.Node, key: str) -> list[yaml.Node]:
        """The items of a sequence; a single value counts as a list of one."""
        if not isinstance(node, yaml.SequenceNode):
            return [node]
        if not node.value:
            raise self.fail(node, key, "empty list")
        return list(node.value)

    def string(self, node: yaml.Node, key: str) -> str:
        value = self.scalar(node)
        if not isinstance(value, str) or not value:
            raise self.fail(node, key, f"expected a string, got {kind_of(node)}")
        return value

    def positive_int(self, node: yaml.Node, key: str) -> int:
        value = self.scalar(node)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(node, key, f"expected a positive integer, got {kind_of(node)}")
        return value

    def scalar(self, node: yaml.Node) -> Any:
        """The value of a scalar node as YAML types it; a `_Composite` for a mapping or
        list (it prints as what it is, for messages)."""
        if not isinstance(node, yaml.ScalarNode):
            return _Composite(node)
        return self.loader.construct_object(node, deep=True)


def kind_of(node: yaml.Node) -> str:
    """What a node holds, for messages: `a list`, `an empty mapping`, `'RS1'`, `nothing`."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping" if node.value else "an empty mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return repr(yaml.SafeLoader("").construct_object(node)) if node.value else "nothing"


@dataclass(frozen=True)
class _Composite:
    """A mapping or list where a scalar was expected (for error messages)."""

    node: yaml.Node

    def __repr__(self) -> str:
        return kind_of(self.node)
