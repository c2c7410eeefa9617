"""Loading tool modules by import path and by file: which names become tools, and every load error."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandfleet.core.errors import ToolLoadError
from sandfleet.worker.tools import ToolRegistry, ToolWarning

PLAIN = '''
    from os.path import join
    from json import dumps as public_import


    def load_orders(region: str | None = None) -> list[dict]:
        """Load the orders."""
        return []


    def _helper():
        """Private: not a tool."""


    class Order:
        """Classes are not tools."""


    def count(n: int) -> int:
        """Count to n."""
        return n


    LIMIT = 3
'''


def test_public_functions_defined_in_the_module_are_its_tools(write_module) -> None:
    write_module("sf_plain", PLAIN)
    registry = ToolRegistry.from_modules(["sf_plain"])
    assert registry.names() == ["load_orders", "count"]  # definition order; imports, _names, classes out
    assert registry.get("count").module == "sf_plain"


def test_all_decides_when_present(write_module) -> None:
    write_module(
        "sf_exported",
        '''
        from os.path import join as join_path

        __all__ = ["b", "join_path", "alias"]


        def a():
            """Not exported."""


        def b():
            """Exported."""


        def _impl():
            """Exported under another name."""


        alias = _impl
        ''',
    )
    registry = ToolRegistry.from_modules(["sf_exported"])
    assert registry.names() == ["b", "join_path", "alias"]
    assert registry.get("alias").signature == "alias()"


def test_file_path_absolute_and_relative(
    write_module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_module("file_tools", PLAIN)
    assert ToolRegistry.from_modules([str(path)]).names() == ["load_orders", "count"]
    monkeypatch.chdir(path.parent)
    registry = ToolRegistry.from_modules(["./file_tools.py"])
    assert registry.call("count", [4], {}) == 4
    assert registry.get("count").module == "./file_tools.py"


def test_comma_separated_string_and_repeats(write_module) -> None:
    write_module("sf_one", 'def one():\n    """One."""\n')
    write_module("sf_two", 'def two():\n    """Two."""\n')
    assert ToolRegistry.from_modules(" sf_one, ,sf_two,sf_one ").names() == ["one", "two"]
    assert ToolRegistry.from_modules([]).names() == []


def test_missing_docstring_warns_naming_the_tool(write_module) -> None:
    write_module("sf_bare", "def bare(x):\n    return x\n")
    with pytest.warns(ToolWarning, match="tool bare in sf_bare has no docstring"):
        registry = ToolRegistry.from_modules(["sf_bare"])
    assert registry.get("bare").description == ""
    assert registry.get("bare").describe() == "bare(x)"


def test_a_name_shadowing_a_builtin_warns(write_module) -> None:
    write_module("sf_shadow", 'def open(path):\n    """Open."""\n')
    with pytest.warns(ToolWarning, match="shadows the Python builtin 'open'"):
        ToolRegistry.from_modules(["sf_shadow"])


def test_duplicate_names_across_modules_name_both(write_module) -> None:
    write_module("sf_first", 'def lookup():\n    """First."""\n')
    write_module("sf_second", 'def lookup():\n    """Second."""\n')
    with pytest.raises(ToolLoadError, match="two tools are named lookup: one in sf_first, one in sf_second"):
        ToolRegistry.from_modules(["sf_first", "sf_second"])


def test_import_error_keeps_its_cause(write_module) -> None:
    write_module("sf_broken", 'raise RuntimeError("no database")\n')
    with pytest.raises(
        ToolLoadError, match="sf_broken cannot be imported: RuntimeError: no database"
    ) as info:
        ToolRegistry.from_modules(["sf_broken"])
    assert isinstance(info.value.__cause__, RuntimeError)


def test_unknown_module_says_how_to_name_one() -> None:
    with pytest.raises(ToolLoadError, match=r"no tools module named 'sf_nowhere_at_all'.*PYTHONPATH"):
        ToolRegistry.from_modules(["sf_nowhere_at_all"])


def test_a_missing_dependency_is_named(write_module) -> None:
    write_module("sf_needs", "import sf_absent_dependency\n")
    with pytest.raises(
        ToolLoadError, match="sf_needs cannot be imported: No module named 'sf_absent_dependency'"
    ):
        ToolRegistry.from_modules(["sf_needs"])


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ToolLoadError, match=r"tools file .*nothing\.py does not exist"):
        ToolRegistry.from_modules([str(tmp_path / "nothing.py")])


def test_file_with_a_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "bad_syntax.py"
    path.write_text("def broken(:\n")
    with pytest.raises(ToolLoadError, match=r"bad_syntax\.py cannot be imported: SyntaxError"):
        ToolRegistry.from_modules([str(path)])


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            '__all__ = ["LIMIT"]\nLIMIT = 3\n',
            "__all__ of sf_entries names 'LIMIT', of type int, which is not callable",
        ),
        ('__all__ = ["gone"]\n', "__all__ of sf_entries names 'gone', which the module does not define"),
        ('__all__ = ["Order"]\nclass Order:\n    """A class."""\n', "Order in sf_entries is a class"),
        ('async def fetch():\n    """Async."""\n', "tool fetch in sf_entries is async"),
    ],
)
def test_entries_that_are_not_tools(write_module, source: str, message: str) -> None:
    write_module("sf_entries", source)
    with pytest.raises(ToolLoadError, match=message):
        ToolRegistry.from_modules(["sf_entries"])


FAKE_LANGCHAIN = '''
    """Shaped like langchain_core.tools (not installed here): a pydantic StructuredTool and ``@tool``."""

    from pydantic import BaseModel


    class StructuredTool(BaseModel):
        name: str
        description: str
        func: object
        coroutine: object = None

        def invoke(self, tool_input):
            return self.func(**tool_input)


    def tool(func):
        return StructuredTool(name=func.__name__, description=func.__doc__ or "", func=func)
'''

USES_LANGCHAIN = '''
    from sf_fake_langchain import StructuredTool, tool


    @tool
    def get_weather(city: str, units: str = "metric") -> dict:
        """Current weather for a city.

        Longer text the model does not see.
        """
        return {"city": city, "units": units}


    def plain(n: int) -> int:
        """A plain function beside it."""
        return n
'''


def test_langchain_tool_objects_defined_in_the_module_are_tools(write_module) -> None:
    write_module("sf_fake_langchain", FAKE_LANGCHAIN)
    write_module("sf_langchain", USES_LANGCHAIN)
    registry = ToolRegistry.from_modules(["sf_langchain"])
    assert registry.names() == ["get_weather", "plain"]  # imported StructuredTool and tool are not tools
    weather = registry.get("get_weather")
    assert weather.signature == "get_weather(city: str, units: str = 'metric') -> dict"
    assert weather.description == "Current weather for a city."
    assert registry.call("get_weather", ["Oslo"], {"units": "imperial"}) == {
        "city": "Oslo",
        "units": "imperial",
    }
