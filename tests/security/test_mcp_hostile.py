"""Hostile MCP traffic, for real: a program reaching for MCP tools it was not given, a server that
crashes mid-call, tool and argument names that are not Python identifiers, nested schemas abused,
a server answering garbage or megabytes, and the servers' secrets.

The servers are the tests' own (tests/mcp_tools/servers, written with the SDK's server classes) run
over stdio by the worker's MCP sessions; programs run in real sandboxes through ProgramRuntime under
runc (the MCP side is host code, the same whatever the runtime). Outcomes go to
``artifacts/security-results.json`` (SECURITY.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from mcp_tools.helpers import LAB, ODD, stdio
from sandfleet_testing import FIND_BRIDGE_FDS

from .helpers import program, record, vm_hwm_kib

RUNTIME = "runc"
SECRET = "lab-secret-9d2e"


@pytest.fixture(scope="module")
def lab_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sandfleet.worker.tools.examples.scenario import write_reference_data

    folder = tmp_path_factory.mktemp("lab")
    write_reference_data(folder)
    return folder


@pytest.fixture(scope="module")
def sessions(lab_data: Path) -> Iterator[Any]:
    from sandfleet.worker.mcp.config import parse_mcp_config
    from sandfleet.worker.mcp.sessions import McpSessions

    servers = {
        "lab": stdio(LAB, "--data", str(lab_data), env={"LAB_SECRET": SECRET}, maxMessageBytes=1024**2),
        "odd": stdio(ODD),
    }
    config = parse_mcp_config(json.dumps({"mcpServers": servers}))
    with McpSessions(config, backoff_start_s=0.2, backoff_max_s=1.0) as started:
        assert all(s.up for s in started.status()), started.status()
        yield started


@pytest.fixture
def go(run: Callable[..., Any], sessions: Any) -> Callable[..., Any]:
    from sandfleet.worker.mcp.catalog import ToolCatalog
    from sandfleet.worker.tools.registry import ToolRegistry

    def run_one(source: str, tools: list[str], **settings: Any) -> Any:
        registry = ToolCatalog(ToolRegistry(), sessions).registry()
        settings.setdefault("exec_timeout", 60)
        return run(program(source), RUNTIME, registry=registry, tools=tools, **settings)

    return run_one


def notes(lab_data: Path) -> list[str]:
    path = lab_data / "notes.log"
    return path.read_text().splitlines() if path.exists() else []


RAW = (
    program(
        """
    import fcntl, json, os, struct
    os.environ.pop("SANDFLEET_BRIDGE_FDS", None)
    """
    )
    + FIND_BRIDGE_FDS
    + program(
        """
    SEND, RECV = bridge_fds()
    def request(req):
        body = json.dumps(req).encode()
        os.write(SEND, struct.pack("!I", len(body)) + body)
        (n,) = struct.unpack("!I", os.read(RECV, 4))
        data = b""
        while len(data) < n:
            data += os.read(RECV, n - len(data))
        return json.loads(data)
    """
    )
)


def test_mcp_tools_outside_the_allow_list_are_refused_and_never_reach_the_server(
    go: Callable[..., Any], lab_data: Path
) -> None:
    before = notes(lab_data)
    source = RAW + program(
        """
        out = {}
        out["stub, not allowed"] = request({"id": 1, "tool": "lab__record", "args": ["via raw frame"], "kwargs": {}})
        out["server's own name"] = request({"id": 2, "tool": "record", "args": ["by its name"], "kwargs": {}})
        out["other server's odd name"] = request({"id": 3, "tool": "get-weather.now", "args": ["Oslo"], "kwargs": {}})
        out["allowed"] = request({"id": 4, "tool": "lab__stats", "args": [[1, 2]], "kwargs": {}})
        print("RESULT: " + json.dumps(out))
        """
    )

    done = go(source, tools=["lab__stats"])

    assert done.ok, (done.failure(), done.stderr)
    r = done.result
    for case in ("stub, not allowed", "server's own name", "other server's odd name"):
        assert r[case]["type"] == "NameError" and "allowed tools: lab__stats" in r[case]["message"], r[case]
    assert r["allowed"]["ok"] and r["allowed"]["value"] == {"count": 2, "mean": 1.5, "max": 2.0}
    assert notes(lab_data) == before, "lab__record never ran"
    record(
        "MCP: tools outside the allow-list (raw frames; the server's own and odd names)",
        RUNTIME,
        True,
        "NameError on the host for lab__record, record, get-weather.now; the server's notes unchanged",
    )


def test_a_server_crashing_mid_call_fails_that_call_only_and_is_restarted(
    go: Callable[..., Any], sessions: Any
) -> None:
    [before] = [p for p in psutil.Process().children(recursive=True) if str(LAB) in p.cmdline()]
    source = """
        import json, threading, time
        from sandfleet_tools import lab__crash, odd__search, lab__stats, ToolError
        out = {}
        def other():
            out["odd meanwhile"] = odd__search("still here")["arguments"]
        t = threading.Thread(target=other)
        t.start()
        try:
            lab__crash()
            out["crash"] = "returned"
        except ToolError as e:
            out["crash"] = [type(e).__name__, str(e)]
        t.join()
        for _ in range(100):  # the server comes back within its backoff
            try:
                out["after"] = lab__stats([5])
                break
            except ToolError as e:
                out["while restarting"] = type(e).__name__
                time.sleep(0.1)
        print("RESULT: " + json.dumps(out))
    """

    done = go(source, tools=["lab__crash", "odd__search", "lab__stats"])

    assert done.ok, (done.failure(), done.stderr)
    r = done.result
    kind, message = r["crash"]
    assert kind == "ToolServerError" and "MCP server 'lab' failed during the call to crash" in message
    assert "exited with code 3" in message and "restarted" in message
    assert r["odd meanwhile"] == {"query": "still here"}
    assert r["after"] == {"count": 1, "mean": 5.0, "max": 5.0}
    [after] = [p for p in psutil.Process().children(recursive=True) if str(LAB) in p.cmdline()]
    assert after.pid != before.pid
    crash = next(c for c in done.tool_calls if c.tool == "lab__crash")
    assert not crash.ok and crash.error_type == "ToolServerError"
    record(
        "MCP: a stdio server crashing mid-call",
        RUNTIME,
        True,
        "that call: ToolServerError naming the server and exit code 3; a concurrent call to another "
        "server answered; the server restarted (new pid) and answered the program's next call",
    )


def test_names_that_are_not_identifiers_and_wire_names_cannot_slip_past_the_schema(
    go: Callable[..., Any],
) -> None:
    source = RAW + program(
        """
        out = {}
        out["renamed"] = request({"id": 1, "tool": "odd__get_weather_now", "args": ["Oslo"], "kwargs": {"from_": "x", "user_id": 3}})
        out["wire names"] = request({"id": 2, "tool": "odd__get_weather_now", "args": ["Oslo"], "kwargs": {"from": "x", "user-id": "3; drop"}})
        out["nested bad"] = request({"id": 3, "tool": "odd__book", "args": [{"name": "A", "address": {"zip": "1 OR 1=1"}}, 1], "kwargs": {}})
        out["nested extra"] = request({"id": 4, "tool": "odd__book", "args": [{"name": "A", "address": {"zip": "12345", "__proto__": {"admin": True}}}, 1], "kwargs": {}})
        out["deep"] = request({"id": 5, "tool": "odd__book", "args": [{"name": "A", "address": {"zip": "12345"}}, {"nested": [[[[1]]]]}], "kwargs": {}})
        print("RESULT: " + json.dumps(out))
        """
    )

    done = go(source, tools=["odd__get_weather_now", "odd__book"])

    assert done.ok, (done.failure(), done.stderr)
    r = done.result
    assert r["renamed"]["value"]["arguments"] == {"city": "Oslo", "from": "x", "user-id": 3}
    # The server's own names stand for the parameters made of them (how a tool-calling model names
    # them); their values are checked all the same: "user-id" must be an integer.
    assert r["wire names"]["type"] == "TypeError"
    assert "argument user_id: '3; drop' is not of type 'integer'" in r["wire names"]["message"]
    assert r["nested bad"]["type"] == "ValueError" and "guest['address']['zip']" in r["nested bad"]["message"]
    # Keys the schema does not forbid pass through as plain data, to the server that declared them.
    assert r["nested extra"]["ok"] and r["nested extra"]["value"]["arguments"]["guest"]["address"][
        "__proto__"
    ] == {"admin": True}
    assert r["deep"]["type"] == "TypeError" and "argument nights" in r["deep"]["message"]
    served = [c for c in done.tool_calls if c.ok]
    assert len(served) == 2, "only the two calls that fit the schema reached the server"
    record(
        "MCP: odd names and nested schemas from raw frames",
        RUNTIME,
        True,
        "get-weather.now callable as odd__get_weather_now; the server's own names (from, user-id) stand "
        "for the parameters and their values are checked; nested values checked on the host before the "
        "server (pattern, type)",
    )


def test_garbage_and_megabytes_from_a_server_are_bounded_errors(go: Callable[..., Any]) -> None:
    before = vm_hwm_kib()
    source = """
        import json
        from sandfleet_tools import lab__garbage, lab__garbled, lab__huge, lab__stats, ToolError
        out = {"garbage": lab__garbage()}
        for name, call in (("garbled", lambda: lab__garbled(kind="version")), ("huge", lambda: lab__huge(200))):
            try:
                call()
                out[name] = "returned"
            except ToolError as e:
                out[name] = [type(e).__name__, str(e)]
        import time
        for _ in range(100):
            try:
                out["after"] = lab__stats([1])
                break
            except ToolError:
                time.sleep(0.1)
        print("RESULT: " + json.dumps(out))
    """

    done = go(source, tools=["lab__garbage", "lab__garbled", "lab__huge", "lab__stats"], tool_timeout=30)

    grown_kib = vm_hwm_kib() - before
    assert done.ok, (done.failure(), done.stderr)
    r = done.result
    assert r["garbage"] == "answered after the garbage"
    assert r["garbled"][0] == "ToolServerError" and "unreadably: malformed response" in r["garbled"][1]
    assert r["huge"][0] == "ToolServerError" and "more than 1048576 bytes (maxMessageBytes)" in r["huge"][1]
    assert r["after"] == {"count": 1, "mean": 1.0, "max": 1.0}
    assert done.timings["run_s"] < 30, "no call waited for a timeout"
    assert grown_kib < 64 * 1024, (
        f"the worker's peak memory grew by {grown_kib / 1024:.0f} MiB for a 200 MB answer"
    )
    record(
        "MCP: garbage, a garbled answer and a 200 MB answer from a stdio server",
        RUNTIME,
        True,
        {
            "garbage line": "counted, the call answered",
            "garbled": r["garbled"][1],
            "huge": r["huge"][1],
            "host_peak_rss_growth_kib": grown_kib,
        },
    )


def test_a_servers_secrets_never_enter_the_sandbox(go: Callable[..., Any]) -> None:
    source = f"""
        import json, os
        from sandfleet_tools import lab__secret_env
        secret = {SECRET[::-1]!r}[::-1]  # reversed, so that this program's own text does not hold it
        seen = [k for k, v in os.environ.items() if secret in v]
        for root, _dirs, files in os.walk("/"):
            if root.startswith(("/proc", "/sys", "/dev")):
                continue
            for name in files:
                try:
                    with open(os.path.join(root, name), "rb") as f:
                        if secret.encode() in f.read(1 << 20):
                            seen.append(os.path.join(root, name))
                except OSError:
                    pass
        print("RESULT: " + json.dumps([seen, lab__secret_env("LAB_SECRET") == secret]))
    """

    done = go(source, tools=["lab__secret_env"])

    assert done.ok, (done.failure(), done.stderr)
    seen, server_has_it = done.result
    assert seen == [] and server_has_it is True
    record(
        "MCP: a server's env secret",
        RUNTIME,
        True,
        "in the server's environment only: not in the sandbox's environment or files (the stub included)",
    )


def test_concurrent_calls_cannot_exceed_the_budget(go: Callable[..., Any], lab_data: Path) -> None:
    before = len(notes(lab_data))
    source = """
        import json, threading
        from sandfleet_tools import lab__record
        outcomes = []
        def call(i):
            try:
                lab__record(f"thread {i}")
                outcomes.append("ok")
            except Exception as e:
                outcomes.append(type(e).__name__)
        threads = [threading.Thread(target=call, args=(i,)) for i in range(40)]
        for t in threads: t.start()
        for t in threads: t.join()
        print("RESULT: " + json.dumps(sorted(outcomes)))
    """

    done = go(source, tools=["lab__record"], max_tool_calls=10)

    assert done.ok, (done.failure(), done.stderr)
    assert done.result.count("ok") == 10 and done.result.count("ToolBudgetExceededError") == 30
    assert len(notes(lab_data)) - before == 10, "exactly the budget reached the server"
    record(
        "MCP: 40 concurrent calls against a budget of 10",
        RUNTIME,
        True,
        "10 ran on the server, 30 ToolBudgetExceededError; the budget is counted on arrival, on the host",
    )
