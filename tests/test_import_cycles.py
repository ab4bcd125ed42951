"""The package's architecture, read from the modules' imports in their source (at module
level and inside functions alike; `if TYPE_CHECKING:` blocks aside, which never run): no
import cycle, dependencies pointing one way (hlo <- search <- runtime <- cli), and no jax
below runtime."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.hlo.corpus import ROOT

PACKAGES = {
    "rhino.hlo": "hlo",
    "rhino.search": "search",
    "rhino.runtime": "runtime",
    "rhino.cli": "cli",
    "rhino.jax": "runtime/jaxapi",
}
"""Each subpackage of `rhino` and its folder (pyproject.toml's package-dir)."""


def modules(root: Path, packages: dict[str, str]) -> dict[str, Path]:
    """Dotted module name -> source file, for every module under the packages' folders."""
    found = {}
    folders = {root / folder for folder in packages.values()}
    for package, folder in packages.items():
        inner = [f for f in folders if root / folder in f.parents]  # rhino.jax in runtime/
        for path in (root / folder).rglob("*.py"):
            if any(f in path.parents for f in inner):
                continue  # that package's own
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def imported(path: Path, known: dict[str, Path] | None) -> set[str]:
    """The modules of `known` that `path` imports (`from p import m` of a submodule m
    counts as importing m, not the package p); with `known` None, every module it names
    (jax, numpy, ...)."""
    out: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                out.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    out.add(sub if known is not None and sub in known else node.module)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    visit([child])
                elif isinstance(child, ast.excepthandler):
                    visit(child.body)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return out if known is None else {m for m in out if m in known}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def import_graph(root: Path, packages: dict[str, str]) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {name: imported(path, known) for name, path in known.items()}


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 50 and "rhino.runtime.request" in graph["rhino.cli.run_cmd"]
    assert cycles(graph) == []


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "__init__.py").write_text("")
    (tmp_path / "p" / "a.py").write_text("from p.b import f\n")
    (tmp_path / "p" / "b.py").write_text("def f():\n    from p import c\n")
    (tmp_path / "p" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import p.b\nimport p.a\n"
    )
    (tmp_path / "p" / "d.py").write_text("import p.a\n")
    graph = import_graph(tmp_path, {"p": "p"})
    assert graph["p.c"] == {"p.a"}  # the TYPE_CHECKING import left out
    assert cycles(graph) == [["p.a", "p.b", "p.c"]]


LAYERS = (("rhino.hlo",), ("rhino.search",), ("rhino.runtime",), ("rhino.cli", "rhino.jax"))
"""From the bottom up: a module imports from its own layer and those below it (the two
front ends, the CLI and the JAX API, share the top one)."""


def _layer(module: str) -> int:
    return next(
        i
        for i, tops in enumerate(LAYERS)
        for top in tops
        if module == top or module.startswith(top + ".")
    )


def test_dependencies_point_one_way() -> None:
    upward = sorted(
        f"{m} imports {d}"
        for m, deps in import_graph(ROOT, PACKAGES).items()
        for d in deps
        if _layer(d) > _layer(m)
    )
    assert upward == []


def test_nothing_below_runtime_imports_jax() -> None:
    below = {"rhino.hlo": "hlo", "rhino.search": "search"}
    with_jax = sorted(
        name
        for name, path in modules(ROOT, below).items()
        if any(m == "jax" or m.startswith(("jax.", "jaxlib")) for m in imported(path, None))
    )
    assert with_jax == []
