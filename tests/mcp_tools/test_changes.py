"""MCP servers that change while the worker holds them, against real servers (the tests' changing.py
over stdio in both protocol eras and over streamable HTTP, odd.py over HTTP): list changes refresh the
catalog, a ping notices a server that is gone or hung, resources are read through the reader tool.
No sandbox here: calls are made as the bridge makes them (the fleet's view: test_worker_changes.py).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from sandfleet.worker.mcp.catalog import ToolCatalog
from sandfleet.worker.mcp.config import parse_mcp_config
from sandfleet.worker.mcp.errors import ToolError, ToolServerError
from sandfleet.worker.mcp.results import result_value
from sandfleet.worker.mcp.sessions import McpSessions
from sandfleet.worker.tools.registry import ToolRegistry

from .helpers import CHANGING, ODD, HttpServer, stdio, wait_until

FAST = {"backoff_start_s": 0.2, "backoff_max_s": 1.0, "refresh_interval_s": 0.2}


def sessions_for(servers: dict[str, dict[str, Any]], **options: Any) -> McpSessions:
    config = parse_mcp_config(json.dumps({"mcpServers": servers}))
    return McpSessions(config, **{**FAST, **options})


def value(sessions: McpSessions, server: str, tool: str, **arguments: Any) -> Any:
    return result_value(sessions.call(server, tool, arguments, 20), tool=tool, unwrap=True)


def names(catalog: ToolCatalog, prefix: str) -> list[str]:
    return sorted(n for n in catalog.registry().names() if n.startswith(prefix))


def served(sessions: McpSessions, server: str) -> dict[str, Any]:
    result: dict[str, Any] = value(sessions, server, "served")
    return result


@pytest.fixture(params=["modern", "legacy"])
def changing(request: pytest.FixtureRequest) -> Iterator[McpSessions]:
    """The changing server over stdio, served in the 2026-07-28 era (changes on a listen stream) or
    only the handshake era (changes notified unasked)."""
    args = ("--legacy",) if request.param == "legacy" else ()
    with sessions_for({"ch": stdio(CHANGING, *args)}) as sessions:
        assert sessions.is_up("ch"), sessions.status()
        yield sessions


def test_a_list_change_refreshes_the_catalog_and_a_taken_snapshot_keeps_its_tools(
    changing: McpSessions,
) -> None:
    catalog = ToolCatalog(ToolRegistry(), changing)
    before = catalog.registry()
    assert "ch__doomed" in before and "ch__fresh" not in before
    era = changing.status()[0].detail.rsplit(" ", 1)[-1]

    now = value(changing, "ch", "change", add=["fresh"], remove=["doomed"])

    assert json.loads(now) == ["fresh", "steady"]
    assert wait_until(lambda: "ch__fresh" in catalog.registry()), (era, changing.status())
    after = catalog.registry()
    assert "ch__doomed" not in after and after.call("ch__fresh", [], {}) == "fresh here"
    [status] = changing.status()
    assert status.notified >= 1 and status.refreshes >= 1 and status.tools == 6
    # A job admitted before keeps the tool object it was given: the call reaches the server, which
    # now answers for itself (this server says it has no such tool any more).
    with pytest.raises(ToolError, match="Unknown tool: doomed"):
        before.call("ch__doomed", [], {})
    with pytest.raises(Exception, match="unknown tool ch__doomed"):
        after.subset(["ch__doomed"])  # a new job naming it is refused, as for any unknown tool


def test_a_ping_is_answered_in_both_eras(changing: McpSessions) -> None:
    assert changing.ping("ch") > 0


def test_the_periodic_ping_records_its_round_trip() -> None:
    with sessions_for({"ch": stdio(CHANGING, "--legacy")}, ping_interval_s=0.2) as sessions:
        assert wait_until(lambda: sessions.status()[0].ping_ms is not None), sessions.status()
        assert sessions.is_up("ch") and sessions.status()[0].restarts == 0


# ---- streamable HTTP ------------------------------------------------------------------------------------


@pytest.fixture
def changing_http() -> Iterator[HttpServer]:
    server = HttpServer(CHANGING).start()
    yield server
    server.stop()


def test_http_a_change_made_by_another_client_reaches_the_workers_catalog(changing_http: HttpServer) -> None:
    with (
        sessions_for({"ch": {"url": changing_http.url}}) as worker,
        sessions_for({"other": {"url": changing_http.url}}) as other,
    ):
        catalog = ToolCatalog(ToolRegistry(), worker)
        assert names(catalog, "ch__") == [
            "ch__change", "ch__doomed", "ch__poison", "ch__read_resource", "ch__served", "ch__spam", "ch__steady",
        ]  # fmt: skip
        value(other, "other", "change", add=["http_new"])
        assert wait_until(lambda: "ch__http_new" in catalog.registry()), worker.status()
        assert catalog.registry().call("ch__http_new", [], {}) == "http_new here"


def test_http_a_server_that_goes_away_is_noticed_by_the_ping_and_comes_back_up() -> None:
    server = HttpServer(ODD).start()  # odd.py announces no list changes: only the ping can notice
    try:
        with sessions_for({"odd": {"url": server.url}}, ping_interval_s=0.5, ping_timeout_s=5) as sessions:
            assert sessions.is_up("odd")
            server.stop()
            assert wait_until(lambda: not sessions.is_up("odd")), sessions.status()
            [down] = sessions.status()
            assert down.detail.startswith("a ping failed: cannot connect to " + server.url), down.detail
            assert "start the server at" in down.fix and down.ping_ms is None
            with pytest.raises(
                ToolServerError, match="MCP server 'odd' is down: a ping failed: cannot connect"
            ):
                sessions.call("odd", "search", {"query": "x"}, 30)  # at once, not after 30 s
            server.start()
            assert wait_until(lambda: sessions.is_up("odd")), sessions.status()
            assert value(sessions, "odd", "search", query="back")["arguments"] == {"query": "back"}
    finally:
        server.stop()


def test_a_hung_stdio_server_misses_its_ping_and_is_restarted() -> None:
    with sessions_for({"ch": stdio(CHANGING)}, ping_interval_s=0.3, ping_timeout_s=1) as sessions:
        [process] = [p for p in psutil.Process().children(recursive=True) if str(CHANGING) in p.cmdline()]
        os.kill(process.pid, signal.SIGSTOP)  # alive, holding its pipes, answering nothing
        try:
            assert wait_until(lambda: sessions.status()[0].restarts >= 1), sessions.status()
            assert wait_until(lambda: sessions.is_up("ch")), sessions.status()
        finally:
            if process.is_running():
                os.kill(process.pid, signal.SIGCONT)
        [again] = [p for p in psutil.Process().children(recursive=True) if str(CHANGING) in p.cmdline()]
        assert again.pid != process.pid
        assert value(sessions, "ch", "steady") == "steady here"


def test_the_down_reason_of_a_missed_ping_names_the_timeout() -> None:
    with sessions_for(
        {"ch": stdio(CHANGING)}, ping_interval_s=0.3, ping_timeout_s=1, backoff_start_s=30, backoff_max_s=30
    ) as sessions:
        [process] = [p for p in psutil.Process().children(recursive=True) if str(CHANGING) in p.cmdline()]
        os.kill(process.pid, signal.SIGSTOP)
        try:
            assert wait_until(lambda: not sessions.is_up("ch")), sessions.status()
            assert sessions.status()[0].detail.startswith("no answer to a ping within 1 s")
        finally:
            os.kill(process.pid, signal.SIGCONT)


# ---- resources ------------------------------------------------------------------------------------------


def test_resources_are_read_through_the_reader_tool(changing: McpSessions) -> None:
    registry = ToolCatalog(ToolRegistry(), changing).registry()
    reader = registry.get("ch__read_resource")
    assert reader.read_only and not reader.side_effects
    assert reader.signature == "ch__read_resource(uri: str) -> dict"
    assert (
        "4 listed: data://notes.txt" in reader.description
        and "templates: notes://{day}" in reader.description
    )
    notes = registry.call("ch__read_resource", ["data://notes.txt"], {})
    assert notes == {
        "type": "resource",
        "uri": "data://notes.txt",
        "mime_type": "text/plain",
        "text": "the notes",
    }
    assert registry.call("ch__read_resource", [], {"uri": "notes://friday"})["text"] == "notes of friday"
    import base64

    logo = registry.call("ch__read_resource", ["data://logo.png"], {})
    assert logo["mime_type"] == "image/png" and base64.b64decode(logo["data"]).startswith(b"\x89PNG")
    with pytest.raises(TypeError):
        registry.call("ch__read_resource", [], {"url": "data://notes.txt"})
