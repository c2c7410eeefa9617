"""An MCP tool's JSON Schema as a Python signature, and the host-side check of a call against it.

What the model sees for a tool whose ``inputSchema`` has a required string ``timezone``, an enum
``unit`` with a default and an optional integer ``max_count``::

    clock__now(timezone: str, *, unit: Literal['s', 'ms'] = 's', max_count: int = None) -> dict

Required properties come first, positional or keyword, in schema order; optional ones are
keyword-only, showing the schema's default (or ``None``: not sent, the server decides). Types map as
``string`` str, ``integer`` int, ``number`` float, ``boolean`` bool, ``null`` None, ``array``
``list[item]``, ``object`` dict; ``enum``/``const`` become ``Literal[...]``, ``anyOf``/``oneOf`` and type
lists a union, local ``$ref`` s are followed. A property whose name is not a Python identifier gets one
(``user-id`` -> ``user_id``, ``class`` -> ``class_``) and is sent under its own name.

A call is bound like a Python call (Python's own ``TypeError`` for a missing or unexpected argument),
then the arguments are validated against the whole schema with ``jsonschema`` on the host, nested
objects included: a wrong type raises ``TypeError``, any other violation ``ValueError``, naming the
argument and where inside it (``address['zip']``). Patterns are matched by RE2 and ``uniqueItems`` is
checked in one pass (patterns.py: a server's schema cannot make a check take seconds); a schema nested
past ``MAX_JSON_DEPTH``, with a pattern RE2 cannot compile, or whose ``$ref`` s and combinators could
visit one value more than ``MAX_VISITS_PER_VALUE`` times (schema_cost.py) makes the tool unusable, and
a call whose values times that bound exceed ``MAX_CHECK_VISITS`` is refused before it is checked.
Pure, apart from jsonschema.
"""

from __future__ import annotations

import functools
import inspect
import json
import keyword
import re
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema.exceptions import best_match

from sandfleet.core import json_limits
from sandfleet.core.errors import JsonLimitError
from sandfleet.worker.mcp import patterns
from sandfleet.worker.mcp.patterns import PatternError
from sandfleet.worker.mcp.schema_cost import SchemaCostError, check_call_budget, visits_per_value

MAX_TYPE_DEPTH = 6  # deeper nesting (or a recursive $ref) is shown as Any
_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")


class _Omitted:
    """The default of an optional parameter: the argument is not sent, so the server's default holds."""

    def __repr__(self) -> str:
        return "None"


OMITTED: Any = _Omitted()


class SchemaError(ValueError):
    """A tool's input schema is not a usable JSON Schema object (the tool is then not offered)."""


@dataclass(frozen=True)
class Parameter:
    name: str  # the Python identifier the program uses
    wire: str  # the property name the server expects
    annotation: str
    required: bool
    default: Any  # a JSON value from the schema, or OMITTED
    nullable: bool  # the schema accepts null for it


@dataclass(frozen=True)
class ToolSignature:
    """The Python face of one MCP tool's schemas."""

    parameters: tuple[Parameter, ...]
    returns: str | None
    unwraps_result: bool
    input_schema: dict[str, Any]
    visits_per_value: int = 1  # the most times the input schema visits one value (schema_cost.py)

    @classmethod
    def from_schemas(cls, input_schema: Any, output_schema: Any | None = None) -> ToolSignature:
        """Read a tool's ``inputSchema`` (and ``outputSchema``, for the return type).

        Raises:
            SchemaError: the input schema is not an object schema or not valid JSON Schema.
        """
        if not isinstance(input_schema, dict) or input_schema.get("type", "object") != "object":
            raise SchemaError("its inputSchema is not a JSON Schema of type object")
        visits: dict[str, int] = {}
        for name, schema in (("inputSchema", input_schema), ("outputSchema", output_schema)):
            try:  # before jsonschema, whose checks recurse; the SDK checks output against outputSchema
                json_limits.check_depth(json.dumps(schema), f"its {name}")
                patterns.check_patterns(schema, f"its {name}")
                visits[name] = visits_per_value(schema, f"its {name}") if schema is not None else 1
            except (JsonLimitError, PatternError, SchemaCostError) as e:
                raise SchemaError(str(e)) from None
        try:
            jsonschema.validators.validator_for(input_schema).check_schema(input_schema)
        except jsonschema.SchemaError as e:
            raise SchemaError(f"its inputSchema is not valid JSON Schema: {e.message}") from None
        defs = _definitions(input_schema)
        properties = input_schema.get("properties") or {}
        if not isinstance(properties, dict):
            raise SchemaError("its inputSchema's properties is not an object")
        required = [p for p in input_schema.get("required") or [] if p in properties]
        order = required + [p for p in properties if p not in required]
        used: set[str] = set()
        params = []
        for wire in order:
            prop = properties[wire]
            name = _parameter_name(wire, used)
            used.add(name)
            is_required = wire in required
            default = prop.get("default", OMITTED) if isinstance(prop, dict) and not is_required else OMITTED
            params.append(
                Parameter(name, wire, type_text(prop, defs), is_required, default, _accepts_null(prop, defs))
            )
        unwraps = _wraps_result(output_schema)
        returns = None
        if isinstance(output_schema, dict):
            shown = output_schema["properties"]["result"] if unwraps else output_schema
            returns = type_text(shown, _definitions(output_schema))
        return cls(tuple(params), returns, unwraps, input_schema, visits["inputSchema"])

    def render(self, name: str) -> str:
        """``name(required: type, *, optional: type = default) -> type``."""
        parts = [f"{p.name}: {p.annotation}" for p in self.parameters if p.required]
        optional = [f"{p.name}: {p.annotation} = {p.default!r}" for p in self.parameters if not p.required]
        if optional:
            parts += ["*", *optional]
        returns = f" -> {self.returns}" if self.returns else ""
        return f"{name}({', '.join(parts)}){returns}"

    def python_signature(self) -> inspect.Signature:
        """What a call is bound against (unannotated; optional parameters default to OMITTED)."""
        kinds = inspect.Parameter
        return inspect.Signature(
            [
                kinds(p.name, kinds.POSITIONAL_OR_KEYWORD)
                if p.required
                else kinds(p.name, kinds.KEYWORD_ONLY, default=OMITTED)
                for p in self.parameters
            ]
        )

    def python_keywords(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Keywords by Python name: a server's property name that is not itself a parameter of the
        signature stands for the parameter made of it (``from`` -> ``from_``); anything else is left
        for binding to refuse."""
        python = {p.name for p in self.parameters}
        renamed = {p.wire: p.name for p in self.parameters if p.wire != p.name}
        if not renamed or all(key in python for key in kwargs):
            return kwargs
        out: dict[str, Any] = {}
        for key, value in kwargs.items():
            name = key if key in python or key not in renamed else renamed[key]
            if name in out:
                raise TypeError(f"got multiple values for argument {name!r} (as {key!r} too)")
            out[name] = value
        return out

    def arguments(self, bound: inspect.BoundArguments) -> dict[str, Any]:
        """The call's arguments by the server's property names; ``None`` for an optional parameter
        that does not accept null means "not given", as the signature shows it."""
        by_name = {p.name: p for p in self.parameters}
        sent = {}
        for name, value in bound.arguments.items():
            param = by_name[name]
            if value is OMITTED or (value is None and not param.required and not param.nullable):
                continue
            sent[param.wire] = value
        return sent

    def validate(self, tool: str, arguments: dict[str, Any]) -> None:
        """Check ``arguments`` (server names) against the input schema.

        Raises:
            TypeError: a value of the wrong type, e.g. ``clock__now(): argument timezone: 5 is not of
                type 'string'``.
            ValueError: any other violation (enum, pattern, range, a nested required key ...), or
                more values than the schema may check in one call (``MAX_CHECK_VISITS``).
        """
        check_call_budget(tool, arguments, self.visits_per_value)
        validator = self._validator
        if validator.is_valid(arguments):  # the common case, without collecting errors
            return
        error = best_match(validator.iter_errors(arguments))
        if error is None:
            return
        where = list(error.absolute_path)
        names = {p.wire: p.name for p in self.parameters}
        if where and where[0] in names:
            inside = "".join(f"[{part!r}]" for part in where[1:])
            subject = f"argument {names[where[0]]}{inside}"
        else:
            subject = "arguments"
        kind = TypeError if error.validator == "type" else ValueError
        raise kind(f"{tool}(): {subject}: {error.message}")

    @functools.cached_property
    def _validator(self) -> Any:
        """The schema's validator, made once (building one costs more than most checks)."""
        patterns.install()
        return jsonschema.validators.validator_for(self.input_schema)(self.input_schema)


def type_text(schema: Any, defs: dict[str, Any], depth: int = 0) -> str:
    """The Python annotation shown for a JSON Schema (``Any`` when nothing better is known)."""
    if depth > MAX_TYPE_DEPTH or not isinstance(schema, dict):
        return "Any"
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = _resolve(ref, defs)
        return type_text(target, defs, depth + 1) if target is not None else "Any"
    if "const" in schema:
        return f"Literal[{schema['const']!r}]"
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        values = [v for v in schema["enum"] if v is not None]
        text = f"Literal[{', '.join(repr(v) for v in values)}]" if values else "None"
        return _union([text, "None"]) if None in schema["enum"] and values else text
    for combinator in ("anyOf", "oneOf"):
        if isinstance(schema.get(combinator), list) and schema[combinator]:
            return _union([type_text(option, defs, depth + 1) for option in schema[combinator]])
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) == 1:
        return type_text(schema["allOf"][0], defs, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union([type_text({**schema, "type": k}, defs, depth) for k in kind])
    if kind in _TYPES:
        return _TYPES[kind]
    if kind == "array" or (kind is None and "items" in schema):
        items = schema.get("items")
        return f"list[{type_text(items, defs, depth + 1)}]" if isinstance(items, dict) and items else "list"
    if kind == "object" or (kind is None and "properties" in schema):
        extra = schema.get("additionalProperties")
        if not schema.get("properties") and isinstance(extra, dict) and extra:
            return f"dict[str, {type_text(extra, defs, depth + 1)}]"
        return "dict"
    return "Any"


def _union(texts: list[str]) -> str:
    unique = list(dict.fromkeys(texts))
    if "Any" in unique:
        return "Any"
    if "None" in unique:  # None last, as people write it
        unique = [t for t in unique if t != "None"] + ["None"]
    return " | ".join(unique)


def _definitions(schema: dict[str, Any]) -> dict[str, Any]:
    defs: dict[str, Any] = {}
    for key in ("definitions", "$defs"):
        if isinstance(schema.get(key), dict):
            defs.update({f"#/{key}/{name}": value for name, value in schema[key].items()})
    return defs


def _resolve(ref: str, defs: dict[str, Any]) -> Any:
    return defs.get(ref)


def _accepts_null(schema: Any, defs: dict[str, Any], depth: int = 0) -> bool:
    if not isinstance(schema, dict) or depth > MAX_TYPE_DEPTH:
        return schema is True or schema == {}
    if not schema:
        return True
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return _accepts_null(_resolve(ref, defs), defs, depth + 1)
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    if isinstance(schema.get("enum"), list):
        return None in schema["enum"]
    options = (schema.get("anyOf") or []) + (schema.get("oneOf") or [])
    return any(_accepts_null(option, defs, depth + 1) for option in options)


def _wraps_result(output_schema: Any) -> bool:
    """Whether structured output is a non-object wrapped as ``{"result": value}``, the form SDKs use
    because protocol versions before 2026 allow only objects there."""
    if not isinstance(output_schema, dict) or output_schema.get("type") != "object":
        return False
    properties = output_schema.get("properties")
    return (
        isinstance(properties, dict)
        and list(properties) == ["result"]
        and output_schema.get("required") == ["result"]
    )


def _parameter_name(wire: str, used: set[str]) -> str:
    name = _NOT_IDENTIFIER.sub("_", wire) or "arg"
    if name[0].isdigit():
        name = f"p_{name}"
    if keyword.iskeyword(name):  # soft keywords (match, type) are fine as parameter names
        name += "_"
    candidate, n = name, 1
    while candidate in used:
        n += 1
        candidate = f"{name}_{n}"
    return candidate
