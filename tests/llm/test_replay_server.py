"""The replay server over real HTTP, queried with the official openai client, unchanged."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from sandfleet.worker.llm.scripted.server import NO_MATCH_MESSAGE, REPLAY_LATENCY_HEADER, ReplayServer

from .helpers import assistant, system, user

StartServer = Callable[..., ReplayServer]
MakeClient = Callable[[ReplayServer], openai.OpenAI]

PROGRAMS = {
    "rules": [
        {"match": "revenue", "responses": ["first program", "repaired program"]},
        {"match": "orders", "responses": ["about orders"]},
    ],
}


def ask(client: openai.OpenAI, messages: list[dict[str, str]], **kwargs: Any) -> Any:
    return client.chat.completions.create(model="any-model", messages=messages, **kwargs)  # type: ignore[arg-type]


def test_a_non_streamed_reply_parses_with_usage(start_server: StartServer, openai_client: MakeClient) -> None:
    server = start_server(PROGRAMS)
    reply = ask(openai_client(server), [system("be brief"), user("revenue per region")])
    assert reply.choices[0].message.content == "first program"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "any-model"
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 0
    assert reply.usage.completion_tokens == len("first program") // 4 + 1
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_a_streamed_reply_ends_with_usage(start_server: StartServer, openai_client: MakeClient) -> None:
    server = start_server({"default": ["print('RESULT: 42')\nprint('done')"]})
    stream = ask(openai_client(server), [user("go")], stream=True, stream_options={"include_usage": True})
    with stream:
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "print('RESULT: 42')\nprint('done')"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0


def test_a_stream_without_include_usage_has_no_usage(
    start_server: StartServer, openai_client: MakeClient
) -> None:
    server = start_server({"default": ["hello world"]})
    with ask(openai_client(server), [user("go")], stream=True) as stream:
        chunks = list(stream)
    assert all(c.usage is None and c.choices for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "hello world"


def test_models_are_listed(start_server: StartServer, openai_client: MakeClient) -> None:
    server = start_server(PROGRAMS)
    models = openai_client(server).models.list()
    assert [m.id for m in models.data] == ["replay"]


def test_responses_follow_the_number_of_assistant_messages(
    start_server: StartServer, openai_client: MakeClient
) -> None:
    client = openai_client(start_server(PROGRAMS))
    first = [user("revenue per region")]
    second = [*first, assistant("first program"), user("it failed with KeyError")]
    third = [*second, assistant("repaired program"), user("failed again")]
    texts = [ask(client, messages).choices[0].message.content for messages in (first, second, third)]
    assert texts == ["first program", "repaired program", "repaired program"]


def test_a_rule_matches_an_earlier_history_turn(start_server: StartServer, openai_client: MakeClient) -> None:
    client = openai_client(start_server(PROGRAMS))
    messages = [user("tell me about orders"), assistant("sure"), user("and the total?")]
    assert ask(client, messages).choices[0].message.content == "about orders"


def test_the_default_answers_when_no_rule_matches(
    start_server: StartServer, openai_client: MakeClient
) -> None:
    client = openai_client(start_server({**PROGRAMS, "default": ["d0", "d1"]}))
    assert ask(client, [user("weather?")]).choices[0].message.content == "d0"
    assert ask(client, [user("weather?"), assistant("d0"), user("sure?")]).choices[0].message.content == "d1"


def test_no_match_and_no_default_is_a_400_with_a_clear_message(
    start_server: StartServer, openai_client: MakeClient
) -> None:
    client = openai_client(start_server(PROGRAMS))
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, [user("weather?")])
    assert caught.value.status_code == 400
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["message"] == NO_MATCH_MESSAGE
    assert caught.value.body["type"] == "invalid_request_error"


def test_simulated_errors_answer_with_their_status(
    start_server: StartServer, openai_client: MakeClient
) -> None:
    script = {
        "rules": [
            {"match": "limit", "responses": [{"status": 429, "error": "rate limited"}]},
            {"match": "crash", "responses": [{"status": 503}]},
        ]
    }
    client = openai_client(start_server(script))
    with pytest.raises(openai.RateLimitError, match="rate limited"):
        ask(client, [user("limit")])
    with pytest.raises(openai.InternalServerError) as caught:
        ask(client, [user("crash")], stream=True)
    assert caught.value.status_code == 503


def test_fail_first_fails_then_answers_the_same_request(
    start_server: StartServer, openai_client: MakeClient
) -> None:
    server = start_server({"rules": [{"match": "flaky", "responses": ["fine"], "fail_first": 1}]})
    client = openai_client(server)
    with pytest.raises(openai.RateLimitError):
        ask(client, [user("flaky")])
    assert ask(client, [user("flaky")]).choices[0].message.content == "fine"
    assert server.stats().requests == 2


def test_server_latency_delays_replies(start_server: StartServer, openai_client: MakeClient) -> None:
    client = openai_client(start_server({"default": ["slow"]}, latency_s=0.3))
    started = time.monotonic()
    ask(client, [user("x")])
    assert time.monotonic() - started >= 0.3


def test_rule_and_response_latency_override_the_server_latency(
    start_server: StartServer, openai_client: MakeClient
) -> None:
    script = {
        "rules": [
            {"match": "rule", "responses": ["r"], "latency": 0.3},
            {"match": "resp", "responses": [{"text": "t", "latency": 0.4}], "latency": 0.0},
        ]
    }
    client = openai_client(start_server(script, latency_s=0.0))
    for text, expected_s in (("rule", 0.3), ("resp", 0.4)):
        started = time.monotonic()
        ask(client, [user(text)])
        assert time.monotonic() - started >= expected_s


def test_a_requests_latency_header_comes_after_the_scripts_and_before_the_servers(
    start_server: StartServer, openai_client: MakeClient
) -> None:
    script = {"rules": [{"match": "rule", "responses": ["r"], "latency": 0.0}], "default": ["d"]}
    # Bounds a wrong choice breaks by seconds, not by what a loaded shared host adds to a request.
    client = openai_client(start_server(script, latency_s=10.0))
    slow = {REPLAY_LATENCY_HEADER: "1.0"}
    started = time.monotonic()
    ask(client, [user("anything")], extra_headers=slow)
    assert 1.0 <= time.monotonic() - started < 10.0  # the header, not the server's 10 s
    started = time.monotonic()
    ask(client, [user("rule")], extra_headers=slow)
    assert time.monotonic() - started < 1.0  # the rule's own latency (0) wins


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf", "61"])
def test_a_bad_latency_header_is_a_400(
    value: str, start_server: StartServer, openai_client: MakeClient
) -> None:
    """A latency past the cap would hold a handler thread asleep after its client gave up."""
    client = openai_client(start_server({"default": ["d"]}))
    with pytest.raises(openai.BadRequestError, match=REPLAY_LATENCY_HEADER):
        ask(client, [user("q")], extra_headers={REPLAY_LATENCY_HEADER: value})


def test_a_yaml_script_file_serves(write_script: Callable[..., Path], openai_client: MakeClient) -> None:
    path = write_script({"rules": [{"match": "hi", "responses": ["hello from yaml"]}]}, fmt="yaml")
    assert path.read_text().startswith("rules:")
    with ReplayServer.from_file(path) as server:
        assert ask(openai_client(server), [user("hi")]).choices[0].message.content == "hello from yaml"


def test_many_slow_requests_are_in_flight_at_once(
    start_server: StartServer, openai_client: MakeClient
) -> None:
    requests, latency_s = 50, 3.0  # 50 client threads start well within 3 s, even on a loaded host
    server = start_server({"default": ["ok"]}, latency_s=latency_s)
    client = openai_client(server)
    with ThreadPoolExecutor(max_workers=requests) as pool:
        texts = list(
            pool.map(lambda i: ask(client, [user(f"job {i}")]).choices[0].message.content, range(requests))
        )
    assert texts == ["ok"] * requests
    stats = server.stats()
    assert stats.requests == requests
    # Sequential handling would never hold more than one; threads hold many of them at once.
    assert stats.peak_in_flight >= requests // 5
    assert stats.in_flight == 0


def test_unknown_paths_and_bad_bodies_get_openai_style_errors(start_server: StartServer) -> None:
    server = start_server(PROGRAMS)
    cases = [
        ("GET", "/v1/nothing", None, 404),
        ("POST", "/v1/embeddings", b"{}", 404),
        ("POST", "/v1/chat/completions", b"not json", 400),
        ("POST", "/v1/chat/completions", b"[1, 2]", 400),
        ("POST", "/v1/chat/completions", b'{"messages": "hi"}', 400),
    ]
    root = server.base_url.removesuffix("/v1")
    for method, path, body, status in cases:
        request = urllib.request.Request(root + path, data=body, method=method)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=10)
        with caught.value as response:
            assert response.code == status, (method, path)
            error = json.loads(response.read())["error"]
        assert error["message"]


def test_the_constructor_only_stores_and_stop_is_idempotent() -> None:
    from sandfleet.worker.llm.scripted.script import parse_script

    server = ReplayServer(parse_script({"default": ["x"]}), port=0, latency_s=0.5)
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.base_url
    base_url = server.start()
    assert base_url == f"http://127.0.0.1:{server.port}/v1"
    assert server.port != 0
    with pytest.raises(RuntimeError, match="already started"):
        server.start()
    server.stop()
    server.stop()
