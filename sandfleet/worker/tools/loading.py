"""Finding the tools of a module named by import path (``pkg.mod``) or by file (``./tools.py``).

A module's tools are its ``__all__`` if it has one (every entry must then be a tool), else every public
function defined in it: names imported into the module and names starting with ``_`` are not tools.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from sandfleet.core.errors import ToolLoadError
from sandfleet.worker.tools.tool import Tool, _is_langchain_shaped

FILE_MODULE_PREFIX = "sandfleet_tools_file_"


def is_file_spec(spec: str) -> bool:
    """A spec names a file when it ends in ``.py`` or holds a path separator; else an import path."""
    return spec.endswith(".py") or "/" in spec or "\\" in spec


def import_tools_module(spec: str) -> ModuleType:
    """Import the module a spec names.

    Raises:
        ToolLoadError: no such module or file, or importing it raised (the cause is kept).
    """
    if is_file_spec(spec):
        return _import_file(Path(spec))
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        # e.name is what was missing: the module itself (or its package), or something it imports.
        if e.name and spec != e.name and not spec.startswith(f"{e.name}."):
            raise ToolLoadError(f"tools module {spec} cannot be imported: {e}") from e
        raise ToolLoadError(
            f"no tools module named {spec!r} (is it installed or on PYTHONPATH? A file path must end in .py)"
        ) from e
    except Exception as e:
        raise ToolLoadError(f"tools module {spec} cannot be imported: {type(e).__name__}: {e}") from e


def _import_file(path: Path) -> ModuleType:
    resolved = path.expanduser().resolve()
    if not resolved.is_file():
        raise ToolLoadError(f"tools file {path} does not exist (resolved to {resolved})")
    # A stable module name per file, so dataclasses, pickling and tracebacks work; fresh on every load.
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    name = f"{FILE_MODULE_PREFIX}{_identifier(resolved.stem)}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise ToolLoadError(f"tools file {path} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[name]
        if not isinstance(e, Exception):
            raise
        raise ToolLoadError(f"tools file {path} cannot be imported: {type(e).__name__}: {e}") from e
    return module


def _identifier(text: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in text)


def tools_of(module: ModuleType, label: str | None = None) -> list[Tool]:
    """The tools of an imported module, in ``__all__`` order or else in definition order.

    Args:
        module: the imported module.
        label: how errors name the module (the spec the user wrote); its ``__name__`` by default.

    Raises:
        ToolLoadError: an ``__all__`` entry is missing or not a tool.
    """
    label = label or module.__name__
    exported = getattr(module, "__all__", None)
    if exported is None:
        return [
            Tool.from_object(obj, name=None if _is_langchain_shaped(obj) else name, module=label)
            for name, obj in vars(module).items()
            if not name.startswith("_") and _defined_in(obj, module)
        ]
    tools = []
    for name in exported:
        if not hasattr(module, name):
            raise ToolLoadError(f"__all__ of {label} names {name!r}, which the module does not define")
        obj = getattr(module, name)
        if not callable(obj) and not _is_langchain_shaped(obj):
            kind = type(obj).__name__
            raise ToolLoadError(f"__all__ of {label} names {name!r}, of type {kind}, which is not callable")
        tools.append(Tool.from_object(obj, name=None if _is_langchain_shaped(obj) else name, module=label))
    return tools


def _defined_in(obj: Any, module: ModuleType) -> bool:
    """A function defined in the module itself (not imported into it), or a LangChain tool made there."""
    if inspect.isfunction(obj):
        return obj.__module__ == module.__name__
    if _is_langchain_shaped(obj):
        func = getattr(obj, "func", None)
        origin = getattr(func, "__module__", None) if callable(func) else type(obj).__module__
        return origin == module.__name__
    return False
