"""The bound on how often a tool's schema can visit one value (sandfleet/worker/mcp/schema_cost.py). Pure.

A server's real schemas through the worker are in tests/security/test_mcp_schema_cost.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandfleet.worker.mcp.schema import SchemaError, ToolSignature
from sandfleet.worker.mcp.schema_cost import (
    MAX_CHECK_VISITS,
    MAX_VISITS_PER_VALUE,
    SchemaCostError,
    check_call_budget,
    count_values,
    visits_per_value,
)


def chain(links: int, combinator: str = "oneOf", branches: int = 2) -> dict[str, Any]:
    """``text`` checked through ``links`` definitions, each a combinator of refs to the next."""
    defs: dict[str, Any] = {
        f"d{i}": {combinator: [{"$ref": f"#/$defs/d{i + 1}"}] * branches} for i in range(links)
    }
    defs[f"d{links}"] = {"type": "string"}
    return {"type": "object", "properties": {"text": {"$ref": "#/$defs/d0"}}, "$defs": defs}


@pytest.mark.parametrize("combinator", ["oneOf", "anyOf", "allOf"])
def test_refs_that_multiply_are_counted_and_past_the_bound_refused_naming_it(combinator: str) -> None:
    small = visits_per_value(chain(3, combinator))
    assert small < visits_per_value(chain(4, combinator)) <= 2 * small + 2  # doubles with each link
    with pytest.raises(SchemaCostError, match=f"visits one value more than {MAX_VISITS_PER_VALUE} times"):
        visits_per_value(chain(30, combinator))  # 2**30: the schema's text is 2 KB


def test_a_schema_the_bound_refuses_makes_the_tool_unusable_before_jsonschema_sees_it() -> None:
    with pytest.raises(SchemaError, match="its inputSchema visits one value more than"):
        ToolSignature.from_schemas(chain(30))
    output = chain(30)
    with pytest.raises(SchemaError, match="its outputSchema visits one value more than"):  # the SDK checks it
        ToolSignature.from_schemas({"type": "object", "properties": {}}, output)


def test_what_cannot_be_bounded_is_refused_saying_why() -> None:
    endless = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/x"}},
        "$defs": {"x": {"anyOf": [{"$ref": "#/$defs/x"}]}},
    }
    cases = {
        "never enters the value": endless,
        "is not a local JSON pointer": {
            "type": "object",
            "properties": {"a": {"$ref": "https://x.invalid/s.json"}},
        },
        "leads nowhere": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
        "uses $dynamicRef": {"type": "object", "properties": {"a": {"$dynamicRef": "#node"}}},
        "its own $id": {"type": "object", "properties": {"a": {"$id": "https://x.invalid/a", "$ref": "#"}}},
    }
    for why, schema in cases.items():
        with pytest.raises(SchemaCostError, match=why.replace("$", "\\$")):
            visits_per_value(schema)


def test_a_tree_recursing_into_its_values_is_bounded_and_a_recursive_union_is_not() -> None:
    node = {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}}
    assert visits_per_value(node) == 2  # the $ref and the node: whatever the depth
    union = {
        "anyOf": [
            {"type": "object", "properties": {"left": {"$ref": "#"}}},
            {"type": "object", "properties": {"right": {"$ref": "#"}}},
        ]
    }
    with pytest.raises(SchemaCostError, match="levels in"):  # doubles per level, 64 levels allowed
        visits_per_value(union)


def test_a_realistic_schema_costs_a_few_visits() -> None:
    address = {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}
    schema = {
        "type": "object",
        "properties": {
            "who": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "where": {
                "oneOf": [
                    {"$ref": "#/$defs/Address"},
                    {"type": "array", "items": {"$ref": "#/$defs/Address"}},
                ]
            },
        },
        "$defs": {"Address": address},
    }
    assert visits_per_value(schema) <= 5


def test_a_call_whose_values_times_the_bound_pass_the_cap_is_refused_before_the_check() -> None:
    assert count_values({"a": [1, 2, {"b": None}]}) == 6
    per_value = visits_per_value(chain(7))
    few = MAX_CHECK_VISITS // per_value - 10
    check_call_budget("t", {"text": ["a"] * few}, per_value)
    with pytest.raises(ValueError, match="MAX_CHECK_VISITS") as refused:
        check_call_budget("t", {"text": ["a"] * (few + 20)}, per_value)
    assert str(refused.value).startswith("t(): the arguments hold")
    shape = ToolSignature.from_schemas(chain(7))
    with pytest.raises(ValueError, match="MAX_CHECK_VISITS"):  # validate() checks it before jsonschema
        shape.validate("t", {"text": "a" * 10} | {f"k{i}": i for i in range(2000)})
