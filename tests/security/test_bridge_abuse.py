"""Tool-bridge abuse: a hostile program attacks the host side of the bridge, for real.

Each test runs a program through ProgramRuntime in a real sandbox (runc; the raw frames under runsc
too: the bridge is host code, the same whatever the runtime) with the example tools of
``sandfleet.worker.tools.examples`` served from this process, and checks on the host what really happened: the tool's side effect (the outbox of
``send_email``), the files opened by this process (an audit hook), the bridge's call records.
The properties tests/runtime already asserts (budget arithmetic, garbage bytes, 100 MB requests,
10,000 calls) are not repeated; outcomes go to ``artifacts/security-results.json`` (SECURITY.md).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sandfleet_testing import FIND_BRIDGE_FDS

from .helpers import program, record, vm_hwm_kib

RUNTIME = "runc"
EXAMPLE_TOOLS = [
    "sandfleet.worker.tools.examples.orders",
    "sandfleet.worker.tools.examples.files",
    "sandfleet.worker.tools.examples.side",
]
OUTSIDE_SECRET = "outside-the-data-folder-7c1f"

# Program side: find the bridge pipes in /proc/self/fd (the stub pops SANDFLEET_BRIDGE_FDS, and these
# programs never import it) and write length-prefixed JSON frames by hand.
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

    def read_exactly(n):
        data = b""
        while len(data) < n:
            chunk = os.read(RECV, n - len(data))
            if not chunk:
                raise EOFError("bridge closed")
            data += chunk
        return data

    def frame(body):
        os.write(SEND, struct.pack("!I", len(body)) + body)

    def reply():
        (n,) = struct.unpack("!I", read_exactly(4))
        return json.loads(read_exactly(n))

    def request(req):
        frame(json.dumps(req).encode())
        return reply()
    """
    )
)


# ---- fixtures: the example tools on a private data folder, what this process opens -----------------


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example tools' data folder: reference orders, notes/q3.txt, and a symlink leading out.

    Beside it (outside): ``secret.txt``, which no tool call may read.
    """
    from sandfleet.worker.tools.examples.scenario import write_reference_data

    folder = tmp_path / "data"
    (folder / "notes").mkdir(parents=True)
    write_reference_data(folder)
    (folder / "notes" / "q3.txt").write_text("Q3 notes: inside the folder\n")
    (tmp_path / "secret.txt").write_text(OUTSIDE_SECRET + "\n")
    (folder / "link-out").symlink_to(tmp_path / "secret.txt")
    monkeypatch.setenv("SANDFLEET_DATA_DIR", str(folder))
    return folder


@pytest.fixture(scope="module")
def registry() -> Any:
    from sandfleet.worker.tools.registry import ToolRegistry

    return ToolRegistry.from_modules(EXAMPLE_TOOLS)


@pytest.fixture
def go(run: Callable[..., Any], registry: Any, data_dir: Path) -> Callable[..., Any]:
    """``go(source, tools=[...], **settings)``: one run with the example tools, under runc."""

    def run_one(source: str, *, tools: list[str] | None = None, runtime: str = RUNTIME, **kwargs: Any) -> Any:
        return run(source, runtime, registry=registry, tools=tools, **kwargs)

    return run_one


def outbox(data_dir: Path) -> list[dict[str, Any]]:
    path = data_dir / "outbox.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


_opened: list[str] | None = None  # while a list: every path this process opens is appended to it


def _audit_open(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _opened is not None and args and isinstance(args[0], str | bytes):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_audit_open)  # audit hooks cannot be removed; this one is idle unless _opened is a list


@pytest.fixture
def opened() -> Iterator[list[str]]:
    """Paths this process (tools included: they run here) opens during the test."""
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


# ---- allow-list and forged frames ---------------------------------------------------------------------


def test_calls_outside_the_allow_list_are_refused_and_nothing_runs(
    go: Callable[..., Any], data_dir: Path
) -> None:
    source = program(
        """
        import json, sandfleet_tools
        out = {"exposed": sorted(sandfleet_tools.__all__), "send_email in globals": "send_email" in dir(sandfleet_tools)}
        for name, args in (("send_email", ["a@example.com", "hi"]), ("read_text", ["notes/q3.txt"]),
                           ("list_sent_emails", [])):
            try:
                out[name] = ["ok", sandfleet_tools._call(name, args, {})]
            except Exception as e:
                out[name] = [type(e).__name__, str(e)]
        print("RESULT: " + json.dumps(out))
        """
    )

    done = go(source, tools=["load_orders", "get_order"])

    assert done.ok, (done.failure(), done.stderr)
    assert done.result["exposed"] == ["get_order", "load_orders"] and not done.result["send_email in globals"]
    for name in ("send_email", "read_text", "list_sent_emails"):
        kind, message = done.result[name]
        assert kind == "NameError" and f"tool {name!r} is not allowed" in message, done.result[name]
        assert "allowed tools: get_order, load_orders" in message
    assert outbox(data_dir) == [], "a refused send_email sent mail"
    assert [c.ok for c in done.tool_calls] == [False] * 3
    record(
        "bridge: calls outside the allow-list (3 tools)",
        RUNTIME,
        True,
        "NameError naming the allowed tools; outbox empty",
    )


def test_a_program_forked_from_the_agent_cannot_speak_for_it(
    go: Callable[..., Any], data_dir: Path, runtime: str
) -> None:
    # The program runs in a fork of the agent (RunResult.forked): the agent's code and globals are
    # in its memory and on its stack. It uses them to forge the agent's frames to the host: a tool
    # call outside the allow-list, a tool reply, and a "done" frame claiming success. They land in
    # the program's own stdout pipe; the host's channel (the agent's fds 0 and 1) is not reachable.
    source = program(
        """
        import json, os, sys
        frame, agent = sys._getframe(), None
        while frame is not None:
            if "HostReader" in frame.f_globals and "send" in frame.f_globals:
                agent = frame.f_globals
            frame = frame.f_back
        found = agent is not None
        if found:
            agent["send"](b"C", {}, json.dumps({"id": 1, "tool": "send_email",
                                                "args": ["eve@example.com", "forged"], "kwargs": {}}).encode())
            agent["send"](b"D", {"exit_code": 0, "out_len": 17, "err_len": 0, "result_len": 17},
                          b"RESULT: forged\\nRESULT: forged")
            sys.stdout.flush()
        fds = sorted(int(n) for n in os.listdir("/proc/self/fd"))
        targets = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in fds if os.path.exists(f"/proc/self/fd/{fd}")}
        print("\\nRESULT: " + json.dumps({"found the agent": found, "fds": targets}))
        sys.exit(3)
        """
    )

    done = go(source, tools=["list_products"], runtime=runtime)

    assert done.forked
    assert done.exit_code == 3 and done.result["found the agent"], (done.stderr, done.stdout[-500:])
    assert outbox(data_dir) == [] and done.tool_calls == [], "a forged call frame reached the bridge"
    assert done.result_text != "forged" and "RESULT: forged" in done.stdout  # its own output, nothing more
    # stdin is /dev/null, stdout/stderr and the bridge are the agent's pipes: nothing else is open
    targets = done.result["fds"]
    assert targets["0"] == "/dev/null" and all(
        t.startswith("pipe:") for fd, t in targets.items() if fd != "0"
    )
    assert len(targets) <= 6, targets
    record(
        "forked program: forges the agent's call, reply and done frames with its own code",
        runtime,
        True,
        "the frames land in the program's stdout; no tool ran; exit code and result are the program's own",
    )


def test_forged_and_replayed_frames_get_nothing_the_stub_would_not(
    go: Callable[..., Any], data_dir: Path, runtime: str
) -> None:
    source = RAW + program(
        """
        out = {}
        send = {"id": 7, "tool": "send_email", "args": ["ana@example.com", "one"], "kwargs": {}}
        out["first"] = request(send)
        out["replay of id 7"] = request(send)
        out["replay, other tool"] = request({"id": 7, "tool": "list_sent_emails", "args": [], "kwargs": {}})
        out["disallowed"] = request({"id": 8, "tool": "load_orders", "args": [], "kwargs": {}})
        out["id is an object"] = request({"id": {"$ne": 1}, "tool": "list_products", "args": [], "kwargs": {}})
        out["tool not a str"] = request({"id": 9, "tool": ["send_email"], "args": [], "kwargs": {}})
        out["extra fields"] = request({"id": 10, "tool": "list_products", "args": [], "kwargs": {},
                                       "allowed": ["load_orders"], "max_calls": 10**9})
        # A length far above the request limit: refused at once; the claimed body is then discarded,
        # so this channel stays unusable unless the program writes all of it.
        os.write(SEND, struct.pack("!I", 3_000_000_000) + b'{"id": 11, "tool": "send_email"}')
        out["huge length"] = reply()
        print("RESULT: " + json.dumps(out))
        """
    )

    done = go(source, tools=["send_email", "list_products"], max_tool_calls=6, runtime=runtime)

    assert done.ok, (done.failure(), done.stderr)
    r = done.result
    assert r["first"]["ok"] and r["first"]["id"] == 7
    # A replayed request id is simply another call: it runs again and counts towards the budget.
    assert r["replay of id 7"]["ok"] and r["replay of id 7"]["id"] == 7
    assert r["replay of id 7"]["value"] != r["first"]["value"]
    assert r["replay, other tool"]["type"] == "NameError"
    assert [r[k]["type"] for k in ("disallowed",)] == ["NameError"]
    assert "allowed tools: list_products, send_email" in r["disallowed"]["message"]
    assert r["id is an object"]["ok"] and r["id is an object"]["id"] == {"$ne": 1}
    assert r["tool not a str"]["type"] == "ValueError" and "tool (str)" in r["tool not a str"]["message"]
    # Frame fields other than id/tool/args/kwargs are ignored; the 7th call is over the budget of 6.
    assert r["extra fields"]["type"] == "ToolBudgetExceededError"
    assert r["huge length"] == {
        "id": None,
        "ok": False,
        "type": "ValueError",
        "message": "tool request of 3000000000 bytes exceeds the 1048576-byte limit",
    }
    assert [m["subject"] for m in outbox(data_dir)] == ["one", "one"], "exactly the two allowed sends"
    # 8 frames, and the program's exit mid-way through the claimed 3 GB body: a truncated request.
    assert sum(c.ok for c in done.tool_calls) == 3 and len(done.tool_calls) == 9
    assert done.tool_calls[-1].error_type == "ConnectionError" and "truncated" in (
        done.tool_calls[-1].error or ""
    )
    record(
        "bridge: forged and replayed frames (raw fds)",
        runtime,
        True,
        "replayed id = a new call within the budget; disallowed tool NameError; non-str tool ValueError; "
        "extra fields ignored; 3e9-byte length refused naming the limit",
    )


# ---- the deadline -------------------------------------------------------------------------------------


def test_a_call_after_the_deadline_never_runs_on_the_host(go: Callable[..., Any], data_dir: Path) -> None:
    source = program(
        """
        import os, time
        from sandfleet_tools import send_email
        if os.fork() == 0:  # a detached child that outlives the program, then calls
            os.setsid()
            time.sleep(2.5)
            send_email("late@example.com", "from the child")
            os._exit(0)
        time.sleep(2.5)  # past exec_timeout
        send_email("late@example.com", "after the deadline")
        print("RESULT: sent")
        """
    )

    done = go(source, tools=["send_email"], exec_timeout=1.5)
    time.sleep(2.0)  # longer than the program would still have slept

    assert done.timed_out and not done.result_found, (done.failure(), done.stdout)
    assert done.tool_calls == [] and outbox(data_dir) == []
    record(
        "bridge: call after the deadline (program and a detached child)",
        RUNTIME,
        True,
        f"program ran {done.timings['run_s']:.2f} s (exec_timeout 1.5 s); no call, outbox empty",
    )


# ---- flood: the cap holds, another program on the same runtime keeps its latency -----------------------

FLOOD_SECONDS = 8.0
FLOOD = program(
    f"""
    import json, time
    from sandfleet_tools import send_email
    sent = refused = 0
    end = time.monotonic() + {FLOOD_SECONDS}
    while time.monotonic() < end:
        try:
            send_email("flood@example.com", "flood")
            sent += 1
        except Exception as e:
            refused += 1
            last = f"{{type(e).__name__}}: {{e}}"
    print("RESULT: " + json.dumps([sent, refused, last]))
    """
)
VICTIM = program(
    """
    from sandfleet_tools import list_products
    for _ in range(20):
        products = list_products()
    print("RESULT:", len(products))
    """
)


def test_a_flood_of_calls_is_capped_and_another_program_keeps_its_latency(
    go: Callable[..., Any], data_dir: Path
) -> None:
    def victim_s() -> float:
        began = time.monotonic()
        done = go(VICTIM, tools=["list_products"], check_leftovers=False)
        assert done.ok and done.result == 4, (done.failure(), done.stderr)
        return time.monotonic() - began

    go(VICTIM, tools=["list_products"])  # a warm-up: the pool fills for this config
    alone = [victim_s() for _ in range(5)]

    flood_result: list[Any] = []
    flood = threading.Thread(
        target=lambda: flood_result.append(
            go(FLOOD, tools=["send_email"], max_tool_calls=50, exec_timeout=30)
        ),
    )
    flood.start()
    time.sleep(1.5)  # the flood is under way
    during = []
    while flood.is_alive() and len(during) < 5:
        during.append(victim_s())
    flood.join(timeout=60)

    [flooded] = flood_result
    assert flooded.ok, (flooded.failure(), flooded.stderr)
    sent, refused, last = flooded.result
    # The program kept calling after the cap: every further call was refused (how many fit in the
    # flood's seconds depends on the host's load, so only "more refused than sent" is asserted).
    assert sent == 50 and refused > sent, flooded.result
    assert last == "ToolBudgetExceededError: tool-call budget of 50 exceeded"
    assert len(outbox(data_dir)) == 50, "the cap holds on the host: 50 mails, no more"
    assert "tool_calls" in flooded.limits_hit
    assert during, "no victim run finished while the flood ran"
    ratio = statistics.median(during) / statistics.median(alone)
    record(
        "bridge: flood of calls (cap 50) beside another program",
        RUNTIME,
        True,
        {
            "calls": sent + refused,
            "sent": sent,
            "refused": refused,
            "victim_alone_s": [round(x, 3) for x in alone],
            "victim_during_flood_s": [round(x, 3) for x in during],
            "latency_ratio": round(ratio, 2),
        },
    )


# ---- oversized arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize("body_bytes, limit", [(5_000, 4_096), (64 * 1024**2, 1024**2)])
def test_oversized_arguments_are_refused_naming_the_limit(
    go: Callable[..., Any], data_dir: Path, body_bytes: int, limit: int
) -> None:
    source = program(
        f"""
        import json
        from sandfleet_tools import send_email
        try:
            send_email("ana@example.com", "big", "x" * {body_bytes})
            outcome = "sent"
        except Exception as e:
            outcome = [type(e).__name__, str(e)]
        print("RESULT: " + json.dumps([outcome, send_email("ana@example.com", "small")]))
        """
    )
    before = vm_hwm_kib()

    done = go(source, tools=["send_email"], max_request_bytes=limit, exec_timeout=60)

    grown_kib = vm_hwm_kib() - before
    assert done.ok, (done.failure(), done.stderr)
    (kind, message), small = done.result
    assert kind == "ValueError" and f"exceeds the {limit}-byte limit" in message, message
    assert small.startswith("msg-"), "the channel is in step after the refusal"
    assert [m["subject"] for m in outbox(data_dir)] == ["small"]
    assert grown_kib < 64 * 1024, f"this process's peak memory grew by {grown_kib / 1024:.0f} MiB"
    record(
        f"bridge: oversized argument ({body_bytes} B body, limit {limit} B)",
        RUNTIME,
        True,
        {"error": message, "host_peak_rss_kib_before": before, "host_peak_rss_kib_after": before + grown_kib},
    )


# ---- tool names that look like paths or code -------------------------------------------------------------

HOSTILE_NAMES = [
    "../x",
    "../../worker/tools/examples/side.send_email",
    "os.system",
    "load_orders; rm -rf /",
    "__import__",
    "__builtins__",
    "send_email.__globals__",
    "l\u043ead_orders",  # Cyrillic o
    "\uff4c\uff4f\uff41\uff44_orders",  # fullwidth, NFKC-equal to load_orders
    "load_orders\u200b",  # zero-width space
    "LOAD_ORDERS",
    "",
    "x" * 10_000,
]


def test_path_and_injection_like_tool_names_are_refused(
    go: Callable[..., Any], data_dir: Path, registry: Any
) -> None:
    from sandfleet.worker.program.bridge import allow_all

    asked: list[str] = []

    def policy(request: Any) -> Any:  # runs right before a tool would: counts what would have run
        asked.append(request.tool)
        return allow_all(request)

    source = program(
        f"""
        import json, sandfleet_tools
        out = []
        for name in {HOSTILE_NAMES!r}:
            try:
                out.append(["ok", sandfleet_tools._call(name, ["rm -rf /"], {{}})])
            except Exception as e:
                out.append([type(e).__name__, str(e)[:300]])
        print("RESULT: " + json.dumps(out))
        """
    )

    done = go(source, tools=["load_orders", "send_email"], policy=policy)

    assert done.ok, (done.failure(), done.stderr)
    for name, (kind, message) in zip(HOSTILE_NAMES, done.result, strict=True):
        assert kind == "NameError", (name, kind, message)
        assert "is not allowed for this job; allowed tools: load_orders, send_email" in message, message
    assert asked == [] and all(not c.ok for c in done.tool_calls)
    assert max(len(c.tool) for c in done.tool_calls) <= 200, "recorded names are bounded"
    assert outbox(data_dir) == [] and (data_dir / "orders.csv").exists()
    record(
        f"bridge: path- or injection-like tool names ({len(HOSTILE_NAMES)})",
        RUNTIME,
        True,
        "NameError naming the allowed tools; no tool called",
    )


# ---- a file tool's argument that tries to leave its folder ----------------------------------------------

ESCAPES = {
    "../../etc/passwd": "PermissionError",
    "/etc/passwd": "PermissionError",
    "data/../../x": "PermissionError",
    "notes/../../secret.txt": "PermissionError",
    "..": "PermissionError",
    "link-out": "PermissionError",  # a symlink inside the folder pointing at ../secret.txt
    "notes/q3.txt\x00../../etc/passwd": "ValueError",
    "\x00/etc/passwd": "ValueError",
    "": "ValueError",
    # Not decoded: a folder literally named "%2e%2e" inside the data folder, which does not exist.
    "%2e%2e/etc/passwd": "FileNotFoundError",
    "%2e%2e%2f%2e%2e%2fetc%2fpasswd": "FileNotFoundError",
}


def test_a_file_tool_cannot_be_made_to_leave_its_folder(
    go: Callable[..., Any], data_dir: Path, opened: list[str]
) -> None:
    paths = list(ESCAPES)
    source = program(
        f"""
        import json
        from sandfleet_tools import read_text
        out = []
        for path in {paths!r} + [["etc", "passwd"]]:
            try:
                out.append(["ok", read_text(path)])
            except Exception as e:
                out.append([type(e).__name__, str(e)])
        out.append(["ok", read_text("notes/q3.txt")])
        print("RESULT: " + json.dumps(out))
        """
    )

    done = go(source, tools=["read_text"])

    assert done.ok, (done.failure(), done.stderr)
    *escapes, not_a_str, inside = done.result
    for path, (kind, message) in zip(paths, escapes, strict=True):
        assert kind == ESCAPES[path], (path, kind, message)
    assert not_a_str[0] == "TypeError"
    assert inside == ["ok", "Q3 notes: inside the folder\n"]
    assert "root:" not in done.stdout and OUTSIDE_SECRET not in json.dumps(done.to_dict())
    root = data_dir.resolve()
    outside = [p for p in opened if "passwd" in p or "secret" in p or "%2e" in p]
    assert outside == [], f"the tool opened {outside}"
    assert [p for p in opened if p.startswith(str(root))] == [str(root / "notes" / "q3.txt")]
    record(
        f"bridge: read_text leaving its folder ({len(paths) + 1} arguments)",
        RUNTIME,
        True,
        {path: kind for path, (kind, _m) in zip(paths, escapes, strict=True)},
    )
