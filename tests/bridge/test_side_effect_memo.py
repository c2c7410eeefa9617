"""The host side of the bridge, driven directly with request frames (no container needed)."""

from __future__ import annotations

import json

from sandfleet.worker.program.bridge import BridgeLimits, ToolBridge
from sandfleet.worker.program.recorded import RecordedAnswers, call_digest
from sandfleet.worker.tools.registry import ToolRegistry, side_effects

SENT: list[str] = []


@side_effects
def send(to: str) -> str:
    """Send something (a side effect)."""
    SENT.append(to)
    return f"id-{len(SENT)}"


def call(bridge: ToolBridge, tool: str, *args: object) -> dict:
    body = json.dumps({"id": 1, "tool": tool, "args": list(args), "kwargs": {}}).encode()
    return json.loads(bridge.handle({}, body))


def test_each_earlier_side_effecting_call_stands_in_for_one_repeat_only() -> None:
    SENT.clear()
    registry = ToolRegistry.from_functions([send])
    memo = {call_digest("send", ["a@example.org"], {}): ["id-earlier"]}
    bridge = ToolBridge(registry, recorded=RecordedAnswers(memo=memo))
    first = call(bridge, "send", "a@example.org")
    second = call(bridge, "send", "a@example.org")
    assert first == {"id": 1, "ok": True, "value": "id-earlier"}
    assert second["ok"] and second["value"] == "id-1"  # the repeat beyond the earlier one really runs
    assert SENT == ["a@example.org"]
    assert [r.replayed for r in bridge.tally.records] == [True, False]


def test_every_call_counts_towards_the_budget_failed_and_unknown_ones_too() -> None:
    bridge = ToolBridge(ToolRegistry.from_functions([send]), BridgeLimits(max_calls=2))
    assert call(bridge, "nope")["type"] == "NameError"
    assert bridge.handle({}, b"not json")  # malformed: counted, answered
    third = call(bridge, "send", "b@example.org")
    assert third["ok"] is False and third["message"] == "tool-call budget of 2 exceeded"
    assert len(bridge.tally.records) == 3 and bridge.tally.budget_exceeded
