"""An MCP tool's input schema as the Python signature the model sees, and the host-side argument check."""

from __future__ import annotations

from typing import Any

import pytest

from sandfleet.worker.mcp.schema import SchemaError, ToolSignature

GIT_LOG = {  # as mcp-server-git lists git_log
    "type": "object",
    "properties": {
        "repo_path": {"title": "Repo Path", "type": "string"},
        "max_count": {"default": 10, "title": "Max Count", "type": "integer"},
        "start_timestamp": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
    },
    "required": ["repo_path"],
}
ODD = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "from": {"type": "string"},
        "user-id": {"type": "integer"},
        "2fa": {"type": "boolean"},
        "unit": {"enum": ["C", "F"], "default": "C"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "scores": {"type": "object", "additionalProperties": {"type": "number"}},
        "mode": {"const": "fast"},
    },
    "required": ["city"],
}
NESTED = {
    "type": "object",
    "properties": {"guest": {"$ref": "#/$defs/Guest"}, "nights": {"type": "integer", "minimum": 1}},
    "required": ["guest", "nights"],
    "$defs": {
        "Guest": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "address": {
                    "type": "object",
                    "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["zip"],
                },
            },
            "required": ["name", "address"],
        }
    },
}


def call(shape: ToolSignature, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return shape.arguments(shape.python_signature().bind(*args, **kwargs))


def test_required_first_optional_keyword_only_with_their_defaults() -> None:
    shape = ToolSignature.from_schemas(GIT_LOG)
    assert shape.render("git__git_log") == (
        "git__git_log(repo_path: str, *, max_count: int = 10, start_timestamp: str | None = None)"
    )


def test_enums_unions_arrays_maps_and_names_python_lacks() -> None:
    shape = ToolSignature.from_schemas(ODD)
    assert shape.render("odd__weather") == (
        "odd__weather(city: str, *, from_: str = None, user_id: int = None, p_2fa: bool = None, "
        "unit: Literal['C', 'F'] = 'C', tags: list[str] = None, scores: dict[str, float] = None, "
        "mode: Literal['fast'] = None)"
    )
    # The program's names map back to the server's; what it did not pass is not sent.
    assert call(shape, "Oslo", from_="2026-01-01", user_id=7, p_2fa=True) == {
        "city": "Oslo",
        "from": "2026-01-01",
        "user-id": 7,
        "2fa": True,
    }


def test_none_for_an_optional_argument_is_not_sent_unless_the_schema_takes_null() -> None:
    assert call(ToolSignature.from_schemas(ODD), "Oslo", user_id=None) == {"city": "Oslo"}
    nullable = call(ToolSignature.from_schemas(GIT_LOG), "/r", start_timestamp=None)
    assert nullable == {"repo_path": "/r", "start_timestamp": None}


def test_return_types_come_from_the_output_schema_and_wrapped_results_unwrap() -> None:
    wrapped = {
        "type": "object",
        "properties": {"result": {"type": "array", "items": {"type": "object"}}},
        "required": ["result"],
    }
    shape = ToolSignature.from_schemas({"type": "object"}, wrapped)
    assert shape.render("lab__load_orders") == "lab__load_orders() -> list[dict]" and shape.unwraps_result
    plain = ToolSignature.from_schemas(
        {"type": "object"}, {"type": "object", "properties": {"n": {"type": "integer"}}}
    )
    assert plain.returns == "dict" and not plain.unwraps_result


def test_nested_objects_are_checked_all_the_way_down() -> None:
    shape = ToolSignature.from_schemas(NESTED)
    assert shape.render("odd__book") == "odd__book(guest: dict, nights: int)"
    good = {"name": "Ana", "address": {"zip": "12345"}}
    shape.validate("odd__book", call(shape, good, 2))
    cases = [
        (
            ({"name": "Ana", "address": {"zip": "12"}}, 2),
            ValueError,
            "argument guest['address']['zip']: '12' does not match '^[0-9]{5}$'",
        ),
        (
            ({"name": "Ana", "address": {}}, 2),
            ValueError,
            "argument guest['address']: 'zip' is a required property",
        ),
        (
            ({"name": 5, "address": {"zip": "12345"}}, 2),
            TypeError,
            "argument guest['name']: 5 is not of type 'string'",
        ),
        ((good, 0), ValueError, "argument nights: 0 is less than the minimum of 1"),
        ((good, "2"), TypeError, "argument nights: '2' is not of type 'integer'"),
    ]
    for args, kind, message in cases:
        with pytest.raises(kind) as refused:
            shape.validate("odd__book", call(shape, *args))
        assert str(refused.value) == f"odd__book(): {message}"


def test_binding_gives_pythons_own_errors() -> None:
    shape = ToolSignature.from_schemas(GIT_LOG)
    with pytest.raises(TypeError, match="missing a required argument: 'repo_path'"):
        shape.python_signature().bind()
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        shape.python_signature().bind("/r", colour="red")
    with pytest.raises(TypeError, match="too many positional arguments"):
        shape.python_signature().bind("/r", 5)  # optional arguments are keyword-only


@pytest.mark.parametrize(
    "schema, problem",
    [
        ({"type": "string"}, "not a JSON Schema of type object"),
        ([], "not a JSON Schema of type object"),
        ({"type": "object", "properties": {"a": {"type": "strng"}}}, "not valid JSON Schema"),
        ({"type": "object", "required": "a"}, "not valid JSON Schema"),
    ],
)
def test_an_unusable_schema_is_refused(schema: Any, problem: str) -> None:
    with pytest.raises(SchemaError, match=problem):
        ToolSignature.from_schemas(schema)


def test_a_reference_to_itself_is_refused_and_a_tree_that_recurses_into_its_values_is_offered() -> None:
    """``N = {"$ref": N}`` never enters the value: jsonschema would recurse until RecursionError."""
    endless = {
        "type": "object",
        "properties": {"node": {"$ref": "#/$defs/N"}},
        "$defs": {"N": {"$ref": "#/$defs/N"}},
    }
    with pytest.raises(SchemaError, match="has a \\$ref cycle that never enters the value"):
        ToolSignature.from_schemas(endless)
    tree = {
        "type": "object",
        "properties": {"node": {"$ref": "#/$defs/N"}},
        "$defs": {"N": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/N", "type": "array"}]}},
    }
    with pytest.raises(SchemaError, match="cycle"):  # still at the same level (a $ref beside "type")
        ToolSignature.from_schemas(tree)
    tree["$defs"]["N"] = {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/N"}}},
    }
    shape = ToolSignature.from_schemas(tree)
    assert shape.render("t") == "t(*, node: dict = None)"
    assert shape.visits_per_value == 2  # a value is visited by a $ref and by the schema it names


def test_the_servers_own_names_stand_for_the_parameters_made_of_them() -> None:
    shape = ToolSignature.from_schemas(ODD)
    assert shape.python_keywords({"city": "Oslo", "from": "x", "user-id": 3}) == {
        "city": "Oslo",
        "from_": "x",
        "user_id": 3,
    }
    with pytest.raises(TypeError, match="multiple values for argument 'from_'"):
        shape.python_keywords({"from": "x", "from_": "y"})
    assert shape.python_keywords({"colour": "red"}) == {"colour": "red"}  # left for binding to refuse
