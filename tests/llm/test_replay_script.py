"""The replay script loader and the matching rules: pure functions, no server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandfleet.core.errors import InvalidSpecError
from sandfleet.worker.llm.scripted.script import (
    DEFAULT_FAIL_STATUS,
    ScriptedResponse,
    count_assistant_messages,
    load_script,
    match_rule,
    parse_script,
    pick_response,
    rule_response,
)

from .helpers import assistant, system, user


def test_a_full_script_parses() -> None:
    script = parse_script(
        {
            "rules": [
                {
                    "match": "revenue",
                    "responses": [
                        "first",
                        {"text": "second", "latency": 1.5},
                        {"status": 503, "error": "down"},
                    ],
                    "latency": 0.2,
                    "fail_first": 2,
                    "fail_status": 500,
                }
            ],
            "default": ["fallback"],
        },
        source="s.yaml",
    )
    (rule,) = script.rules
    assert rule.pattern.pattern == "revenue"
    assert rule.responses == (
        ScriptedResponse(text="first"),
        ScriptedResponse(text="second", latency_s=1.5),
        ScriptedResponse(status=503, error="down"),
    )
    assert (rule.latency_s, rule.fail_first, rule.fail_status) == (0.2, 2, 500)
    assert script.default == (ScriptedResponse(text="fallback"),)
    assert script.source == "s.yaml"


def test_defaults_of_optional_fields() -> None:
    script = parse_script({"rules": [{"match": "x", "responses": ["a"]}]})
    (rule,) = script.rules
    assert (rule.latency_s, rule.fail_first, rule.fail_status) == (None, 0, DEFAULT_FAIL_STATUS)
    assert script.default is None


def test_a_status_response_without_a_message_gets_one() -> None:
    script = parse_script({"default": [{"status": 429}]})
    assert script.default is not None
    assert script.default[0].status == 429
    assert script.default[0].error


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ({"rules": [{"match": "(", "responses": ["a"]}]}, r"rules\[0\]\.match: bad regular expression"),
        ({"rules": [{"responses": ["a"]}]}, r"rules\[0\]: missing 'match'"),
        ({"rules": [{"match": "a"}]}, r"rules\[0\]: missing 'responses'"),
        ({"rules": [{"match": "a", "respones": ["a"]}]}, r"unknown key 'respones'.*did you mean 'responses'"),
        ({"rules": [], "defaults": ["a"]}, r"unknown key 'defaults'.*did you mean 'default'"),
        ({"rules": [{"match": "a", "responses": "a"}]}, r"must be a list of responses"),
        ({"rules": [{"match": "a", "responses": []}]}, r"non-empty list"),
        ({"rules": [{"match": 3, "responses": ["a"]}]}, r"match: must be a regular expression string"),
        ({"rules": [{"match": "a", "responses": [{"text": "a", "status": 500}]}]}, r"either 'text'"),
        ({"rules": [{"match": "a", "responses": [{"latency": 1}]}]}, r"either 'text'"),
        (
            {"rules": [{"match": "a", "responses": [{"status": 200}]}]},
            r"status: must be an HTTP error status",
        ),
        ({"rules": [{"match": "a", "responses": [{"text": 5}]}]}, r"text: must be a string"),
        ({"rules": [{"match": "a", "responses": [{"text": "a", "error": "e"}]}]}, r"only next to 'status'"),
        ({"rules": [{"match": "a", "responses": [{"text": "a", "colour": 1}]}]}, r"unknown key 'colour'"),
        ({"rules": [{"match": "a", "responses": [7]}]}, r"responses\[0\]: must be a text or a mapping"),
        ({"rules": [{"match": "a", "responses": ["a"], "latency": -1}]}, r"latency: must be a number"),
        ({"rules": [{"match": "a", "responses": ["a"], "latency": "slow"}]}, r"latency: must be a number"),
        ({"rules": [{"match": "a", "responses": ["a"], "fail_first": -1}]}, r"fail_first: must be a whole"),
        ({"rules": [{"match": "a", "responses": ["a"], "fail_first": True}]}, r"fail_first: must be a whole"),
        ({"rules": [{"match": "a", "responses": ["a"], "fail_status": 302}]}, r"fail_status: must be"),
        ({"rules": {"match": "a"}}, r"'rules' must be a list"),
        ({}, r"neither 'rules' nor 'default'"),
        (["a"], r"must be a mapping, got list"),
        (None, r"must be a mapping, got NoneType"),
    ],
)
def test_malformed_scripts_are_refused_with_the_place_named(script: Any, expected: str) -> None:
    with pytest.raises(InvalidSpecError, match=expected):
        parse_script(script, source="bad.yaml")


def test_errors_name_the_source() -> None:
    with pytest.raises(InvalidSpecError, match=r"replay script bad\.yaml: rules\[1\]\.match"):
        parse_script(
            {"rules": [{"match": "a", "responses": ["a"]}, {"match": "[", "responses": ["b"]}]},
            source="bad.yaml",
        )


def test_load_json_and_yaml(tmp_path: Path) -> None:
    json_file = tmp_path / "s.json"
    json_file.write_text('{"rules": [{"match": "hi", "responses": ["hello"]}]}')
    yaml_file = tmp_path / "s.yaml"
    yaml_file.write_text("rules:\n  - match: hi\n    responses:\n      - hello\n")
    assert load_script(json_file).rules[0].responses == load_script(yaml_file).rules[0].responses
    assert load_script(yaml_file).source == str(yaml_file)


def test_load_reports_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidSpecError, match="cannot read replay script"):
        load_script(tmp_path / "absent.yaml")


def test_load_reports_bad_syntax(tmp_path: Path) -> None:
    bad_json = tmp_path / "s.json"
    bad_json.write_text('{"rules": [')
    with pytest.raises(InvalidSpecError, match="not valid JSON"):
        load_script(bad_json)
    bad_yaml = tmp_path / "s.yml"
    bad_yaml.write_text("rules: [unclosed\n")
    with pytest.raises(InvalidSpecError, match="not valid YAML"):
        load_script(bad_yaml)


SCRIPT = parse_script(
    {
        "rules": [
            {"match": "revenue", "responses": ["r0", "r1"]},
            {"match": "(?i)^hello$", "responses": ["h0"]},
        ],
        "default": ["d0"],
    }
)


def test_the_first_matching_rule_wins() -> None:
    assert match_rule(SCRIPT, [user("hello revenue")]) == 0
    assert match_rule(SCRIPT, [user("HELLO")]) == 1


def test_every_user_turn_is_searched_but_no_other_role() -> None:
    history = [system("revenue"), user("earlier: revenue"), assistant("x"), user("and now?")]
    assert match_rule(SCRIPT, history) == 0
    assert match_rule(SCRIPT, [system("revenue"), assistant("revenue"), user("nothing")]) is None


def test_multi_part_content_is_matched_by_its_text_parts() -> None:
    parts = [
        {"type": "text", "text": "what is the revenue"},
        {"type": "image_url", "image_url": {"url": "x"}},
    ]
    assert match_rule(SCRIPT, [{"role": "user", "content": parts}]) == 0


def test_responses_are_picked_by_assistant_count_and_the_last_repeats() -> None:
    responses = SCRIPT.rules[0].responses
    assert count_assistant_messages([user("a"), assistant("b"), user("c"), assistant("d")]) == 2
    assert [pick_response(responses, n).text for n in range(4)] == ["r0", "r1", "r1", "r1"]


def test_fail_first_fails_the_first_hits_then_answers() -> None:
    (rule,) = parse_script({"rules": [{"match": "a", "responses": ["ok"], "fail_first": 2}]}).rules
    answers = [rule_response(rule, hit, assistant_count=0) for hit in range(4)]
    assert [a.status for a in answers] == [429, 429, None, None]
    assert [a.text for a in answers[2:]] == ["ok", "ok"]
