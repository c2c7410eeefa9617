"""Programs in real sandboxes calling MCP tools through the bridge, beside Python tools.

The servers are real: mcp-server-time and mcp-server-git from PyPI over stdio, the tests' lab server
over streamable HTTP and the odd server over stdio. Programs run through ProgramRuntime as a job's
would (the model is left out here; tests/mcp_tools/test_worker.py has the whole fleet).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandfleet_testing import program

from sandfleet.core.config import CodeActionSettings, SandboxConfig
from sandfleet.worker.mcp.catalog import ToolCatalog
from sandfleet.worker.mcp.config import parse_mcp_config
from sandfleet.worker.mcp.sessions import McpSessions
from sandfleet.worker.tools.registry import ToolRegistry

from .helpers import ODD, HttpServer, make_repo, stdio, third_party


def add(a: int, b: int = 0) -> dict:
    """A Python tool beside the MCP ones."""
    return {"sum": a + b}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The git repository the git server works on."""
    return make_repo(tmp_path_factory.mktemp("git") / "repo")


@pytest.fixture(scope="module")
def sessions(lab_http: HttpServer, repo: Path) -> Iterator[McpSessions]:
    servers = {
        "time": third_party("mcp-server-time", "--local-timezone", "UTC"),
        "git": third_party("mcp-server-git", "--repository", str(repo)),
        "lab": {"url": lab_http.url, "sideEffects": ["record"], "maxMessageBytes": 4 * 1024**2},
        "odd": stdio(ODD),
    }
    config = parse_mcp_config(json.dumps({"mcpServers": servers}))
    with McpSessions(config) as started:
        assert all(s.up for s in started.status()), started.status()
        yield started


@pytest.fixture(scope="module")
def registry(sessions: McpSessions) -> ToolRegistry:
    return ToolCatalog(ToolRegistry.from_functions([add], module="tests"), sessions).registry()


def run(
    pool: Any, registry: ToolRegistry, source: str, tools: list[str] | None = None, **settings: Any
) -> Any:
    from sandfleet.worker.program.runtime import ProgramRuntime

    settings.setdefault("exec_timeout", 60)
    return ProgramRuntime(pool, registry).run(
        program(source),
        config=SandboxConfig(),
        settings=CodeActionSettings(**settings),
        tools=tools,
        job_id=f"mcp-{uuid.uuid4().hex[:8]}",
    )


def test_the_pypi_servers_tools_are_called_from_a_sandboxed_program(
    pool: Any, registry: ToolRegistry, sessions: McpSessions, repo: Path
) -> None:
    done = run(
        pool,
        registry,
        f"""
        import json
        from sandfleet_tools import *
        tokyo_noon = time__convert_time(source_timezone="Asia/Tokyo", time="12:00", target_timezone="UTC")
        log = git__git_log({str(repo)!r}, max_count=5)
        print("RESULT: " + json.dumps([tokyo_noon["target"]["datetime"][11:16], log, add(1, 2)]))
        """,
        tools=["time__convert_time", "git__git_log", "add"],
    )
    assert done.ok, (done.failure(), done.stderr)
    utc, log, total = done.result
    assert utc == "03:00" and total == {"sum": 3}
    assert "Add the orders module" in json.dumps(log) and "First commit: a README" in json.dumps(log)
    assert [c.tool for c in done.tool_calls] == ["time__convert_time", "git__git_log", "add"]
    assert all(c.ok for c in done.tool_calls)


def test_structured_image_and_error_results_arrive_as_the_program_expects(
    pool: Any, registry: ToolRegistry
) -> None:
    done = run(
        pool,
        registry,
        """
        import base64, json
        from sandfleet_tools import lab__stats, lab__chart, lab__fail, ToolError
        stats = lab__stats([1.5, 2.5, 8])
        image = lab__chart(width=4, height=2)
        png = base64.b64decode(image["data"])
        try:
            lab__fail("no reason")
            caught = None
        except ToolError as e:
            caught = [type(e).__name__, str(e)]
        print("RESULT: " + json.dumps([stats, image["mime_type"], png[:8].hex(), caught]))
        """,
    )
    assert done.ok, (done.failure(), done.stderr)
    stats, mime, magic, caught = done.result
    assert stats == {"count": 3, "mean": 4.0, "max": 8.0}
    assert mime == "image/png" and magic == "89504e470d0a1a0a"
    assert caught == [
        "ToolError",
        "lab__fail failed: Error executing tool fail: failed on purpose: no reason",
    ]
    failed = done.tool_calls[-1]
    assert failed.tool == "lab__fail" and not failed.ok and failed.error_type == "ToolError"


def test_calls_from_the_programs_threads_are_served_concurrently(pool: Any, registry: ToolRegistry) -> None:
    done = run(
        pool,
        registry,
        """
        import json, threading, time
        from sandfleet_tools import lab__wait, add
        answers = []
        def call(i):
            answers.append(lab__wait(1.0) if i % 2 else add(i)["sum"])
        began = time.monotonic()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for t in threads: t.start()
        for t in threads: t.join()
        print("RESULT: " + json.dumps([time.monotonic() - began, sorted(map(str, answers))]))
        """,
    )
    assert done.ok, (done.failure(), done.stderr)
    took, answers = done.result
    slept = [a for a in answers if a.startswith("slept ")]
    assert len(answers) == 8 and len(slept) == 4, answers
    # counted, not timed: served one by one, each wait would have seen only itself sleeping
    assert max(int(a.split("; ")[1].split()[0]) for a in slept) >= 2, answers
    assert took < 30, f"4 one-second MCP calls and 4 Python calls took {took:.1f} s"
    assert sorted(c.seq for c in done.tool_calls) == list(range(1, 9))


def test_a_slow_mcp_call_is_cut_at_the_jobs_per_call_timeout(pool: Any, registry: ToolRegistry) -> None:
    began = time.monotonic()
    done = run(
        pool,
        registry,
        """
        import json
        from sandfleet_tools import lab__wait, lab__stats
        try:
            lab__wait(30)
            outcome = "returned"
        except TimeoutError as e:
            outcome = str(e)
        print("RESULT: " + json.dumps([outcome, lab__stats([1])["count"]]))
        """,
        tool_timeout=1.0,
    )
    assert done.ok, (done.failure(), done.stderr)
    assert done.result == ["MCP server 'lab' did not answer wait within 1 s", 1]
    assert time.monotonic() - began < 15
    assert done.tool_calls[0].error_type == "TimeoutError"


def test_a_slow_python_tool_is_cut_at_the_same_timeout(pool: Any, sessions: McpSessions) -> None:
    def nap(seconds: float) -> str:
        """Sleep on the host."""
        time.sleep(seconds)
        return "woke"

    registry = ToolCatalog(ToolRegistry.from_functions([nap, add]), sessions).registry()
    done = run(
        pool,
        registry,
        """
        import json
        from sandfleet_tools import nap, add
        try:
            nap(5)
            outcome = "returned"
        except TimeoutError as e:
            outcome = str(e)
        print("RESULT: " + json.dumps([outcome, add(2)["sum"]]))
        """,
        tools=["nap", "add"],
        tool_timeout=0.5,
    )
    assert done.ok, (done.failure(), done.stderr)
    outcome, total = done.result
    assert outcome.startswith("tool nap did not return within 0.5 s (the per-call timeout)") and total == 2
    assert [(c.tool, c.ok, c.error_type) for c in done.tool_calls] == [
        ("nap", False, "TimeoutError"),
        ("add", True, None),
    ]


def test_huge_results_are_refused_by_the_bridges_limit_and_the_servers(
    pool: Any, registry: ToolRegistry
) -> None:
    done = run(
        pool,
        registry,
        """
        import json
        from sandfleet_tools import lab__huge, ToolError
        out = []
        for megabytes in (1, 6):
            try:
                out.append(len(lab__huge(megabytes)))
            except (ValueError, ToolError) as e:
                out.append([type(e).__name__, str(e)])
        out.append(len(lab__huge(0)))
        print("RESULT: " + json.dumps(out))
        """,
        max_response_bytes=1024**2,
    )
    assert done.ok, (done.failure(), done.stderr)
    bridge_limit, server_limit, small = done.result
    assert bridge_limit[0] == "ValueError" and "more than the 1048576-byte limit" in bridge_limit[1]
    assert server_limit == [
        "ToolServerError",
        "MCP server 'lab' answered huge unreadably: Failed to parse JSON response: "
        "it answered with more than 4194304 bytes (maxMessageBytes)",
    ]
    assert small == 0


def test_names_python_lacks_and_nested_schemas_work_and_are_checked_on_the_host(
    pool: Any, registry: ToolRegistry
) -> None:
    done = run(
        pool,
        registry,
        """
        import json
        from sandfleet_tools import odd__get_weather_now, odd__book, odd__search, lab__search
        out = [
            odd__get_weather_now("Oslo", from_="2026-01-01", user_id=7, p_2fa=False),
            odd__book({"name": "Ana", "address": {"zip": "12345"}}, 2),
            odd__search("x")["tool"], lab__search("x"),
        ]
        for args in ([{"name": "Ana", "address": {"zip": "12"}}, 2], [{"name": "Ana"}, 2], [{"name": "Ana", "address": {"zip": "12345"}}, "2"]):
            try:
                odd__book(*args)
            except (TypeError, ValueError) as e:
                out.append([type(e).__name__, str(e)])
        try:
            odd__get_weather_now(city="Oslo", colour="red")
        except TypeError as e:
            out.append(str(e))
        print("RESULT: " + json.dumps(out))
        """,
    )
    assert done.ok, (done.failure(), done.stderr)
    weather, booked, odd_search, lab_search, bad_zip, no_address, bad_nights, unexpected = done.result
    assert weather == {
        "tool": "get-weather.now",
        "arguments": {"city": "Oslo", "from": "2026-01-01", "user-id": 7, "2fa": False},
    }
    assert booked["arguments"] == {"guest": {"name": "Ana", "address": {"zip": "12345"}}, "nights": 2}
    assert (odd_search, lab_search) == ("search", "lab found x")
    assert bad_zip == [
        "ValueError",
        "odd__book(): argument guest['address']['zip']: '12' does not match '^[0-9]{5}$'",
    ]
    assert no_address == ["ValueError", "odd__book(): argument guest: 'address' is a required property"]
    assert bad_nights == ["TypeError", "odd__book(): argument nights: '2' is not of type 'integer'"]
    assert unexpected == "odd__get_weather_now() got an unexpected keyword argument 'colour'"
    refused = [c for c in done.tool_calls if not c.ok]
    assert len(refused) == 4, "the refused calls are recorded, and none reached the server"


def test_the_prompt_shows_mcp_tools_like_python_tools(docker_engine: object, registry: ToolRegistry) -> None:
    text = registry.subset(["add", "git__git_log", "odd__get_weather_now"]).describe()
    assert text == (
        "add(a: int, b: int = 0) -> dict\n    A Python tool beside the MCP ones.\n"
        "git__git_log(repo_path: str, *, max_count: int = 10, start_timestamp: str | None = None, "
        "end_timestamp: str | None = None)\n    Shows the commit logs\n"
        "odd__get_weather_now(city: str, *, from_: str = None, user_id: int = None, p_2fa: bool = None, "
        "unit: Literal['C', 'F'] = 'C')\n    The weather now."
    )
