"""The replay model speaks function calling: scripts answer with tool_calls, then text, over real HTTP,
read by the official openai client (and by the fleet's client), with OpenAI's tool-message rules held."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import openai
import pytest

from sandfleet.core.errors import InvalidSpecError, ModelError
from sandfleet.worker.llm.client import OpenAIChatClient, RetryPolicy
from sandfleet.worker.llm.scripted.script import parse_script
from sandfleet.worker.llm.scripted.server import ReplayServer, tool_message_problem

from .helpers import system, user

StartServer = Callable[..., ReplayServer]
MakeClient = Callable[[ReplayServer], openai.OpenAI]
TOOLS = [{"type": "function", "function": {"name": "load_orders", "parameters": {"type": "object"}}}]
LOOP = {
    "rules": [
        {
            "match": "revenue",
            "system": "calling tools",
            "responses": [
                {
                    "tool_calls": [
                        {"name": "load_orders", "arguments": {}},
                        {"name": "get_order", "arguments": '{"order_id": "O-0001"}'},
                    ]
                },
                {
                    "text": "Let me look once more.",
                    "tool_calls": [{"name": "read_text", "arguments": "{broken", "id": "mine"}],
                },
                "RESULT: 42",
            ],
        },
        {"match": "revenue", "responses": ["a program, for a prompt without tools"]},
    ]
}


def tool_answer(call_id: str, content: str = "[]") -> dict[str, str]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def assistant_calls(message: Any) -> dict[str, Any]:
    """An SDK message back as the request's assistant message."""
    return message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})


def test_a_script_answers_with_tool_calls_then_text(
    start_server: StartServer, openai_client: MakeClient
) -> None:
    client = openai_client(start_server(LOOP))
    messages: list[dict[str, Any]] = [system("You answer by calling tools."), user("revenue per region?")]

    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("load_orders", {}),
        ("get_order", {"order_id": "O-0001"}),
    ]
    assert len({c.id for c in calls}) == 2 and all(c.type == "function" for c in calls)
    assert first.usage.completion_tokens > 0

    messages += [assistant_calls(choice.message), *(tool_answer(c.id) for c in calls)]
    second = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    message = second.choices[0].message
    assert message.content == "Let me look once more."
    assert [(c.id, c.function.arguments) for c in message.tool_calls] == [
        ("mine", "{broken")
    ]  # sent as it is

    messages += [assistant_calls(message), tool_answer("mine", "ValueError: bad")]
    third = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
    assert third.choices[0].message.content == "RESULT: 42" and third.choices[0].finish_reason == "stop"
    assert not third.choices[0].message.tool_calls


def test_the_system_regex_tells_a_tool_loop_from_a_code_action_prompt(
    start_server: StartServer, openai_client: MakeClient
) -> None:
    client = openai_client(start_server(LOOP))
    reply = client.chat.completions.create(
        model="m",
        messages=[system("Write ONE program."), user("revenue per region?")],  # type: ignore[list-item]
    )
    assert reply.choices[0].message.content == "a program, for a prompt without tools"


def test_tool_calls_stream_as_deltas(start_server: StartServer, openai_client: MakeClient) -> None:
    client = openai_client(start_server(LOOP))
    messages = [system("calling tools"), user("revenue")]
    with client.chat.completions.stream(model="m", messages=messages, tools=TOOLS) as stream:  # type: ignore[arg-type]
        for _ in stream:
            pass
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["load_orders", "get_order"]
    assert json.loads(calls[1].function.arguments) == {"order_id": "O-0001"}
    assert final.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("messages", "problem"),
    [
        (
            [
                user("q"),
                {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function"}]},
                user("q"),
            ],
            r"must be followed by tool messages answering each 'tool_call_id'; missing: a",
        ),
        ([user("q"), tool_answer("nobody")], r"no call 'nobody' is waiting"),
        (
            [user("q"), {"role": "assistant", "tool_calls": [{"id": "a"}, {"id": "b"}]}, tool_answer("a")],
            r"the last assistant message's tool calls have no answers: b",
        ),
    ],
)
def test_the_server_holds_clients_to_the_tool_message_rules(
    messages: list[dict[str, Any]], problem: str, start_server: StartServer, openai_client: MakeClient
) -> None:
    assert tool_message_problem(messages) is not None
    client = openai_client(start_server(LOOP))
    with pytest.raises(openai.BadRequestError, match=problem):
        client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]


def test_the_fleet_client_returns_the_calls_unparsed(
    start_server: StartServer, openai_client: MakeClient
) -> None:
    server = start_server(LOOP)
    model = OpenAIChatClient("openai:m", "m", openai_client(server), retry=RetryPolicy(max_retries=0))
    reply = model.complete([system("calling tools"), user("revenue")], tools=TOOLS, timeout_s=5)
    assert reply.finish_reason == "tool_calls" and reply.text == ""
    assert [(c.name, c.arguments) for c in reply.tool_calls] == [
        ("load_orders", "{}"),
        ("get_order", '{"order_id": "O-0001"}'),
    ]
    bad = [user("q"), tool_answer("nobody")]
    with pytest.raises(ModelError, match="refused the request: HTTP 400"):
        model.complete(bad, tools=TOOLS)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ({"tool_calls": []}, r"tool_calls: must be a non-empty list"),
        ({"tool_calls": [{"arguments": {}}]}, r"tool_calls\[0\]\.name: must be a non-empty string"),
        (
            {"tool_calls": [{"name": "x", "arguments": 3}]},
            r"arguments: a mapping \(sent as JSON\) or a string",
        ),
        ({"tool_calls": [{"name": "x", "id": ""}]}, r"tool_calls\[0\]\.id: must be a non-empty string"),
        ({"tool_calls": [{"name": "x", "colour": 1}]}, r"unknown key 'colour'"),
        ({"tool_calls": [{"name": "x"}], "status": 500}, r"either 'text' and/or 'tool_calls'"),
    ],
)
def test_bad_tool_calls_in_a_script_are_refused(response: dict[str, Any], expected: str) -> None:
    with pytest.raises(InvalidSpecError, match=expected):
        parse_script({"rules": [{"match": "a", "responses": [response]}]})


def test_a_bad_system_regex_is_refused() -> None:
    with pytest.raises(InvalidSpecError, match=r"rules\[0\]\.system: bad regular expression"):
        parse_script({"rules": [{"match": "a", "system": "(", "responses": ["a"]}]})
