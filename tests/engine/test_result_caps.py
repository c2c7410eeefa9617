"""Where a program's RESULT, a model's answer and a model's arguments are parsed: the nesting cap. Pure."""

from __future__ import annotations

import json

import pytest

from sandfleet.core.errors import JsonLimitError
from sandfleet.core.json_limits import MAX_JSON_DEPTH
from sandfleet.worker.engine.functions import parse_arguments
from sandfleet.worker.engine.toolloop import parse_answer
from sandfleet.worker.program.runtime import parse_result_line


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_a_result_at_the_cap_is_kept_and_one_past_it_refused_naming_the_cap() -> None:
    assert parse_result_line("RESULT: " + nested(MAX_JSON_DEPTH))[1] == json.loads(nested(MAX_JSON_DEPTH))
    for depth in (MAX_JSON_DEPTH + 1, 1000, 100_000):
        with pytest.raises(JsonLimitError, match="the RESULT is nested more than 64 deep"):
            parse_result_line(("RESULT: " + nested(depth)).encode())


def test_text_and_scalars_are_unaffected_by_the_cap() -> None:
    assert parse_result_line("RESULT: brackets in prose " + "[" * 100) == (
        True,
        "brackets in prose " + "[" * 100,
    )
    assert parse_result_line('RESULT: "[[["') == (True, "[[[")
    assert parse_result_line("RESULT: 42") == (True, 42)
    assert parse_result_line("no result") == (False, None)


def test_a_models_answer_and_arguments_past_the_cap_are_refused() -> None:
    with pytest.raises(JsonLimitError):
        parse_answer("Done.\nRESULT: " + nested(MAX_JSON_DEPTH + 1))
    assert parse_answer("RESULT: " + nested(3)) == [[[]]]
    refused = parse_arguments('{"x": ' + nested(MAX_JSON_DEPTH + 1) + "}")
    assert (
        refused
        == "an argument is nested more than 64 deep (the JSON nesting cap, MAX_JSON_DEPTH); send flatter arguments"
    )
    assert parse_arguments('{"x": ' + nested(MAX_JSON_DEPTH) + "}") == {
        "x": json.loads(nested(MAX_JSON_DEPTH))
    }
