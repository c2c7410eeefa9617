"""A job's code-action settings become its bridge's limits, each cap in its place."""

from __future__ import annotations

import json

from sandfleet.core.config import CodeActionSettings
from sandfleet.worker.program.bridge import BridgeLimits, ToolBridge
from sandfleet.worker.tools.registry import ToolRegistry


def echo(text: str) -> str:
    """The text back."""
    return text


def test_each_setting_becomes_its_own_limit() -> None:
    settings = CodeActionSettings(
        max_tool_calls=7, max_request_bytes=4096, max_response_bytes=8192, tool_timeout=3.5
    )
    assert BridgeLimits.of(settings) == BridgeLimits(
        max_calls=7, max_request_bytes=4096, max_response_bytes=8192, call_timeout_s=3.5
    )


def test_the_bridge_refuses_by_its_limits() -> None:
    bridge = ToolBridge(
        ToolRegistry.from_functions([echo]), BridgeLimits(max_request_bytes=100, max_response_bytes=60)
    )
    big_request = json.dumps({"id": 1, "tool": "echo", "args": ["x" * 200]}).encode()
    big_reply = json.dumps({"id": 2, "tool": "echo", "args": ["y" * 50]}).encode()
    refused = json.loads(bridge.handle({}, big_request))
    assert refused["ok"] is False and "exceeds the 100-byte limit" in refused["message"]
    too_long = json.loads(bridge.handle({}, big_reply))
    assert too_long["ok"] is False and "more than the 60-byte limit" in too_long["message"]
    assert [r.ok for r in bridge.tally.records] == [False, False] and not bridge.tally.budget_exceeded
