"""The worker's MCP sessions against real servers: the PyPI reference servers over stdio, the tests'
own servers over stdio and streamable HTTP. No sandbox here: calls are made as the bridge makes them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from sandfleet_testing import wait_until

from sandfleet.worker.mcp.config import parse_mcp_config
from sandfleet.worker.mcp.errors import ToolError, ToolServerError
from sandfleet.worker.mcp.results import result_value
from sandfleet.worker.mcp.sessions import McpSessions

from .helpers import LAB, HttpServer, stdio, third_party

FAST_BACKOFF = {"backoff_start_s": 0.2, "backoff_max_s": 1.0}


def sessions_for(servers: dict[str, dict[str, Any]], **options: Any) -> McpSessions:
    import json

    return McpSessions(parse_mcp_config(json.dumps({"mcpServers": servers})), **{**FAST_BACKOFF, **options})


@pytest.fixture
def lab_stdio(lab_data: Path) -> Iterator[McpSessions]:
    with sessions_for(
        {
            "lab": stdio(
                LAB, "--data", str(lab_data), env={"LAB_SECRET": "only-for-the-lab"}, maxMessageBytes=1024**2
            )
        }
    ) as sessions:
        assert sessions.is_up("lab"), sessions.status()
        yield sessions


def value(sessions: McpSessions, server: str, tool: str, timeout_s: float = 20, **arguments: Any) -> Any:
    return result_value(sessions.call(server, tool, arguments, timeout_s), tool=tool, unwrap=True)


def server_processes(script: str) -> list[psutil.Process]:
    """This process's stdio servers running ``script`` (the HTTP servers, started with --http, aside)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            argv = process.cmdline()
        except psutil.Error:
            continue
        if script in argv and "--http" not in argv:
            found.append(process)
    return found


# ---- third-party servers from PyPI, over stdio ----------------------------------------------------


def test_mcp_server_time_from_pypi_answers_over_stdio() -> None:
    with sessions_for({"time": third_party("mcp-server-time", "--local-timezone", "UTC")}) as sessions:
        [(tools, up)] = sessions.listings().values()
        assert up and {t.name for t in tools} == {"get_current_time", "convert_time"}
        converted = value(
            sessions,
            "time",
            "convert_time",
            source_timezone="Asia/Tokyo",
            time="12:00",
            target_timezone="UTC",
        )
        assert converted["target"]["datetime"][11:16] == "03:00" and converted["time_difference"] == "-9.0h"
        with pytest.raises(ToolError, match="Invalid timezone"):
            value(sessions, "time", "get_current_time", timezone="Mars/Olympus_Mons")


def test_mcp_server_git_from_pypi_reads_a_repository_the_test_made(git_repo: Path) -> None:
    with sessions_for({"git": third_party("mcp-server-git", "--repository", str(git_repo))}) as sessions:
        assert sessions.is_up("git"), sessions.status()
        log = value(sessions, "git", "git_log", repo_path=str(git_repo))
        assert "Add the orders module" in str(log) and "First commit: a README" in str(log)


# ---- the tests' server over streamable HTTP -----------------------------------------------------------


@pytest.fixture(scope="module")
def lab(lab_http: HttpServer) -> Iterator[McpSessions]:
    with sessions_for({"lab": {"url": lab_http.url, "maxMessageBytes": 1024**2}}) as sessions:
        assert sessions.is_up("lab"), sessions.status()
        yield sessions


def test_http_structured_output_image_and_error_results(lab: McpSessions) -> None:
    assert value(lab, "lab", "stats", numbers=[1, 2, 6]) == {"count": 3, "mean": 3.0, "max": 6.0}
    image = value(lab, "lab", "chart", width=3, height=1)
    assert image["type"] == "image" and image["mime_type"] == "image/png"
    import base64

    assert base64.b64decode(image["data"]).startswith(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(ToolError, match="failed on purpose: because"):
        value(lab, "lab", "fail", reason="because")


def test_http_calls_from_many_threads_run_concurrently_on_one_session(lab: McpSessions) -> None:
    results: list[str] = []
    began = time.monotonic()
    threads = [
        threading.Thread(target=lambda: results.append(value(lab, "lab", "wait", seconds=1.0)))
        for _ in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - began
    assert len(results) == 6 and all(r.startswith("slept ") for r in results), results
    # counted, not timed: one after another, each wait would have seen only itself sleeping
    assert max(int(r.split("; ")[1].split()[0]) for r in results) >= 2, results
    assert took < 30, f"six 1-second calls took {took:.1f} s"


def test_http_a_slow_call_times_out_and_the_session_carries_on(lab: McpSessions) -> None:
    began = time.monotonic()
    with pytest.raises(TimeoutError, match=r"MCP server 'lab' did not answer wait within 0\.5 s"):
        value(lab, "lab", "wait", timeout_s=0.5, seconds=30)
    assert time.monotonic() - began < 15  # cut at 0.5 s, not after the call's 30 s
    assert value(lab, "lab", "stats", numbers=[2]) == {"count": 1, "mean": 2.0, "max": 2.0}


def test_http_a_huge_answer_is_a_bounded_error(lab: McpSessions) -> None:
    before = psutil.Process().memory_info().rss
    began = time.monotonic()
    with pytest.raises(ToolServerError) as refused:
        value(lab, "lab", "huge", megabytes=8)
    assert time.monotonic() - began < 10
    assert "'lab'" in str(refused.value) and "1048576" in str(refused.value), str(refused.value)
    assert psutil.Process().memory_info().rss - before < 64 * 1024**2
    assert wait_until(lambda: lab.is_up("lab"))
    assert value(lab, "lab", "huge", megabytes=0) == ""


def test_http_server_refusals_are_tool_errors(lab: McpSessions) -> None:
    with pytest.raises(ToolError, match="Unknown tool: no_such_tool"):
        value(lab, "lab", "no_such_tool")


# ---- the tests' server over stdio: crashes, garbage, huge lines ------------------------------------------


def test_stdio_a_crash_mid_call_fails_that_call_and_the_server_is_restarted(lab_stdio: McpSessions) -> None:
    [before] = server_processes(str(LAB))
    with pytest.raises(ToolServerError) as crashed:
        value(lab_stdio, "lab", "crash")
    message = str(crashed.value)
    assert "MCP server 'lab' failed during the call to crash" in message and "restarted" in message
    assert wait_until(lambda: lab_stdio.is_up("lab")), lab_stdio.status()
    [after] = server_processes(str(LAB))
    assert after.pid != before.pid
    assert value(lab_stdio, "lab", "stats", numbers=[4]) == {"count": 1, "mean": 4.0, "max": 4.0}
    assert [s.restarts for s in lab_stdio.status()] == [1]


def test_stdio_garbage_lines_do_not_break_the_session(lab_stdio: McpSessions) -> None:
    assert value(lab_stdio, "lab", "garbage") == "answered after the garbage"
    assert value(lab_stdio, "lab", "stats", numbers=[1]) == {"count": 1, "mean": 1.0, "max": 1.0}


@pytest.mark.parametrize(
    "kind, message",
    [
        ("version", "MCP server 'lab' answered garbled unreadably: malformed response"),
        ("shape", "MCP server 'lab' answered garbled with a malformed result: 3 validation errors"),
    ],
)
def test_stdio_a_garbled_answer_fails_its_call_at_once(
    lab_stdio: McpSessions, kind: str, message: str
) -> None:
    began = time.monotonic()
    with pytest.raises(ToolServerError, match=message):
        value(lab_stdio, "lab", "garbled", timeout_s=30, kind=kind)
    assert time.monotonic() - began < 15, "answered from the malformed line, not after the 30 s timeout"
    assert value(lab_stdio, "lab", "stats", numbers=[3]) == {"count": 1, "mean": 3.0, "max": 3.0}


def test_stdio_a_line_past_the_limit_ends_the_connection_boundedly(lab_stdio: McpSessions) -> None:
    before = psutil.Process().memory_info().rss
    with pytest.raises(ToolServerError, match=r"more than 1048576 bytes \(maxMessageBytes\)"):
        value(lab_stdio, "lab", "huge", megabytes=50)
    assert psutil.Process().memory_info().rss - before < 64 * 1024**2
    assert wait_until(lambda: lab_stdio.is_up("lab"))
    assert value(lab_stdio, "lab", "huge", megabytes=0) == ""


def test_stdio_env_reaches_the_server_and_nothing_else_of_the_workers(
    lab_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDFLEET_TEST_WORKER_SECRET", "the-workers-own")  # set before the server starts
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-workers-own")
    with sessions_for(
        {"lab": stdio(LAB, "--data", str(lab_data), env={"LAB_SECRET": "only-for-the-lab"})}
    ) as lab:
        assert value(lab, "lab", "secret_env", name="LAB_SECRET") == "only-for-the-lab"
        assert value(lab, "lab", "secret_env", name="SANDFLEET_TEST_WORKER_SECRET") == ""
        assert value(lab, "lab", "secret_env", name="OPENAI_API_KEY") == ""
        assert value(lab, "lab", "secret_env", name="PATH") != ""  # the SDK's safe defaults do pass


def test_stop_ends_every_stdio_server(lab_data: Path) -> None:
    sessions = sessions_for(
        {"a": stdio(LAB, "--data", str(lab_data)), "b": stdio(LAB, "--data", str(lab_data))}
    )
    sessions.start()
    processes = server_processes(str(LAB))
    assert len(processes) == 2
    sessions.stop()
    assert wait_until(
        lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes), 5
    )


# ---- servers that are down ----------------------------------------------------------------------------


def test_a_server_that_is_down_is_reported_with_the_fix_and_its_calls_fail_naming_it() -> None:
    servers = {"gone": {"command": "/no/such/mcp-server"}, "closed": {"url": "http://127.0.0.1:9/mcp"}}
    with sessions_for(servers) as sessions:
        gone, closed = sessions.status()
        assert not gone.up and "cannot start '/no/such/mcp-server'" in gone.detail and "install" in gone.fix
        assert not closed.up and "cannot connect to http://127.0.0.1:9/mcp" in closed.detail
        assert "start the server at http://127.0.0.1:9/mcp" in closed.fix
        with pytest.raises(ToolServerError, match="MCP server 'gone' is down: cannot start"):
            sessions.call("gone", "x", {}, 5)
        # awaited, not slept for: the first retry comes after 0.2 s (FAST_BACKOFF)
        assert wait_until(lambda: sessions.status()[0].restarts >= 1), "retried with backoff"
