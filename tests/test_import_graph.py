"""embcore's modules import each other without a cycle (imports inside functions, which run
later, and ``if TYPE_CHECKING:`` blocks, which never run, do not count), and its top-level
packages import each other without a cycle even when imports inside functions and string
registries count."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import embcore

SRC = Path(embcore.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Import statements that run when the module is imported."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, ast.If):
                test = ast.unparse(node.test)
                if test not in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return found


def import_graph() -> dict[str, set[str]]:
    """embcore module -> the embcore modules its import runs (package ``__init__`` included,
    except the importer's own packages, which are already being imported)."""
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _top_level_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    package = name if is_package else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}".rstrip(".")
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            for target in targets:
                if not target.startswith("embcore"):
                    continue
                parts = target.split(".")
                for i in range(1, len(parts) + 1):  # a submodule runs its packages first
                    prefix = ".".join(parts[:i])
                    ancestor = name == prefix or name.startswith(prefix + ".")
                    if prefix in modules and not ancestor:
                        edges.add(prefix)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_imports():
    graph = import_graph()
    assert "embcore.engine._store" in graph["embcore.engine._engine"]
    assert "embcore.sharding.schemes" in graph["embcore.sharding._store"]
    assert "embcore._engine_class" in graph["embcore.sharding.compat"]


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_among_embcore_modules():
    assert find_cycle(import_graph()) is None


@pytest.mark.parametrize(
    "name",
    ["embcore.engine", "embcore.sharding.compat", "embcore.sharding._store", "embcore.ops"],
)
def test_engine_modules_import(name):
    assert importlib.import_module(name)


# ------------------------------------------------ top-level packages, every import counted

_MODULE_STRING = re.compile(r"(embcore(?:\.\w+)+)(?::\w+)?")


def _every_import(tree: ast.Module) -> list[str]:
    """The modules a module's code may import: import statements anywhere (inside functions
    too, but not in ``if TYPE_CHECKING:`` blocks, which never run) and strings that name an
    embcore module (registries such as ``"embcore.rows.dense:DenseRows"``)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            skipped |= {id(n) for n in ast.walk(node)}
    found: list[str] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _MODULE_STRING.fullmatch(node.value)
            found += [match.group(1)] if match else []
    return found


def _top(module: str) -> str:
    """``embcore.sharding.schemes.row_wise`` -> ``embcore.sharding``."""
    return ".".join(module.split(".")[:2])


def package_graph() -> dict[str, set[str]]:
    """embcore's top-level package or module -> the others its code imports, every import
    counted (:func:`_every_import`)."""
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        name = _module_name(path)
        edges = graph.setdefault(_top(name), set())
        for target in _every_import(ast.parse(path.read_text(), str(path))):
            if target.startswith("embcore.") and _top(target) != _top(name):
                edges.add(_top(target))
    return graph


def test_the_package_graph_counts_lazy_imports_and_registries():
    graph = package_graph()
    assert "embcore.sharding" in graph["embcore.engine"]  # the STORES registry's string
    assert "embcore.train" in graph["embcore.compat"]  # imported inside a function only
    assert "embcore.rows" in graph["embcore.sharding"]
    assert "embcore._numba" in graph["embcore.ops"]


def test_no_cycle_among_top_level_packages_counting_every_import():
    """The layers (docs/architecture.md) import only downwards, also inside functions and
    through string registries: no exception."""
    assert find_cycle(package_graph()) is None


def test_the_sharding_package_does_not_import_the_engine():
    """``ShardedEmbeddingEngine`` builds an engine through the class the engine registers
    (``embcore._engine_class``), not by importing the package above it."""
    assert "embcore.engine" not in package_graph()["embcore.sharding"]
