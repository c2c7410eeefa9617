"""Caps and limits of the bridge, and hostile programs: the host enforces them whatever the program does."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from sandfleet_testing import FIND_BRIDGE_FDS

from . import bridge_tools
from .helpers import program

# Program-side helpers for speaking the protocol by hand: find the bridge pipes through /proc (the stub
# pops SANDFLEET_BRIDGE_FDS from the environment), frame a request, read a reply.
RAW = (
    program("""
    import fcntl, json, os, struct
""")
    + FIND_BRIDGE_FDS
    + program("""
    def read_exactly(fd, n):
        data = b""
        while len(data) < n:
            chunk = os.read(fd, n - len(data))
            if not chunk:
                raise EOFError("bridge closed")
            data += chunk
        return data

    def read_reply(fd):
        (n,) = struct.unpack("!I", read_exactly(fd, 4))
        return json.loads(read_exactly(fd, n))

    def raw_call(send, recv, tool, args):
        body = json.dumps({"id": 1, "tool": tool, "args": args, "kwargs": {}}).encode()
        os.write(send, struct.pack("!I", len(body)) + body)
        reply = read_reply(recv)
        return reply["value"] if reply.get("ok") else [reply.get("type"), reply.get("message")]
""")
)


def vm_hwm_bytes() -> int:
    """Peak resident memory of this (test) process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


# ---- the call budget ---------------------------------------------------------------------------------


def test_budget_counts_every_call_failed_and_unknown_included(run: Any) -> None:
    source = program("""
        import json
        import sandfleet_tools
        from sandfleet_tools import add
        out = []
        def attempt(call):
            try:
                call()
                out.append("ok")
            except Exception as e:
                out.append(f"{type(e).__name__}: {e}")
        for _ in range(20):
            attempt(lambda: add(1))
        for _ in range(10):
            attempt(lambda: add())  # wrong arity
        for _ in range(10):
            attempt(lambda: sandfleet_tools._call("nope", [], {}))  # unknown tool
        for _ in range(12):
            attempt(lambda: add(1))
        print("RESULT: " + json.dumps(out))
    """)

    done = run(source)  # max_tool_calls defaults to 50

    assert done.ok, (done.failure(), done.stderr)
    assert done.result[:20] == ["ok"] * 20
    assert all(r.startswith("TypeError") for r in done.result[20:30])
    assert all(r.startswith("NameError") for r in done.result[30:40])
    assert done.result[40:50] == ["ok"] * 10
    assert done.result[50:] == ["ToolBudgetExceededError: tool-call budget of 50 exceeded"] * 2
    assert len(done.tool_calls) == 52 and "tool_calls" in done.limits_hit


def test_budget_exceeded_uncaught_is_the_runs_failure(run: Any) -> None:
    source = program("""
        from sandfleet_tools import add
        for _ in range(4):
            add(1)
        print("RESULT: never")
    """)

    done = run(source, max_tool_calls=3)

    assert not done.ok and done.exit_code == 1 and not done.result_found
    assert "tool-call budget of 3 exceeded" in done.stderr
    assert "tool-call budget" in done.failure()


HOSTILE = {
    # The program resets the stub's own counter before every call.
    "reset_counter": """
        import sandfleet_tools
        from sandfleet_tools import add
        def call():
            sandfleet_tools._seq = 0
            return add(1)
    """,
    # The program replaces the stub's _call with its own, speaking the protocol on the stub's fds.
    "own_call": """
        import sandfleet_tools
        def my_call(name, args, kwargs):
            return raw_call(sandfleet_tools._SEND, sandfleet_tools._RECV, name, list(args))
        sandfleet_tools._call = my_call
        def call():
            return my_call("add", [1], {})
    """,
    # The program never imports the stub: it finds the pipes in /proc/self/fd and writes frames itself.
    "raw_fds": """
        import os
        assert "SANDFLEET_BRIDGE_FDS" in os.environ
        del os.environ["SANDFLEET_BRIDGE_FDS"]
        SEND, RECV = bridge_fds()
        def call():
            return raw_call(SEND, RECV, "add", [1])
    """,
}


@pytest.mark.parametrize("trick", list(HOSTILE))
def test_rewritten_stub_or_raw_frames_cannot_lift_the_cap(run: Any, trick: str) -> None:
    source = (
        RAW
        + program(HOSTILE[trick])
        + program("""
            out = []
            for _ in range(8):
                try:
                    out.append(call())
                except Exception as e:
                    out.append([type(e).__name__, str(e)])
            print("RESULT: " + json.dumps(out))
        """)
    )

    done = run(source, max_tool_calls=5)

    assert done.ok, (done.failure(), done.stderr)
    assert done.result[:5] == [{"sum": 2}] * 5
    assert done.result[5:] == [["ToolBudgetExceededError", "tool-call budget of 5 exceeded"]] * 3
    assert [c.ok for c in done.tool_calls] == [True] * 5 + [False] * 3
    assert "tool_calls" in done.limits_hit


# ---- malformed, truncated, oversized and flooding traffic ----------------------------------------------

GARBAGE = {
    # Random bytes (seeded: the first four claim a length far above the request limit).
    "random_bytes": """
        import random
        os.write(SEND, random.Random(7).randbytes(20_000))
        os.close(SEND)
        print("RESULT: " + json.dumps("alive"))
    """,
    # A frame cut short: the length says 100, 10 bytes follow, then the pipe is closed.
    "truncated_frame": """
        os.write(SEND, struct.pack("!I", 100) + b'{"tool": "')
        os.close(SEND)
        print("RESULT: " + json.dumps("alive"))
    """,
    # A length prefix claiming 2 GB: refused at once, without waiting for (or keeping) the body.
    "claims_2gb": """
        os.write(SEND, struct.pack("!I", 2 * 1024**3) + b"x" * 1000)
        reply = read_reply(RECV)
        print("RESULT: " + json.dumps([reply["type"], reply["message"]]))
    """,
    # A well-framed body that is not JSON, then a proper call on the same channel.
    "not_json": """
        os.write(SEND, struct.pack("!I", 6) + b"\\xff\\xfe{{{{")
        reply = read_reply(RECV)
        print("RESULT: " + json.dumps([reply["type"], reply["message"], raw_call(SEND, RECV, "add", [1])]))
    """,
}


@pytest.mark.parametrize("kind", list(GARBAGE))
def test_garbage_on_the_channel_ends_the_run_cleanly(run: Any, kind: str) -> None:
    source = RAW + "SEND, RECV = bridge_fds()\n" + program(GARBAGE[kind])

    done = run(source, exec_timeout=10)

    assert not done.timed_out and done.error is None, (done.failure(), done.stderr)
    assert done.ok, (done.failure(), done.stderr)
    [first, *_] = done.tool_calls
    assert not first.ok
    if kind == "random_bytes":
        assert done.result == "alive"
        assert first.error_type == "ValueError" and "exceeds the 1048576-byte limit" in first.error
    elif kind == "truncated_frame":
        assert done.result == "alive"
        assert first.error_type == "ConnectionError" and "truncated request" in first.error
    elif kind == "claims_2gb":
        assert done.result == [
            "ValueError",
            f"tool request of {2 * 1024**3} bytes exceeds the 1048576-byte limit",
        ]
    else:
        assert done.result[0] == "ValueError" and "malformed tool request" in done.result[1]
        assert done.result[2] == {"sum": 2}

    after = run("from sandfleet_tools import add\nprint('RESULT:', add(40, 2)['sum'])")  # the next run works
    assert after.ok and after.result == 42


def test_flooding_requests_without_reading_replies_ends_at_the_deadline(run: Any) -> None:
    # The replies fill the program's reply pipe, the agent blocks writing them and stops reading the
    # host: the host's own deadline must still end the run (it once waited per buffered frame).
    source = RAW + program("""
        SEND, RECV = bridge_fds()
        body = json.dumps({"id": 1, "tool": "add", "args": [1], "kwargs": {}}).encode()
        frame = struct.pack("!I", len(body)) + body
        while True:
            os.write(SEND, frame * 100)
    """)

    began = time.monotonic()
    done = run(source, exec_timeout=3)

    assert done.timed_out and not done.ok and "timed out" in done.failure()
    assert time.monotonic() - began < 3 + 10
    assert "tool_calls" in done.limits_hit
    after = run("from sandfleet_tools import add\nprint('RESULT:', add(40, 2)['sum'])")
    assert after.ok and after.result == 42


def test_a_100_mb_request_is_refused_and_host_memory_stays_bounded(run: Any) -> None:
    before = vm_hwm_bytes()
    source = program("""
        import json
        from sandfleet_tools import add, echo
        try:
            echo("x" * 100_000_000)
            outcome = "sent"
        except Exception as e:
            outcome = [type(e).__name__, str(e)]
        print("RESULT: " + json.dumps([outcome, add(1)]))
    """)

    done = run(source, exec_timeout=60)

    assert done.ok, (done.failure(), done.stderr)
    outcome, after_call = done.result
    assert outcome[0] == "ValueError"
    assert "exceeds the 1048576-byte limit" in outcome[1] and "100000" in outcome[1]
    assert after_call == {"sum": 2}, "the channel is still in step after the refusal"
    grown = vm_hwm_bytes() - before
    assert grown < 200 * 1024**2, f"the test process's peak memory grew by {grown / 1024**2:.0f} MB"


def test_ten_thousand_calls_complete(run: Any) -> None:
    source = program("""
        from sandfleet_tools import add
        total = 0
        for i in range(10_000):
            total += add(i, b=0)["sum"]
        print("RESULT:", total)
    """)

    done = run(source, max_tool_calls=20_000, exec_timeout=240)  # slow only on a crowded host

    assert done.ok, (done.failure(), done.stderr)
    assert done.result == sum(range(10_000))
    assert len(done.tool_calls) == 10_000 and all(c.ok for c in done.tool_calls)


def test_a_response_over_the_limit_is_a_clear_error(run: Any) -> None:
    source = program("""
        import json
        from sandfleet_tools import big_text
        try:
            big_text(2 * 1024 * 1024)
            outcome = "received"
        except Exception as e:
            outcome = [type(e).__name__, str(e)]
        print("RESULT: " + json.dumps([outcome, len(big_text(1000))]))
    """)

    done = run(source, max_response_bytes=1024**2)

    assert done.ok, (done.failure(), done.stderr)
    outcome, small = done.result
    assert outcome[0] == "ValueError"
    assert "tool big_text returned" in outcome[1] and "more than the 1048576-byte limit" in outcome[1]
    assert small == 1000
    assert not done.tool_calls[0].ok and done.tool_calls[1].ok


@pytest.mark.parametrize("n_rows", [500, 100_000])
def test_large_results_cross(run: Any, n_rows: int) -> None:
    expected = bridge_tools.rows(n_rows)
    source = program(f"""
        import json, hashlib
        from sandfleet_tools import rows
        got = rows({n_rows})
        digest = hashlib.sha256(json.dumps(got, sort_keys=True).encode()).hexdigest()
        print("RESULT: " + json.dumps([len(got), got[-1], digest]))
    """)

    done = run(source, exec_timeout=60)

    assert done.ok, (done.failure(), done.stderr)
    import hashlib

    digest = hashlib.sha256(json.dumps(expected, sort_keys=True).encode()).hexdigest()
    assert done.result == [n_rows, expected[-1], digest]
    if n_rows == 100_000:
        assert done.tool_calls[0].result_size > 10_000_000
