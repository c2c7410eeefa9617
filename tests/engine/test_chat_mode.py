"""Chat mode: the job's tools through the tool-calling loop, no sandbox, against the replay model over
real HTTP with the real openai client. Its caps (tool calls, turns, tokens, wall time), bad tool-call
JSON from the model, and the audit of every call."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandfleet.core.contracts import AuditKind, ErrorKind, JobSpec, JobStatus, Limit
from sandfleet.worker.engine import EngineOptions, EngineServices, ListAudit
from sandfleet.worker.llm.scripted.server import ReplayServer
from sandfleet.worker.program.bridge import CallRequest, PolicyDecision
from sandfleet.worker.sandbox.pool import SandboxPool
from sandfleet.worker.tools.examples.scenario import REFERENCE_QUESTION, generate_orders
from sandfleet.worker.tools.examples.side import list_sent_emails
from sandfleet.worker.tools.registry import ToolRegistry

from .helpers import REPLAY_MODEL, engine_settings, run

Replay = Callable[[dict[str, Any]], ReplayServer]
TOOLS = [
    "sandfleet.worker.tools.examples.orders",
    "sandfleet.worker.tools.examples.files",
    "sandfleet.worker.tools.examples.side",
]
MAIL = {"name": "send_email", "arguments": {"to": "ana@example.com", "subject": "hello"}}


def services_with(policy: Any = None) -> EngineServices:
    """Services with the example tools and no Docker at all: chat jobs start no sandbox."""
    registry = ToolRegistry.from_modules(TOOLS)
    pool = SandboxPool(pool_size=0, max_live=1)  # constructing it starts nothing
    if policy is None:
        return EngineServices(engine_settings(model_max_retries=0), pool, registry)
    return EngineServices(engine_settings(model_max_retries=0), pool, registry, EngineOptions(policy=policy))


@pytest.fixture
def services() -> Iterator[EngineServices]:
    with services_with() as s:
        yield s


def chat(question: str, tools: list[str], **fields: Any) -> JobSpec:
    return JobSpec(question=question, tools=tools, model=REPLAY_MODEL, mode="chat", **fields)


def script(*responses: Any) -> dict[str, Any]:
    return {"rules": [{"match": ".", "responses": list(responses)}]}


def calls(*items: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": list(items)}


def test_the_reference_question_as_a_chat_job(
    services: EngineServices, replay: Replay, orders_dir: Path
) -> None:
    server = replay(
        script(calls({"name": "load_orders", "arguments": {}}), 'The totals.\nRESULT: {"EMEA": 1.5}')
    )
    audit = ListAudit()
    result = run(chat(REFERENCE_QUESTION, ["load_orders"]), services, server, audit)

    assert result.status == JobStatus.SUCCEEDED and result.mode == "chat"
    assert result.result == {"EMEA": 1.5}  # the RESULT line of the last reply
    assert result.usage.model_calls == 2 and result.tool_calls == 1 and not result.attempts
    (first, second) = result.turns
    (call,) = first.calls
    assert call.tool == "load_orders" and call.ok and call.arguments == "{}"
    rows = len(generate_orders())
    assert call.result_size > 40_000 and call.shown_size == call.result_size  # all 500 rows, not cut
    assert second.reply.endswith('RESULT: {"EMEA": 1.5}') and second.finish_reason == "stop"

    kinds = [kind for kind, _, _ in audit.events]
    assert kinds == [
        AuditKind.MODEL_CALL,
        AuditKind.FUNCTION_CALL,
        AuditKind.FUNCTION_RESULT,
        AuditKind.MODEL_CALL,
    ]
    requests = [data for kind, _, data in audit.events if kind == AuditKind.MODEL_CALL]
    system, question = requests[0]["messages"]
    assert system["role"] == "system" and "50 calls in all" in system["content"]
    assert question == {"role": "user", "content": REFERENCE_QUESTION}
    assert requests[0]["tool_calls"][0]["name"] == "load_orders"
    # The second request showed the model the tool's result: every one of the rows.
    (tool_message,) = requests[1]["messages"]
    assert tool_message["role"] == "tool" and len(json.loads(tool_message["content"])) == rows
    shown = next(data for kind, _, data in audit.events if kind == AuditKind.FUNCTION_RESULT)
    assert shown["tool"] == "load_orders" and json.loads(shown["shown"])[0]["order_id"] == "O-0001"


def test_a_model_looping_on_tool_calls_is_stopped_at_the_budget(
    services: EngineServices, replay: Replay, data_dir: Path
) -> None:
    server = replay(script(calls(MAIL)))  # every reply asks to send one more mail
    result = run(chat("Mail Ana", ["send_email"], tool_loop={"max_tool_calls": 3}), services, server)

    assert result.status == JobStatus.FAILED
    assert result.error.kind == ErrorKind.LIMIT and "past the budget of 3" in result.error.message
    assert result.limits_hit == [Limit.TOOL_CALLS]
    assert len(list_sent_emails()) == 3  # the tool really ran three times, never a fourth
    outcomes = [(c.seq, c.ok, c.error_type) for t in result.turns for c in t.calls]
    assert outcomes == [
        (1, True, None),
        (2, True, None),
        (3, True, None),
        (4, False, "ToolBudgetExceededError"),  # refused; the model gets one more turn to answer
        (5, False, "NotRunError"),  # it asked again: the job ends, the call is not run
    ]
    assert result.usage.model_calls == 5 and result.tool_calls == 5


def test_after_the_budget_the_model_may_still_answer(
    services: EngineServices, replay: Replay, data_dir: Path
) -> None:
    server = replay(script(calls(MAIL), calls(MAIL), "I sent one.\nRESULT: 1"))
    result = run(chat("Mail Ana", ["send_email"], tool_loop={"max_tool_calls": 1}), services, server)
    assert result.status == JobStatus.SUCCEEDED and result.result == 1
    assert result.limits_hit == [Limit.TOOL_CALLS] and len(list_sent_emails()) == 1
    refused = result.turns[1].calls[0]
    assert refused.error_type == "ToolBudgetExceededError" and "answer now" in refused.error


def test_bad_tool_call_json_from_the_model_is_an_error_it_is_told(
    services: EngineServices, replay: Replay, orders_dir: Path
) -> None:
    server = replay(
        script(
            calls(
                {"name": "get_order", "arguments": '{"order_id": "O-00'},  # cut off mid-string
                {"name": "get_order", "arguments": '["O-0001"]'},  # JSON, but not an object
                {"name": "get_order", "arguments": '{"id": "O-0001"}'},  # the wrong parameter
                {"name": "drop_tables", "arguments": "{}"},  # no such tool
                {"name": "get_order", "arguments": '{"order_id": "O-0001"}'},
            ),
            "RESULT: done",
        )
    )
    audit = ListAudit()
    result = run(chat("Order O-0001?", ["get_order"]), services, server, audit)

    assert result.status == JobStatus.SUCCEEDED and result.tool_calls == 5
    bad_json, not_object, wrong_name, unknown, good = result.turns[0].calls
    assert bad_json.error_type == "ToolArgumentsError" and "not valid JSON" in bad_json.error
    assert not_object.error_type == "ToolArgumentsError" and "one JSON object" in not_object.error
    assert wrong_name.error_type == "TypeError" and "unexpected keyword argument 'id'" in wrong_name.error
    assert unknown.error_type == "NameError" and "no tool named 'drop_tables'" in unknown.error
    assert good.ok and good.result["order_id"] == "O-0001"
    # Each error went back to the model as the tool's answer, and the job went on.
    (answers,) = [d["messages"] for k, _, d in audit.events if k == AuditKind.MODEL_CALL][1:]
    assert [m["role"] for m in answers] == ["tool"] * 5
    assert answers[0]["content"].startswith("ToolArgumentsError: the arguments are not valid JSON")


def test_the_turn_cap_stops_a_reply_that_still_asks_for_calls(
    services: EngineServices, replay: Replay, data_dir: Path
) -> None:
    server = replay(script(calls(MAIL)))
    result = run(chat("Mail Ana", ["send_email"], tool_loop={"max_turns": 2}), services, server)
    assert result.status == JobStatus.FAILED and result.error.kind == ErrorKind.LIMIT
    assert result.limits_hit == [Limit.TURNS] and "after 2 turns" in result.error.message
    assert len(list_sent_emails()) == 1  # the second reply's call was not run
    assert result.turns[1].calls[0].error_type == "NotRunError"


def test_the_token_cap(services: EngineServices, replay: Replay, orders_dir: Path) -> None:
    load = calls({"name": "load_orders", "arguments": {}})
    server = replay(script(load, load, "RESULT: never"))
    result = run(chat(REFERENCE_QUESTION, ["load_orders"], tool_loop={"max_tokens": 5000}), services, server)
    assert result.status == JobStatus.FAILED and result.limits_hit == [Limit.TOKENS]
    assert result.usage.prompt_tokens > 5000 and "max_tokens of 5000" in result.error.message


def test_the_wall_time_cap_bounds_the_model_request(
    services: EngineServices, replay: Replay, data_dir: Path
) -> None:
    server = replay({"rules": [{"match": ".", "responses": ["RESULT: late"], "latency": 5}]})
    result = run(chat("Slow?", [], tool_loop={"wall_timeout": 1}), services, server)
    assert result.status == JobStatus.TIMED_OUT and result.limits_hit == [Limit.WALL_TIME]
    assert result.error.kind == ErrorKind.LIMIT and result.timings["total_s"] < 5  # the request was cut


def test_a_model_that_refuses_the_request_fails_the_job(services: EngineServices, replay: Replay) -> None:
    server = replay({"rules": [{"match": "never", "responses": ["x"]}]})  # no rule, no default: HTTP 400
    result = run(chat("Anything?", []), services, server)
    assert result.status == JobStatus.FAILED and result.error.kind == ErrorKind.MODEL


def test_an_empty_last_reply_is_no_answer(services: EngineServices, replay: Replay) -> None:
    result = run(chat("Anything?", []), services, replay(script(" ")))
    assert result.status == JobStatus.FAILED and result.error.kind == ErrorKind.NO_ANSWER


def test_the_operators_call_policy_is_consulted(replay: Replay, data_dir: Path) -> None:
    seen: list[CallRequest] = []

    def no_mail(request: CallRequest) -> PolicyDecision:
        seen.append(request)
        return PolicyDecision(request.tool != "send_email", "mail needs a person's approval")

    with services_with(no_mail) as services:
        result = run(chat("Mail Ana", ["send_email"]), services, replay(script(calls(MAIL), "RESULT: no")))
    (call,) = result.turns[0].calls
    assert call.error_type == "PermissionError" and "mail needs a person's approval" in call.error
    assert seen[0].kwargs == {"to": "ana@example.com", "subject": "hello"} and seen[0].seq == 1
    assert list_sent_emails() == []


def test_a_chat_job_naming_an_unknown_tool_is_refused(services: EngineServices, replay: Replay) -> None:
    audit = ListAudit()
    result = run(chat("q", ["no_such_tool"]), services, replay(script("RESULT: x")), audit)
    assert result.status == JobStatus.REFUSED and "unknown tool no_such_tool" in result.error.message
    assert [kind for kind, _, _ in audit.events] == [AuditKind.ERROR]  # before any model call
