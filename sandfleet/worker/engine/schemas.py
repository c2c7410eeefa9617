"""Tools as OpenAI function schemas, built from the signatures the code-action prompt shows: pure.

A shell or chat job's model sees each tool as a function: its name, the same text the code-action
prompt shows (``Tool.describe()``: the Python signature, then the first docstring line) as the
description, and a JSON schema of its parameters made from the annotations:

    str -> string, int -> integer, float -> number, bool -> boolean, None -> null,
    list[X] / tuple[X, ...] / set[X] -> array of X, dict[str, X] -> object of X,
    X | Y and Optional[X] -> anyOf, Literal[...] and Enum -> enum, a pydantic model -> its own schema,
    no annotation or Any -> any value.

Parameters without a default are required; JSON-able defaults are shown. ``**kwargs`` allows other
names; ``*args`` cannot be passed by name and is left out. A tool that carries its own schema (an
``input_schema`` attribute, as a tool of an MCP server does) is offered with that schema unchanged.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sandfleet.core.errors import InvalidSpecError
from sandfleet.worker.tools.registry import Tool, ToolRegistry

MAX_FUNCTION_NAME_CHARS = 64  # OpenAI's limit on a function's name
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SCALARS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    dt.datetime: {"type": "string", "format": "date-time"},
    dt.date: {"type": "string", "format": "date"},
    dt.time: {"type": "string", "format": "time"},
}
_ARRAYS = (list, tuple, set, frozenset, Sequence)
_OBJECTS = (dict, Mapping)


def function_tools(registry: ToolRegistry) -> list[dict[str, Any]]:
    """The ``tools`` parameter of a chat request offering every tool of ``registry``, in load order.

    Raises:
        InvalidSpecError: a tool name that function calling cannot carry (over 64 characters).
    """
    return [function_tool(tool) for tool in registry]


def function_tool(tool: Tool) -> dict[str, Any]:
    """One tool as ``{"type": "function", "function": {name, description, parameters}}``."""
    if not _FUNCTION_NAME.match(tool.name):
        raise InvalidSpecError(
            f"tool {tool.name} cannot be offered to a tool-calling model: function names are at most "
            f"{MAX_FUNCTION_NAME_CHARS} letters, digits, '_' or '-'"
        )
    own = getattr(tool, "input_schema", None)
    parameters = dict(own) if isinstance(own, Mapping) else parameters_schema(tool.func)
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.describe(), "parameters": parameters},
    }


def parameters_schema(func: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of a function's parameters (an object with one property per parameter)."""
    signature = inspect.signature(func)
    hints = _type_hints(func)
    properties: dict[str, Any] = {}
    required: list[str] = []
    extra_allowed = False
    for name, param in signature.parameters.items():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra_allowed = True
            continue
        schema = annotation_schema(hints.get(name, param.annotation))
        if param.default is inspect.Parameter.empty:
            required.append(name)
        elif _is_json(param.default):
            schema = {**schema, "default": param.default}
        properties[name] = schema
    result: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        result["required"] = required
    result["additionalProperties"] = extra_allowed
    return result


def annotation_schema(annotation: Any) -> dict[str, Any]:
    """The JSON schema of one annotation (``{}``, any value, for what has no JSON counterpart)."""
    if annotation is inspect.Parameter.empty or annotation is Any or isinstance(annotation, str):
        return {}
    if annotation in _SCALARS:
        return dict(_SCALARS[annotation])
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": [member.value for member in annotation if _is_json(member.value)]}
    if _is_pydantic_model(annotation):
        return dict(annotation.model_json_schema())
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return {"type": "object"}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return {"enum": [value for value in args if _is_json(value)]}
    if origin is typing.Union or origin is types.UnionType:
        return {"anyOf": [annotation_schema(arg) for arg in args]}
    if origin is typing.Annotated:
        return annotation_schema(args[0])
    container = origin or annotation
    if container in _ARRAYS or (isinstance(container, type) and issubclass(container, _ARRAYS)):
        items = [a for a in args if a is not Ellipsis]
        if origin is tuple and len(items) > 1:  # a fixed-length tuple
            return {"type": "array", "prefixItems": [annotation_schema(a) for a in items]}
        return {"type": "array", **({"items": annotation_schema(items[0])} if items else {})}
    if container in _OBJECTS or (isinstance(container, type) and issubclass(container, _OBJECTS)):
        if len(args) == 2:
            return {"type": "object", "additionalProperties": annotation_schema(args[1])}
        return {"type": "object"}
    return {}


def _type_hints(func: Callable[..., Any]) -> dict[str, Any]:
    """Annotations evaluated (``from __future__ import annotations`` makes them strings), each on its own:
    one that names something unknown stays a string, and so any value."""
    target = inspect.unwrap(func)
    try:
        return typing.get_type_hints(target)
    except Exception:  # one unresolvable name: evaluate the others one by one
        pass
    namespace = {**vars(typing), **getattr(target, "__globals__", {})}
    hints = {}
    for name, param in inspect.signature(func).parameters.items():
        annotation = param.annotation
        for _ in range(2):  # a quoted annotation under PEP 563 is a string of a string
            if not isinstance(annotation, str):
                break
            try:
                annotation = eval(annotation, namespace)  # trusted: the tool module's own annotations
            except Exception:
                break
        hints[name] = annotation
    return hints


def _is_pydantic_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and callable(getattr(annotation, "model_json_schema", None))


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
