"""The JSON nesting cap and the record caps (sandfleet/core/json_limits.py): pure, no Redis.

The depth is read from the text without parsing it; these tests hold it to a recursive reference
on random JSON, on escapes and brackets inside strings, and show why a cap is needed at all: the
parsers the fleet uses fail (differently) on deep JSON.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from pydantic import BaseModel

from sandfleet.core.errors import JsonLimitError
from sandfleet.core.json_limits import (
    MAX_JSON_DEPTH,
    MAX_RECORD_DEPTH,
    check_depth,
    check_record,
    loads,
    text_depth,
)


def reference_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((reference_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((reference_depth(v) for v in value), default=0)
    return 0


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


TRICKY_STRINGS = ['"', "\\", '\\"', "[[[", "]]}}", '\\\\"[', "\n\t", "é[ü]", "\\u005b", '"]', "\udcff"]


def random_value(rng: random.Random, depth: int) -> Any:
    kind = rng.random()
    if depth <= 0 or kind < 0.3:
        return rng.choice([None, True, 3, -1.5, rng.choice(TRICKY_STRINGS), "plain"])
    if kind < 0.65:
        return [random_value(rng, depth - 1) for _ in range(rng.randrange(0, 4))]
    return {
        rng.choice(TRICKY_STRINGS) + str(i): random_value(rng, depth - 1) for i in range(rng.randrange(0, 4))
    }


def test_the_depth_read_from_the_text_is_the_depth_of_the_value() -> None:
    rng = random.Random(22)
    for _ in range(2000):
        value = random_value(rng, rng.randrange(0, 12))
        for text in (json.dumps(value), json.dumps(value, ensure_ascii=False), json.dumps(value, indent=1)):
            assert text_depth(text) == reference_depth(value), text
            assert text_depth(text.encode("utf-8", "surrogatepass")) == reference_depth(value), text


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ('"[[[["', 0),
        ('["\\\\"]', 1),  # an escaped backslash, then the string ends
        ('["\\"]", []]', 2),  # an escaped quote does not end the string
        ('{"a": {"b": "}}}"}}', 2),
        ("42", 0),
        ("[]", 1),
        ("", 0),
    ],
)
def test_brackets_inside_strings_do_not_count(text: str, depth: int) -> None:
    assert text_depth(text) == depth


def test_the_cap_refuses_one_level_past_it_naming_the_cap() -> None:
    check_depth(nested(MAX_JSON_DEPTH), "the RESULT")
    with pytest.raises(JsonLimitError) as caught:
        check_depth(nested(MAX_JSON_DEPTH + 1), "the RESULT")
    assert str(caught.value) == (
        f"the RESULT is nested more than {MAX_JSON_DEPTH} deep (the JSON nesting cap, MAX_JSON_DEPTH)"
    )
    assert caught.value.limit == "depth"
    # an envelope around the values: a request object and its argument list
    check_depth("[" + nested(MAX_JSON_DEPTH + 1) + "]", "arguments", envelope=2)
    with pytest.raises(JsonLimitError):
        check_depth("[" + nested(MAX_JSON_DEPTH + 2) + "]", "arguments", envelope=2)


@pytest.mark.parametrize("depth", [1000, 10_000, 100_000])
def test_deep_text_is_refused_before_the_recursive_parser_sees_it(depth: int) -> None:
    text = nested(depth)
    with pytest.raises(RecursionError):  # why the check comes first: json's C decoder gives up
        json.loads(text)
    with pytest.raises(JsonLimitError):
        loads(text, "the RESULT")
    assert text_depth(text) == depth


def test_a_value_deeper_than_200_breaks_pydantic_readers_and_the_record_check_stops_far_before() -> None:
    class Record(BaseModel):
        result: Any = None

    Record.model_validate_json('{"result": ' + nested(200) + "}")
    with pytest.raises(ValueError, match="recursion limit exceeded"):
        Record.model_validate_json('{"result": ' + nested(201) + "}")
    assert MAX_JSON_DEPTH + 10 < MAX_RECORD_DEPTH < 200
    check_record('{"result": ' + nested(MAX_RECORD_DEPTH - 1) + "}", "the final record")
    with pytest.raises(JsonLimitError) as caught:
        check_record('{"result": ' + nested(MAX_RECORD_DEPTH) + "}", "the final record")
    assert caught.value.limit == "record_depth" and "MAX_RECORD_DEPTH" in str(caught.value)


def test_loads_keeps_jsons_own_errors_for_text_that_is_not_json() -> None:
    with pytest.raises(json.JSONDecodeError):
        loads("[1, 2", "the RESULT")
    assert loads('{"a": [1, {"b": null}]}', "the RESULT") == {"a": [1, {"b": None}]}
