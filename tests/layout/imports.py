"""The package's import graph, read from the source with ``ast`` (no module is imported).

Every import counts: at module level, inside functions (lazy imports) and under ``TYPE_CHECKING``,
because a circle held together by lazy imports is still a circle. Dynamic imports by string
(``importlib.import_module``: the CLI's command table, the root package's lazy exports) are not
edges: they are how one room reaches another without depending on it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = ROOT / "sandfleet"


def module_files() -> dict[str, Path]:
    """``module name -> file`` for every module of the ``sandfleet`` package."""
    modules: dict[str, Path] = {}
    for path in sorted(_walk(PACKAGE_DIR)):
        parts = list(path.relative_to(PACKAGE_DIR).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(["sandfleet", *parts])] = path
    return modules


def _walk(folder: Path) -> Iterator[Path]:
    for entry in folder.iterdir():
        if entry.is_dir() and (entry / "__init__.py").exists():
            yield from _walk(entry)
        elif entry.suffix == ".py":
            yield entry


def imported_modules(module: str, path: Path, known: set[str]) -> set[str]:
    """The ``sandfleet`` modules ``module`` imports, anywhere in its source."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {_nearest_module(name, known) for name in found if name.startswith("sandfleet")} - {None, module}


def _nearest_module(name: str, known: set[str]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    known = set(modules)
    return {name: imported_modules(name, path, known) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def room_of(module: str) -> str:
    """``sandfleet.worker.sandbox.pool`` -> ``worker``; the root package's own modules -> ``root``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ROOMS) else "root"


ROOMS = ("core", "producer", "worker", "fleet")


Function = ast.FunctionDef | ast.AsyncFunctionDef


def functions(tree: ast.AST, prefix: str = "") -> list[tuple[Function, str]]:
    """Every function and method of ``tree`` with its qualified name (``Class.method``, nested ones
    dotted too), for the size rules of test_function_length and test_engine_room_size."""
    out: list[tuple[Function, str]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                out.append((node, name))
            out.extend(functions(node, name + "."))
    return out
