"""Tool descriptions, argument binding with Python's own errors, allow-list subsets and calls."""

from __future__ import annotations

import datetime as dt
import functools
import typing
from typing import Any

import pytest
from pydantic import BaseModel

from sandfleet.core.errors import InvalidSpecError, ToolLoadError
from sandfleet.worker.tools import Tool, ToolRegistry, ValueConversionError, side_effects


def load_orders(region: str | None = None, *, limit: int = 100) -> list[dict]:
    """Load the orders, optionally for one region.

    This second paragraph is not shown to the model.
    """
    return [{"region": region, "limit": limit}]


def get_order(order_id: str, /, fields: list[str] | None = None, *extra: str, **options: Any) -> dict:
    """One order by id."""
    return {"order_id": order_id}


def nothing() -> None:
    """

    Leading blank lines are skipped.
    """


def evaluated(when: dt.date, kinds: typing.Optional[list[int]] = None) -> typing.Dict[str, int]:  # noqa: UP006, UP045
    """Typing aliases; with future annotations they stay text, shown exactly as written."""
    return {}


@side_effects
def send(to: str) -> str:
    """Send something."""
    return "id-1"


def test_signature_and_description_as_the_model_sees_them() -> None:
    tool = Tool.from_object(load_orders)
    assert tool.signature == "load_orders(region: str | None = None, *, limit: int = 100) -> list[dict]"
    assert tool.description == "Load the orders, optionally for one region."
    assert tool.describe() == (
        "load_orders(region: str | None = None, *, limit: int = 100) -> list[dict]\n"
        "    Load the orders, optionally for one region."
    )
    assert Tool.from_object(get_order).signature == (
        "get_order(order_id: str, /, fields: list[str] | None = None, *extra: str, **options: Any) -> dict"
    )
    assert Tool.from_object(nothing).signature == "nothing() -> None"
    assert Tool.from_object(nothing).description == "Leading blank lines are skipped."


def test_evaluated_annotations_are_rendered_readably() -> None:
    # Same annotations as `evaluated`, but as objects rather than the strings future annotations leave.
    def typed(when, kinds=None):
        """Typed."""

    typed.__annotations__ = {"when": dt.date, "kinds": typing.Optional[list[int]], "return": dict[str, int]}  # noqa: UP045
    assert Tool.from_object(typed).signature == (
        "typed(when: datetime.date, kinds: Optional[list[int]] = None) -> dict[str, int]"
    )
    assert Tool.from_object(evaluated).signature == (
        "evaluated(when: dt.date, kinds: typing.Optional[list[int]] = None) -> typing.Dict[str, int]"
    )


def test_registry_describe_lists_every_tool_in_order() -> None:
    registry = ToolRegistry.from_functions([load_orders, send])
    assert registry.describe() == "\n".join(
        [Tool.from_object(load_orders).describe(), "send(to: str) -> str\n    Send something."]
    )
    assert len(registry) == 2 and "send" in registry and [t.name for t in registry] == ["load_orders", "send"]


BAD_CALLS = [
    (load_orders, [], {"regoin": "EMEA"}),
    (load_orders, ["EMEA", 5], {}),
    (load_orders, ["EMEA"], {"region": "APAC"}),
    (get_order, [], {}),
    (get_order, [], {"order_id": "O-0001"}),
    (send, [], {}),
    (send, ["a", "b"], {}),
    (nothing, [1], {}),
]


@pytest.mark.parametrize(("func", "args", "kwargs"), BAD_CALLS)
def test_bind_raises_the_error_python_raises(func, args: list, kwargs: dict) -> None:
    with pytest.raises(TypeError) as direct:
        func(*args, **kwargs)
    with pytest.raises(TypeError) as bound:
        Tool.from_object(func).bind(args, kwargs)
    assert str(bound.value) == str(direct.value)


def test_bind_errors_use_the_tool_name_the_program_uses() -> None:
    tool = Tool.from_object(get_order, name="fetch_order")
    with pytest.raises(
        TypeError, match=r"^fetch_order\(\) missing 1 required positional argument: 'order_id'$"
    ):
        tool.bind([], {})


def test_bind_returns_the_bound_arguments_with_defaults_kept_as_objects() -> None:
    marker = object()

    def uses_default(x: int, y: object = marker) -> None:
        """Default is an object, not text."""

    tool = Tool.from_object(uses_default)
    assert tool.bind([1], {}).arguments == {"x": 1}
    assert tool.call([1], {}) is None
    bound = Tool.from_object(get_order).bind(["O-1", ["date"], "a"], {"deep": True})
    assert bound.args == ("O-1", ["date"], "a") and bound.kwargs == {"deep": True}


def test_get_and_subset() -> None:
    registry = ToolRegistry.from_functions([load_orders, get_order, send])
    assert registry.subset(["send", "load_orders", "send"]).names() == ["load_orders", "send"]
    assert registry.subset([]).names() == []
    with pytest.raises(
        InvalidSpecError, match="unknown tools drop_db, rm; available tools: load_orders, get_order, send"
    ):
        registry.subset(["load_orders", "drop_db", "rm"])
    with pytest.raises(
        KeyError, match="no tool named 'drop_db'; available tools: load_orders, get_order, send"
    ):
        registry.get("drop_db")


def test_call_binds_calls_and_converts() -> None:
    registry = ToolRegistry.from_functions([load_orders, get_order])
    assert registry.call("load_orders", ["EMEA"], {"limit": 2}) == [{"region": "EMEA", "limit": 2}]
    with pytest.raises(TypeError, match="unexpected keyword argument 'regoin'"):
        registry.call("load_orders", [], {"regoin": "EMEA"})


def test_call_lets_the_tools_own_exception_through() -> None:
    def failing(order_id: str) -> dict:
        """Always fails."""
        raise KeyError(f"no order {order_id}")

    with pytest.raises(KeyError, match="no order O-9"):
        ToolRegistry.from_functions([failing]).call("failing", ["O-9"], {})


def test_call_names_the_tool_when_its_result_cannot_cross() -> None:
    def tags() -> dict:
        """Tags as a set: a mistake."""
        return {"tags": {"a"}}

    with pytest.raises(
        ValueConversionError, match=r"^tool tags returned a set at \['tags'\], which cannot cross"
    ):
        ToolRegistry.from_functions([tags]).call("tags", [], {})


def test_side_effects_marker() -> None:
    registry = ToolRegistry.from_functions([load_orders, send])
    assert registry.get("send").side_effects is True
    assert registry.get("load_orders").side_effects is False


def test_partials_and_callable_objects() -> None:
    partial = functools.partial(load_orders, limit=5)

    class Counter:
        """Counts calls."""

        def __call__(self, step: int = 1) -> int:
            return step

    registry = ToolRegistry(
        [Tool.from_object(partial, name="recent_orders"), Tool.from_object(Counter(), name="count")]
    )
    assert (
        registry.get("recent_orders").signature
        == "recent_orders(region: str | None = None, *, limit: int = 5) -> list[dict]"
    )
    assert registry.get("recent_orders").description == "Load the orders, optionally for one region."
    assert registry.call("recent_orders", [], {}) == [{"region": None, "limit": 5}]
    assert registry.get("count").signature == "count(step: int = 1) -> int"
    assert registry.call("count", [3], {}) == 3


# LangChain is not installed: these fakes have the shapes of its tool classes.


class WeatherArgs(BaseModel):
    city: str
    units: str = "metric"


class FakeStructuredTool(BaseModel):
    """Like langchain_core.tools.StructuredTool, which ``@tool`` returns."""

    name: str
    description: str
    args_schema: type[BaseModel] | None = None
    func: Any = None
    coroutine: Any = None

    def invoke(self, tool_input: dict) -> Any:
        return self.func(**tool_input)


class FakeBaseTool:
    """Like a langchain_core.tools.BaseTool subclass: ``_run`` with an injected ``run_manager``."""

    name = "lookup_city"
    description = "Population of a city.\nMore."

    def _run(self, city: str, run_manager: Any = None) -> int:
        assert run_manager is None
        return len(city)

    def invoke(self, tool_input: Any) -> Any:
        raise AssertionError("not used when _run exists")


class FakeInvokeOnly:
    name = "geocode"
    description = "Coordinates of a place."
    args_schema = WeatherArgs

    def invoke(self, tool_input: dict) -> Any:
        return tool_input


def weather(city: str, units: str = "metric") -> dict:
    return {"city": city, "units": units}


def test_langchain_structured_tool() -> None:
    lc_tool = FakeStructuredTool(
        name="get_weather", description="Current weather.", args_schema=WeatherArgs, func=weather
    )
    tool = Tool.from_object(lc_tool)
    assert tool.name == "get_weather"
    assert tool.signature == "get_weather(city: str, units: str = 'metric') -> dict"
    assert tool.description == "Current weather."
    assert ToolRegistry([tool]).call("get_weather", ["Lima"], {}) == {"city": "Lima", "units": "metric"}
    with pytest.raises(TypeError, match=r"^get_weather\(\) missing 1 required positional argument: 'city'$"):
        tool.bind([], {})


def test_langchain_side_effects_mark_goes_on_the_function() -> None:
    lc_tool = side_effects(FakeStructuredTool(name="notify", description="Notify.", func=weather))
    assert Tool.from_object(lc_tool).side_effects is True


def test_langchain_base_tool_subclass() -> None:
    tool = Tool.from_object(FakeBaseTool())
    assert tool.signature == "lookup_city(city: str) -> int"
    assert tool.description == "Population of a city."
    assert ToolRegistry([tool]).call("lookup_city", ["Oslo"], {}) == 4


def test_langchain_invoke_only_tool_takes_its_schema_as_keywords() -> None:
    tool = Tool.from_object(FakeInvokeOnly())
    assert tool.signature == "geocode(*, city: str, units: str = 'metric')"
    assert ToolRegistry([tool]).call("geocode", [], {"city": "Rome"}) == {
        "city": "Rome"
    }  # schema fills defaults


def test_langchain_async_only_and_bad_names_are_refused() -> None:
    async def fetch() -> None:
        """Async."""

    with pytest.raises(ToolLoadError, match="async-only"):
        Tool.from_object(FakeStructuredTool(name="fetch", description="Fetch.", coroutine=fetch))
    with pytest.raises(ToolLoadError, match="tool name 'get-weather' is not a Python identifier"):
        Tool.from_object(FakeStructuredTool(name="get-weather", description="Weather.", func=weather))
