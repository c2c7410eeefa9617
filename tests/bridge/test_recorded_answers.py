"""The bridge's one recorded-answer source (replay, resume, memo), asked directly: pure, no container."""

from __future__ import annotations

import json

from sandfleet.core.contracts import ToolCallRecord
from sandfleet.worker.program.bridge import ToolBridge
from sandfleet.worker.program.recorded import RecordedAnswers, call_digest
from sandfleet.worker.tools.registry import ToolRegistry, side_effects

RAN: list[str] = []


@side_effects
def send(to: str) -> str:
    """Send something (a side effect)."""
    RAN.append(to)
    return f"sent-{to}"


def lookup(key: str) -> str:
    """Read something (no side effect)."""
    RAN.append(key)
    return f"read-{key}"


def record(seq: int, tool: str, arg: str, result: str, **extra: object) -> ToolCallRecord:
    return ToolCallRecord(seq=seq, tool=tool, args=[arg], kwargs={}, ok=True, result=result, **extra)  # type: ignore[arg-type]


def call(bridge: ToolBridge, tool: str, arg: str) -> dict:  # type: ignore[type-arg]
    body = json.dumps({"id": 1, "tool": tool, "args": [arg], "kwargs": {}}).encode()
    return json.loads(bridge.handle({}, body))


def bridge_with(recorded: RecordedAnswers) -> ToolBridge:
    return ToolBridge(ToolRegistry.from_functions([send, lookup]), recorded=recorded)


def test_a_replay_answers_every_call_from_its_records_and_refuses_a_call_it_lacks() -> None:
    RAN.clear()
    bridge = bridge_with(RecordedAnswers(replay=[record(1, "lookup", "a", "then-a")]))
    assert call(bridge, "lookup", "a")["value"] == "then-a"
    unknown = call(bridge, "lookup", "b")
    assert unknown["ok"] is False and unknown["type"] == "LookupError"
    assert "call 2 (lookup) differs from the recorded run" in unknown["message"]
    assert RAN == [] and [r.replayed for r in bridge.tally.records] == [True, False]


def test_a_resumed_run_serves_completed_calls_once_unaudited_then_runs_new_ones() -> None:
    RAN.clear()
    audited: list[int] = []
    recorded = RecordedAnswers(resume=[record(1, "send", "x", "sent-before", approval_id="req-1")])
    bridge = bridge_with(recorded)
    bridge.on_call = lambda r: audited.append(r.seq)
    assert call(bridge, "send", "x")["value"] == "sent-before"
    assert call(bridge, "send", "x")["value"] == "sent-x"  # the record stands in for one call only
    assert RAN == ["x"] and audited == [2]  # the resumed call was audited before the suspension
    assert bridge.tally.records[0].approval_id == "req-1" and not bridge.tally.records[0].replayed


def test_the_memo_serves_only_side_effecting_tools() -> None:
    RAN.clear()
    memo = {
        call_digest("send", ["x"], {}): ["sent-earlier"],
        call_digest("lookup", ["k"], {}): ["read-earlier"],
    }
    bridge = bridge_with(RecordedAnswers(memo=memo))
    assert call(bridge, "send", "x")["value"] == "sent-earlier"
    assert call(bridge, "lookup", "k")["value"] == "read-k"  # reads run again: only effects are kept
    assert RAN == ["k"] and memo[call_digest("send", ["x"], {})] == [
        "sent-earlier"
    ]  # the caller's memo is untouched


def login(user: str, password: str, options: dict | None = None) -> str:  # type: ignore[type-arg]
    """Log in (takes a secret)."""
    RAN.append(user)
    return f"token-{user}-{len(password)}"


def test_redacted_fields_are_hidden_by_name_or_position_and_a_replay_matches_them_by_digest() -> None:
    RAN.clear()
    bridge = ToolBridge(ToolRegistry.from_functions([login]), redact=("Password", "token"))
    for body in (
        {"id": 1, "tool": "login", "args": ["ana", "hunter2"], "kwargs": {"options": {"token": "t0k"}}},
        {"id": 2, "tool": "login", "args": [], "kwargs": {"user": "ana", "password": "hunter2"}},
    ):
        assert json.loads(bridge.handle({}, json.dumps(body).encode()))["ok"]  # the tool got the secret
    first, second = bridge.tally.records
    assert first.args == ["ana", "***"] and first.kwargs == {"options": {"token": "***"}}
    assert first.redacted == ["password", "options.token"]
    assert second.kwargs == {"user": "ana", "password": "***"} and second.redacted == ["password"]
    assert first.call_sha256 == call_digest("login", ["ana", "hunter2"], {"options": {"token": "t0k"}})
    assert "hunter2" not in json.dumps([r.model_dump(mode="json") for r in bridge.tally.records])

    replay = ToolBridge(ToolRegistry.from_functions([login]), recorded=RecordedAnswers(replay=[second]))
    other = {"id": 1, "tool": "login", "args": [], "kwargs": {"user": "ana", "password": "guess"}}
    assert json.loads(replay.handle({}, json.dumps(other).encode()))["type"] == "LookupError"
    same = {"id": 2, "tool": "login", "args": [], "kwargs": {"user": "ana", "password": "hunter2"}}
    assert json.loads(replay.handle({}, json.dumps(same).encode()))["value"] == "token-ana-7"
    assert RAN == ["ana", "ana"]  # the replay ran nothing
