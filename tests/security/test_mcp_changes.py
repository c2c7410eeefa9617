"""Hostile MCP servers that change, for real: a server flooding list-changed notifications, one whose
listing turns malformed after a change, and resources: a URI the server never listed (or a template
value climbing out), a resource past the message limit, a read answered with something that is not a
read result.

The server is the tests' own tests/mcp_tools/servers/changing.py over stdio, held by the worker's MCP
sessions (no sandbox: what reaches the host and the server is what is checked; the program's side is
tests/mcp_tools/test_worker_changes.py). Outcomes go to ``artifacts/security-results.json``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from mcp_tools.helpers import CHANGING, stdio, wait_until

from sandfleet.worker.mcp.catalog import ToolCatalog
from sandfleet.worker.mcp.config import parse_mcp_config
from sandfleet.worker.mcp.errors import ToolServerError
from sandfleet.worker.mcp.results import result_value
from sandfleet.worker.mcp.sessions import McpSessions
from sandfleet.worker.tools.registry import ToolRegistry

from .helpers import record

SPAM = 500


def sessions_for(*args: str, **options: Any) -> McpSessions:
    servers = {"ch": stdio(CHANGING, *args, maxMessageBytes=1024**2)}
    config = parse_mcp_config(json.dumps({"mcpServers": servers}))
    return McpSessions(config, **{"backoff_start_s": 0.2, "backoff_max_s": 1.0, **options})


def value(sessions: McpSessions, tool: str, **arguments: Any) -> Any:
    return result_value(sessions.call("ch", tool, arguments, 30), tool=tool, unwrap=True)


def poison(sessions: McpSessions) -> None:
    """Turn the server's listing malformed. The worker may read it (and drop the connection) before
    the call's own answer arrives: both are the server's doing."""
    try:
        assert value(sessions, "poison") == "poisoned"
    except ToolServerError as e:
        assert "failed during the call to poison" in str(e)


def server_pid() -> int:
    [process] = [p for p in psutil.Process().children(recursive=True) if str(CHANGING) in p.cmdline()]
    return process.pid


@pytest.fixture(scope="module")
def changing() -> Iterator[McpSessions]:
    with sessions_for() as sessions:
        assert sessions.is_up("ch"), sessions.status()
        yield sessions


@pytest.mark.parametrize("era", ["modern", "legacy"])
def test_a_flood_of_list_changes_costs_one_listing_per_interval(era: str) -> None:
    args = ("--legacy",) if era == "legacy" else ()
    with sessions_for(*args, refresh_interval_s=30) as sessions:
        assert value(sessions, "spam", count=SPAM) == str(SPAM)
        assert wait_until(lambda: sessions.status()[0].notified == SPAM), sessions.status()
        # The refresh runs on the session's own thread: on a loaded host it may end after the last
        # notification is counted. Wait for it, then check that it stayed the only one.
        assert wait_until(lambda: sessions.status()[0].refreshes >= 1), sessions.status()
        [status] = sessions.status()
        lists = value(sessions, "served")["lists"]
        assert status.refreshes == 1 and lists == 2, (status, lists)  # the first listing, one refresh
        assert sessions.is_up("ch") and value(sessions, "steady") == "steady here"
    record(
        f"MCP: a server notifying {SPAM} list changes in a burst ({era})",
        "host",
        True,
        f"{status.notified} notifications counted, {status.refreshes} refresh (refresh interval 30 s); "
        "the server answered tools/list twice in all; calls answered throughout",
    )


def test_a_listing_that_turns_malformed_after_a_change_takes_the_server_down_and_restarts_it() -> None:
    with sessions_for(refresh_interval_s=0) as sessions:
        catalog = ToolCatalog(ToolRegistry(), sessions)
        before = server_pid()
        poison(sessions)
        assert wait_until(lambda: sessions.status()[0].restarts >= 1), sessions.status()
        assert wait_until(lambda: sessions.is_up("ch")), sessions.status()
        after = server_pid()
        assert after != before and "ch__steady" in catalog.registry()
    record(
        "MCP: a server whose tool listing turns malformed after it notified a change",
        "host",
        True,
        "the listing refused as at connection (the SDK's types); the server marked down "
        "('its listing after a change could not be read'), its tools no longer offered, restarted "
        "(new pid) with backoff, its fresh listing offered",
    )


def test_the_down_reason_of_a_malformed_listing_says_so() -> None:
    with sessions_for(refresh_interval_s=0, backoff_start_s=30, backoff_max_s=30) as sessions:
        poison(sessions)
        assert wait_until(lambda: not sessions.is_up("ch")), sessions.status()
        detail = sessions.status()[0].detail
        assert detail.startswith("its listing after a change could not be read"), detail


@pytest.mark.parametrize(
    "uri",
    ["secret://token", "notes://../secret", "notes://%2e%2e", "notes://a%2fb", "data://notes.txt/../../x"],
)
def test_a_uri_the_server_did_not_offer_never_reaches_it(changing: McpSessions, uri: str) -> None:
    registry = ToolCatalog(ToolRegistry(), changing).registry()
    with pytest.raises(ValueError, match="MCP server 'ch' did not list the resource"):
        registry.call("ch__read_resource", [uri], {})
    assert uri not in value(changing, "served")["reads"]
    record(
        f"MCP: reading a resource the server did not offer ({uri})",
        "host",
        True,
        "ValueError on the host naming what the server listed; the server never asked",
    )


def test_a_resource_past_the_message_limit_is_a_bounded_error(changing: McpSessions) -> None:
    registry = ToolCatalog(ToolRegistry(), changing).registry()
    rss = psutil.Process().memory_info().rss
    with pytest.raises(ToolServerError, match=r"more than 1048576 bytes \(maxMessageBytes\)"):
        registry.call("ch__read_resource", ["data://huge.txt"], {})
    grew = psutil.Process().memory_info().rss - rss
    assert grew < 64 * 1024**2
    assert wait_until(lambda: changing.is_up("ch")), changing.status()
    record(
        "MCP: a 3 MiB resource from a server whose maxMessageBytes is 1 MiB",
        "host",
        True,
        f"ToolServerError naming maxMessageBytes; the connection ended at the limit and the server "
        f"restarted; this process grew {grew // 1024} KiB",
    )


def test_a_malformed_read_result_fails_that_read_at_once(changing: McpSessions) -> None:
    assert wait_until(lambda: changing.is_up("ch"))
    registry = ToolCatalog(ToolRegistry(), changing).registry()
    with pytest.raises(ToolServerError, match="answered read_resource with a malformed result"):
        registry.call("ch__read_resource", ["data://malformed"], {}, 20)
    assert registry.call("ch__read_resource", ["data://notes.txt"], {})["text"] == "the notes"
    record(
        "MCP: a read answered with contents that are not a list",
        "host",
        True,
        "ToolServerError 'answered read_resource with a malformed result' at once, not at the timeout; "
        "the session went on",
    )
