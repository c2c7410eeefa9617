"""The tools a worker offers, by name: loaded once from modules, narrowed per job to its allow-list.

The bridge's host side serves a program's calls through :meth:`ToolRegistry.call`; what the model and the
program see of the tools comes from :meth:`ToolRegistry.describe`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sandfleet.core.errors import InvalidSpecError, ToolLoadError
from sandfleet.worker.tools.loading import import_tools_module, tools_of
from sandfleet.worker.tools.tool import Tool, ToolWarning, side_effects
from sandfleet.worker.tools.values import to_json_value

__all__ = ["Tool", "ToolRegistry", "ToolWarning", "side_effects"]


class ToolRegistry:
    """An immutable set of tools with unique names, in the order they were loaded."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            earlier = self._tools.get(tool.name)
            if earlier is not None:
                raise ToolLoadError(
                    f"two tools are named {tool.name}: one in {earlier.module or '?'}, "
                    f"one in {tool.module or '?'}; rename one or leave it out of __all__"
                )
            self._tools[tool.name] = tool

    @classmethod
    def from_modules(cls, specs: Iterable[str] | str) -> ToolRegistry:
        """Load the tools of modules named by import path (``pkg.mod``) or file (``./tools.py``).

        Args:
            specs: the module specs; a single string is split on commas (the ``SANDFLEET_TOOLS`` form).
                Blank entries and repeats are skipped.

        Raises:
            ToolLoadError: a module cannot be imported, an ``__all__`` entry is not a tool, or two tools
                share a name (the message names both modules).
        """
        if isinstance(specs, str):
            specs = specs.split(",")
        seen: list[str] = []
        tools: list[Tool] = []
        for raw in specs:
            spec = raw.strip()
            if spec and spec not in seen:
                seen.append(spec)
                tools.extend(tools_of(import_tools_module(spec), label=spec))
        return cls(tools)

    @classmethod
    def from_functions(cls, funcs: Iterable[Callable[..., Any]], module: str = "") -> ToolRegistry:
        """Tools made of functions (or LangChain tools) in hand, named after them: handy in tests."""
        return cls(Tool.from_object(func, module=module) for func in funcs)

    def names(self) -> list[str]:
        """Tool names in load order."""
        return list(self._tools)

    def get(self, name: str) -> Tool:
        """The tool called ``name``.

        Raises:
            KeyError: no such tool; the message lists the available ones.
        """
        try:
            return self._tools[name]
        except KeyError:
            raise KeyError(f"no tool named {name!r}; available tools: {self._available()}") from None

    def subset(self, allowed: Iterable[str]) -> ToolRegistry:
        """The tools a job may call, in load order.

        Raises:
            InvalidSpecError: a name is not a loaded tool; the message lists the unknown and available ones.
        """
        wanted = list(dict.fromkeys(allowed))
        unknown = [name for name in wanted if name not in self._tools]
        if unknown:
            raise InvalidSpecError(
                f"unknown tool{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                f"available tools: {self._available()}"
            )
        return ToolRegistry(tool for name, tool in self._tools.items() if name in wanted)

    def describe(self) -> str:
        """Every tool's signature and description, one after the other (for the prompt and the program)."""
        return "\n".join(tool.describe() for tool in self._tools.values())

    def call(self, name: str, args: list[Any], kwargs: dict[str, Any], timeout_s: float | None = None) -> Any:
        """Call a tool as the program asked and return its result as a JSON value.

        ``timeout_s`` reaches tools that stop themselves (``Tool.stops_at_timeout``: MCP calls).

        Raises:
            KeyError: no such tool.
            TypeError: the arguments do not fit the signature (Python's own message).
            ValueConversionError: the result cannot become JSON (names the type and where it sits).
            Exception: whatever the tool itself raises, unchanged.
        """
        tool = self.get(name)
        return to_json_value(tool.call(args, kwargs, timeout_s), what=f"tool {name} returned")

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Any:
        return iter(self._tools.values())

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names()!r})"

    def _available(self) -> str:
        return ", ".join(self._tools) or "(none loaded)"
