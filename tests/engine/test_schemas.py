"""Tools as function schemas: built from the signatures the code-action prompt shows. Pure."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Literal, Optional

import pytest
from pydantic import BaseModel

from sandfleet.core.errors import InvalidSpecError
from sandfleet.worker.engine.schemas import (
    annotation_schema,
    function_tool,
    function_tools,
    parameters_schema,
)
from sandfleet.worker.tools.registry import Tool, ToolRegistry

EXAMPLES = ["sandfleet.worker.tools.examples.orders", "sandfleet.worker.tools.examples.side"]


def test_the_example_tools_as_the_model_sees_them() -> None:
    registry = ToolRegistry.from_modules(EXAMPLES)
    schemas = {s["function"]["name"]: s for s in function_tools(registry)}
    assert list(schemas) == registry.names()
    load = schemas["load_orders"]
    assert load["type"] == "function"
    assert load["function"]["parameters"] == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    # The description is exactly what the code-action prompt shows: signature, then the first line.
    assert load["function"]["description"] == registry.get("load_orders").describe()
    assert load["function"]["description"].startswith("load_orders() -> list[dict]\n    All orders:")
    order = schemas["get_order"]["function"]["parameters"]
    assert order["properties"] == {"order_id": {"type": "string"}} and order["required"] == ["order_id"]
    mail = schemas["send_email"]["function"]["parameters"]
    assert mail["required"] == ["to", "subject"]
    assert mail["properties"]["body"] == {"type": "string", "default": ""}


class Colour(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    x: int
    y: int


@pytest.mark.parametrize(
    ("annotation", "schema"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (type(None), {"type": "null"}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (list, {"type": "array"}),
        (tuple[str, ...], {"type": "array", "items": {"type": "string"}}),
        (tuple[str, int], {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]}),
        (set[str], {"type": "array", "items": {"type": "string"}}),
        (dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
        (dict, {"type": "object"}),
        (str | None, {"anyOf": [{"type": "string"}, {"type": "null"}]}),
        (Optional[int], {"anyOf": [{"type": "integer"}, {"type": "null"}]}),  # noqa: UP045 - the old spelling
        (Literal["a", "b"], {"enum": ["a", "b"]}),
        (Colour, {"enum": ["red", "blue"]}),
        (Any, {}),
        ("NoSuchType", {}),
    ],
)
def test_annotations(annotation: Any, schema: dict[str, Any]) -> None:
    assert annotation_schema(annotation) == schema


def test_a_pydantic_model_brings_its_own_schema() -> None:
    schema = annotation_schema(Point)
    assert schema["properties"] == {
        "x": {"title": "X", "type": "integer"},
        "y": {"title": "Y", "type": "integer"},
    }


def test_string_annotations_are_evaluated_and_unknown_ones_allow_anything() -> None:
    def tool(a: "list[int]", b: "Missing", *args: int, c: "int | None" = None, **kwargs: str) -> "dict":  # type: ignore[name-defined]  # noqa: F821, UP037
        """A tool."""

    schema = parameters_schema(tool)
    assert schema["properties"] == {
        "a": {"type": "array", "items": {"type": "integer"}},
        "b": {},
        "c": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
    }
    assert schema["required"] == ["a", "b"]
    assert schema["additionalProperties"] is True  # **kwargs; *args cannot be named and is left out


def test_defaults_that_are_not_json_are_not_shown() -> None:
    marker = object()

    def tool(a: int = 3, b: object = marker) -> None:
        """A tool."""

    assert parameters_schema(tool)["properties"] == {"a": {"type": "integer", "default": 3}, "b": {}}


def test_a_tool_with_its_own_schema_keeps_it() -> None:
    """Tools of MCP servers carry their inputSchema; it is offered unchanged."""

    @dataclasses.dataclass(frozen=True)
    class SchemaTool(Tool):
        input_schema: dict[str, Any] = dataclasses.field(default_factory=dict)

    def remote(**kwargs: Any) -> Any:
        """Ask a remote server."""

    base = Tool.from_object(remote)
    own = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tool = SchemaTool(**{f.name: getattr(base, f.name) for f in dataclasses.fields(Tool)}, input_schema=own)
    assert function_tool(tool)["function"]["parameters"] == own


def test_a_name_function_calling_cannot_carry_is_refused() -> None:
    def tool() -> None:
        """A tool."""

    long = Tool.from_object(tool, name="t" * 65)
    with pytest.raises(InvalidSpecError, match="at most 64"):
        function_tool(long)
