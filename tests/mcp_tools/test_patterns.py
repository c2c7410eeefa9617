"""Schema checks in linear time (sandfleet/worker/mcp/patterns.py): RE2 patterns, one-pass uniqueness. Pure.

The servers' side (a catastrophic pattern in a real server's schema, checked while another thread
keeps its pace) is in tests/security/test_input_caps.py.
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import jsonschema
import pytest
from jsonschema._utils import uniq as jsonschema_uniq

from sandfleet.core.json_limits import MAX_JSON_DEPTH
from sandfleet.worker.mcp import patterns
from sandfleet.worker.mcp.schema import SchemaError, ToolSignature

CATASTROPHIC = "^(a+)+$"


def test_after_install_jsonschema_matches_patterns_with_re2_in_linear_time() -> None:
    patterns.install()
    validator = jsonschema.Draft202012Validator({"type": "string", "pattern": CATASTROPHIC})
    began = time.perf_counter()
    for n in (26, 30, 40, 100_000):  # Python's re: 1.9 s at 26, doubling per character
        assert not validator.is_valid("a" * n + "b")
    assert time.perf_counter() - began < 10  # Python's re: 30 s at 30, days at 40
    assert validator.is_valid("a" * 100)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "patternProperties": {CATASTROPHIC: {"type": "integer"}}},
        {"type": "object", "patternProperties": {CATASTROPHIC: {}}, "additionalProperties": False},
        {"type": "object", "patternProperties": {CATASTROPHIC: {}}, "unevaluatedProperties": False},
        {"type": "object", "propertyNames": {"pattern": CATASTROPHIC}},
    ],
)
def test_every_keyword_that_matches_a_pattern_goes_through_re2(schema: dict[str, Any]) -> None:
    patterns.install()
    validator = jsonschema.validators.validator_for(schema)(schema)
    began = time.perf_counter()
    validator.is_valid({"a" * 40 + "b": 1, "aaaa": 2})
    assert time.perf_counter() - began < 10  # Python's re: days at 40 characters


def test_re2_follows_json_schemas_regex_dialect_where_pythons_re_does_not() -> None:
    patterns.install()
    digits = jsonschema.Draft202012Validator({"type": "string", "pattern": r"^\d+$"})
    assert digits.is_valid("12")
    assert not digits.is_valid("12\n")  # ECMA-262 (and RE2): $ is the end of the text
    assert not digits.is_valid("١٢")  # ECMA-262 (and RE2): \d is ASCII


def test_a_pattern_re2_cannot_compile_makes_the_tool_unusable_with_a_clear_reason() -> None:
    schema = {"type": "object", "properties": {"text": {"type": "string", "pattern": "^(?=a)a+$"}}}
    with pytest.raises(SchemaError) as caught:
        ToolSignature.from_schemas(schema)
    assert str(caught.value).startswith("its inputSchema has a pattern '^(?=a)a+$' cannot be checked safely")
    assert "RE2 refuses it" in str(caught.value)
    nested_key = {"type": "object", "properties": {"a": {"patternProperties": {"(a)\\1": {}}}}}
    with pytest.raises(SchemaError, match="RE2 refuses it"):
        ToolSignature.from_schemas(nested_key)
    output = {"type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}}
    with pytest.raises(SchemaError, match="its outputSchema has a pattern"):  # the SDK would check it
        ToolSignature.from_schemas({"type": "object", "properties": {}}, output)


def test_a_schema_nested_past_the_cap_is_refused_before_jsonschema_reads_it() -> None:
    inner: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_JSON_DEPTH):
        inner = {"type": "array", "items": inner}
    with pytest.raises(SchemaError, match="its inputSchema is nested more than 64 deep"):
        ToolSignature.from_schemas({"type": "object", "properties": {"deep": inner}})


def random_item(rng: random.Random, depth: int = 3) -> Any:
    kind = rng.randrange(8 if depth else 5)
    return [
        lambda: rng.choice([0, 1, 2]),
        lambda: rng.choice([0.0, 1.0, 2.5]),
        lambda: rng.choice([True, False]),
        lambda: rng.choice(["", "a", "1"]),
        lambda: None,
        lambda: [random_item(rng, depth - 1) for _ in range(rng.randrange(3))],
        lambda: {rng.choice("ab"): random_item(rng, depth - 1) for _ in range(rng.randrange(3))},
        lambda: rng.choice([[1, True], [True, 1], {"a": 1}, {"a": 1.0}]),
    ][kind]()


def test_one_pass_uniqueness_agrees_with_jsonschemas_own() -> None:
    rng = random.Random(22)
    for _ in range(3000):
        items = [random_item(rng) for _ in range(rng.randrange(6))]
        assert patterns.unique(items) == jsonschema_uniq(items), json.dumps(items)


def test_unique_items_of_objects_is_checked_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counted, not timed (a loaded host made 20,000 items take 2.02 s): jsonschema's own check compares
    pairs (1 s for 1,000 objects, 15 s for 4,000); ours computes a few keys per item."""
    patterns.install()
    keys = 0
    key = patterns._key

    def counted(value: object) -> object:
        nonlocal keys
        keys += 1
        return key(value)

    monkeypatch.setattr(patterns, "_key", counted)
    validator = jsonschema.Draft202012Validator({"type": "array", "uniqueItems": True})
    items = [{"id": i} for i in range(20_000)]
    assert validator.is_valid(items)
    assert 0 < keys <= 3 * len(items), keys  # pairwise would be 2e8 comparisons
    assert not validator.is_valid([*items, {"id": 7}])


def test_install_is_idempotent_and_safe_from_many_threads() -> None:
    threads = [threading.Thread(target=patterns.install) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    import jsonschema._keywords as keywords

    assert keywords.re is patterns.SAFE_RE and keywords.uniq is patterns.unique
