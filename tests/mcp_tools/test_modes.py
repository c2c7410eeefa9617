"""MCP tools in the tool-calling modes: a chat job's model is offered each MCP tool with the server's
own input schema and calls it by the server's own argument names; the replay model answers over real
HTTP through the real openai client; the server is the tests' odd server over stdio (no sandbox)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sandfleet.core.contracts import AuditKind, JobSpec, JobStatus
from sandfleet.worker.engine import EngineOptions, EngineServices, ListAudit, run_job
from sandfleet.worker.engine.schemas import function_tools
from sandfleet.worker.llm.scripted.script import parse_script
from sandfleet.worker.llm.scripted.server import ReplayServer
from sandfleet.worker.mcp.config import parse_mcp_config
from sandfleet.worker.mcp.sessions import McpSessions
from sandfleet.worker.sandbox.pool import SandboxPool
from sandfleet.worker.tools.registry import ToolRegistry

from .helpers import ODD, stdio

REPLAY_MODEL = "openai:replay"


@pytest.fixture
def services() -> Iterator[EngineServices]:
    from sandfleet.core.settings import Settings

    config = parse_mcp_config(json.dumps({"mcpServers": {"odd": stdio(ODD)}}))
    with McpSessions(config) as sessions:
        settings = Settings(model_api_key=None, model_base_url=None, model_max_retries=0, pool_size=0)
        pool = SandboxPool(pool_size=0, max_live=1)  # a chat job starts no sandbox
        with EngineServices(settings, pool, ToolRegistry(), EngineOptions(mcp=sessions)) as started:
            yield started


def test_a_chat_jobs_model_gets_the_servers_schema_and_calls_with_its_names(services: EngineServices) -> None:
    [weather] = [
        f for f in function_tools(services.registry) if f["function"]["name"] == "odd__get_weather_now"
    ]
    assert weather["function"]["parameters"]["properties"].keys() == {
        "city",
        "from",
        "user-id",
        "2fa",
        "unit",
    }
    assert weather["function"]["description"].startswith(
        "odd__get_weather_now(city: str, *, from_: str = None"
    )

    call = {"name": "odd__get_weather_now", "arguments": {"city": "Oslo", "from": "2026-01-01", "user-id": 7}}
    bad = {"name": "odd__get_weather_now", "arguments": {"city": "Oslo", "user-id": "seven"}}
    script = {"rules": [{"match": ".", "responses": [{"tool_calls": [call, bad]}, "RESULT: done"]}]}
    server = ReplayServer(parse_script(script), latency_s=0.0)
    server.start()
    try:
        audit = ListAudit()
        spec = JobSpec(question="Weather?", tools=["odd__get_weather_now"], model=REPLAY_MODEL, mode="chat")
        result = run_job(spec, "chat-mcp", services=services, audit=audit, base_url=server.base_url)
    finally:
        server.stop()

    assert result.status == JobStatus.SUCCEEDED and result.result == "done"
    first, second = result.turns[0].calls
    assert first.ok and first.result["arguments"] == {
        "city": "Oslo",
        "from": "2026-01-01",
        "user-id": 7,
    }
    assert not second.ok and second.error_type == "TypeError"
    assert "argument user_id: 'seven' is not of type 'integer'" in second.error
    kinds = [kind for kind, _, _ in audit.events]
    assert kinds.count(AuditKind.FUNCTION_CALL) == 2


def test_a_chat_job_naming_a_tool_of_a_server_that_is_down_is_retried() -> None:
    from sandfleet.core.errors import ToolServerUnavailableError
    from sandfleet.core.settings import Settings

    config = parse_mcp_config(json.dumps({"mcpServers": {"gone": {"command": "/no/such/server"}}}))
    with McpSessions(config, backoff_start_s=5.0) as sessions:
        settings = Settings(model_api_key=None, model_base_url=None, pool_size=0)
        with EngineServices(
            settings, SandboxPool(pool_size=0, max_live=1), ToolRegistry(), EngineOptions(mcp=sessions)
        ) as services:
            spec = JobSpec(question="q", tools=["gone__search"], model=REPLAY_MODEL, mode="chat")
            with pytest.raises(
                ToolServerUnavailableError, match="MCP server 'gone' \\(tool gone__search\\) is down"
            ):
                run_job(spec, "chat-down", services=services, audit=ListAudit())
