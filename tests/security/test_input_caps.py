"""Bounded inputs, for real: JSON nested past the cap, huge MCP answers and catastrophic schema patterns.

Issue 22 found that a program or an MCP server could hand the fleet JSON nested ~200-255 deep (in a
RESULT, tool arguments or ``structuredContent``): it passed every check, was signed into records that
then broke ``sandfleet jobs``, ``result``, ``batch --out`` and ``replay --batch``; deeper, the final
write raised and the job stayed ``running``. And a malicious MCP server's schema pattern held the
GIL for seconds per call. Here a real ``sandfleet worker`` (example tools plus the hostile MCP server,
tests/mcp_tools/servers/hostile.py) runs programs from the replay model that push values at and past
the cap, under runc and gVisor; each is refused by the cap it names, every job ends, and then every
reader reads every record: ``batch --out``, ``jobs``, ``result``, ``audit --verify``, ``replay``,
``replay --batch``, the Flower report and the client.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from mcp_tools.helpers import SERVERS, stdio, write_config
from sandfleet_testing import FIND_BRIDGE_FDS
from sandfleet_testing.workers import SANDFLEET, FleetWorker, WorkerFactory

from sandfleet.core.contracts import ErrorKind, JobResult, JobStatus
from sandfleet.core.json_limits import MAX_JSON_DEPTH, MAX_RECORD_DEPTH
from sandfleet.core.settings import Settings

from .helpers import program, record

HOSTILE = SERVERS / "hostile.py"
NESTED = "nested more than 64 deep (the JSON nesting cap, MAX_JSON_DEPTH)"
JOB_TIMEOUT_S = 240.0
BACKENDS = {"runc": "docker", "runsc": "gvisor"}
RESULT_DEPTHS_REFUSED = (MAX_JSON_DEPTH + 1, 200, 255, 1000, 100_000)
READERS_AT_ONCE = 4  # reader commands run side by side (the host has 2 cores; each mostly waits on Redis)
CATASTROPHIC_INPUT = "a" * 30 + "b"  # Python's re: 1.9 s at 26 characters, doubling per character


def deep_result_program(depth: int) -> str:
    return f'print("RESULT: " + "[" * {depth} + "]" * {depth})'


TOOL_ARGUMENTS = (
    program(
        """
    import fcntl, json, os, struct
    from sandfleet_tools import get_order
    """
    )
    + FIND_BRIDGE_FDS
    + program(
        """
    def deep(n):
        value = []
        for _ in range(n - 1):
            value = [value]
        return value
    out = {}
    for name, n in (("at the cap", 64), ("past the cap", 65)):
        try:
            get_order(deep(n))
        except Exception as e:
            out[name] = [type(e).__name__, str(e)]
    SEND, RECV = bridge_fds()
    body = ('{"id": 99, "tool": "get_order", "args": [' + "[" * 100000 + "]" * 100000 + '], "kwargs": {}}').encode()
    os.write(SEND, struct.pack("!I", len(body)) + body)  # a raw frame: the stub cannot even encode it
    (size,) = struct.unpack("!I", os.read(RECV, 4))
    data = b""
    while len(data) < size:
        data += os.read(RECV, size - len(data))
    reply = json.loads(data)
    out["100,000 deep, raw"] = [reply["type"], reply["message"]]
    print("RESULT: " + json.dumps(out))
    """
    )
)

MCP_ANSWERS = program(
    """
    import json, time
    from sandfleet_tools import hostile__nested, hostile__bulky, hostile__ping
    out = {}
    value = hostile__nested(63)  # {"value": 63 deep}: 64 deep, at the cap
    out["at the cap"] = "kept" if isinstance(value, dict) else repr(value)[:100]
    for depth in (64, 100000):
        try:
            hostile__nested(depth)
            out[str(depth)] = "returned"
        except Exception as e:
            out[str(depth)] = [type(e).__name__, str(e)]
    for _ in range(100):  # a server whose message broke the cap is restarted
        try:
            out["ping after"] = hostile__ping()
            break
        except Exception as e:
            out["ping after"] = str(e)
            time.sleep(0.2)
    try:
        hostile__bulky(40000)  # about 2.5 MB of structured content; the job allows 1 MiB replies
        out["bulky"] = "returned"
    except Exception as e:
        out["bulky"] = [type(e).__name__, str(e)]
    print("RESULT: " + json.dumps(out))
    """
)


def code(source: str) -> list[Any]:
    """The replay model's responses for a code-action job: that one program."""
    return [f"```python\n{source}\n```"]


CHAT_ANSWER = [  # a tool-calling loop: a call with arguments past the cap, then an answer past it
    {"tool_calls": [{"name": "get_order", "arguments": '{"order_id": ' + "[" * 100 + "]" * 100 + "}"}]},
    "RESULT: " + "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1),
]

CASES: dict[str, tuple[list[Any], dict[str, Any]]] = {
    **{
        f"result {d}": (code(deep_result_program(d)), {"code_action": {"max_repairs": 0}})
        for d in (MAX_JSON_DEPTH, *RESULT_DEPTHS_REFUSED)
    },
    "tool arguments": (code(TOOL_ARGUMENTS), {"tools": ["get_order"]}),
    "mcp answers": (
        code(MCP_ANSWERS),
        {
            "tools": ["hostile__nested", "hostile__bulky", "hostile__ping"],
            "code_action": {"max_response_bytes": 1024**2, "exec_timeout": 120},
        },
    ),
    "chat answer": (CHAT_ANSWER, {"mode": "chat", "tools": ["get_order"]}),
}


def replay_script(folder: Path) -> Path:
    rules = [
        {"match": f"^case {re.escape(name)}$", "responses": responses}
        for name, (responses, _) in CASES.items()
    ]
    path = folder / "script.json"
    path.write_text(json.dumps({"rules": rules, "default": ["```python\nprint('RESULT: no case')\n```"]}))
    return path


@dataclass
class CapsFleet:
    settings: Settings
    worker: FleetWorker
    model: str
    folder: Path

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
            "SANDFLEET_REDIS_URL": self.settings.redis_url,
            "SANDFLEET_KEY_PREFIX": self.settings.key_prefix,
        }
        return subprocess.run(
            [SANDFLEET, *args], env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S * 2
        )


@pytest.fixture(scope="module")
def fleet(module_fleet_worker: WorkerFactory, tmp_path_factory: pytest.TempPathFactory) -> CapsFleet:
    """One worker: the example order tools, the hostile MCP server, the replay model of CASES. Each
    test submits its own batch, so the tests share it in any order."""
    mcp = write_config(tmp_path_factory.mktemp("input-caps-mcp"), {"hostile": stdio(HOSTILE)})
    worker = module_fleet_worker(
        "input-caps",
        tools="sandfleet.worker.tools.examples.orders",
        sandboxes=2,
        concurrency=4,
        script=replay_script,
        env={"SANDFLEET_MCP_CONFIG": str(mcp)},
    )
    return CapsFleet(worker.settings, worker, worker.model, worker.folder)


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_values_past_the_cap_are_refused_every_job_ends_and_every_reader_reads_every_record(
    fleet: CapsFleet, runtime: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if runtime == "runsc":
        request.getfixturevalue("gvisor")
    rows = [{"question": f"case {name}", **fields} for name, (_, fields) in CASES.items()]
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "results.jsonl"

    # Submitted as a submitter types it; `batch --out` waits for every job and writes what it read.
    done = fleet.cli(
        "batch", str(cases), "--model", fleet.model, "-o", f"backend={BACKENDS[runtime]}", "--out", str(out)
    )

    assert done.returncode == 1, done.stdout + done.stderr  # some jobs failed (refused RESULTs), none hang
    batch_id = done.stdout.strip().splitlines()[0]
    exported = {
        row["question"].removeprefix("case "): row for row in map(json.loads, out.read_text().splitlines())
    }
    assert set(exported) == set(CASES) and all(row["verified"] for row in exported.values()), exported
    by_case = {name: JobResult.model_validate(_result_fields(row)) for name, row in exported.items()}

    # The RESULT: at the cap kept, past it refused by the cap (the job fails, it never stays running).
    assert by_case[f"result {MAX_JSON_DEPTH}"].status == JobStatus.SUCCEEDED
    assert by_case[f"result {MAX_JSON_DEPTH}"].result == json.loads(deep_text(MAX_JSON_DEPTH))
    for depth in RESULT_DEPTHS_REFUSED:
        result = by_case[f"result {depth}"]
        assert result.status == JobStatus.FAILED and result.error is not None, (depth, result.error)
        assert result.error.kind == ErrorKind.PROGRAM
        assert f"the RESULT is {NESTED}" in result.error.message, result.error.message
        assert result.result is None and "nesting" in result.attempts[-1].limits_hit
    # Tool arguments: the bridge refuses them by the cap before parsing; at the cap they reach the tool.
    arguments = by_case["tool arguments"].result
    assert arguments["at the cap"][0] == "TypeError", arguments  # the tool's own check of its argument
    for case in ("past the cap", "100,000 deep, raw"):
        assert arguments[case] == ["ValueError", f"a tool argument is {NESTED}"], arguments
    # An MCP server's answers: past the cap refused (by the value check, or ending its connection).
    answers = by_case["mcp answers"].result
    assert answers["at the cap"] == "kept"
    assert answers["64"] == [
        "ValueConversionError",
        f"tool hostile__nested returned a value that is {NESTED}; nest less deeply, or break the cycle",
    ]
    assert (
        answers["100000"][0] == "ToolServerError"
        and f"it sent a message that is {NESTED}" in answers["100000"][1]
    )
    assert (
        answers["bulky"][0] == "ValueError" and "more than the 1048576-byte limit" in answers["bulky"][1]
    ), answers
    assert answers["ping after"] == "pong", answers
    # A tool-calling loop: the model's arguments and its answer, past the cap.
    chat = by_case["chat answer"]
    assert chat.status == JobStatus.FAILED and chat.error is not None and chat.error.kind == ErrorKind.LIMIT
    assert (
        chat.error.message == f"the model's answer: the RESULT is {NESTED}" and "nesting" in chat.limits_hit
    )
    [call] = chat.turns[0].calls
    assert not call.ok and f"an argument is {NESTED}" in (call.error or ""), call

    # Every reader reads every record. The readers only read, each a process of its own (about half a
    # second to start): they run side by side, and are checked once all have answered.
    job_ids = {name: row["job_id"] for name, row in exported.items()}
    with ThreadPoolExecutor(max_workers=READERS_AT_ONCE) as readers:
        replaying = readers.submit(fleet.cli, "replay", "--batch", batch_id, "--json")
        replaying_one = readers.submit(fleet.cli, "replay", job_ids["tool arguments"])
        listing = readers.submit(fleet.cli, "jobs", "--batch", batch_id)
        listing_json = readers.submit(fleet.cli, "jobs", "--batch", batch_id, "--json")
        reading = {
            name: [readers.submit(fleet.cli, *args) for args in per_job_readers(job_id)]
            for name, job_id in job_ids.items()
        }
    listed = listing.result()
    assert listed.returncode == 0 and len(listed.stdout.splitlines()) == len(CASES), (
        listed.stdout + listed.stderr
    )
    listed_json = listing_json.result()
    assert listed_json.returncode == 0 and {
        json.loads(line)["job_id"] for line in listed_json.stdout.splitlines()
    } == set(job_ids.values())
    for name, futures in reading.items():
        shown, audited, events = (future.result() for future in futures)
        expected = 0 if by_case[name].status == JobStatus.SUCCEEDED else 1
        assert shown.returncode == expected and json.loads(shown.stdout)["verified"], (
            name,
            shown.stderr[-500:],
        )
        assert audited.returncode == 0, (name, audited.stdout[-500:], audited.stderr[-500:])
        assert events.returncode == 0 and all(json.loads(line) for line in events.stdout.splitlines()), name
    replayed = replaying.result()
    assert replayed.returncode == 0, replayed.stdout[-2000:] + replayed.stderr[-2000:]
    one = replaying_one.result()
    assert one.returncode == 0 and "match" in one.stdout, one.stdout + one.stderr

    from sandfleet.core.store import JobStore
    from sandfleet.producer.client import Client
    from sandfleet.worker.delivery.flower_report import flower_outcome

    with Client(settings=fleet.settings) as client:
        checked = client.batch(batch_id).checked_results()
        assert len(checked) == len(CASES) and all(c.verified and c.result is not None for c in checked)
        store = JobStore(client.redis, fleet.settings)
        for name, job_id in job_ids.items():
            outcome = flower_outcome(job_id, store.record(job_id))
            assert outcome.failed == (by_case[name].status != JobStatus.SUCCEEDED)
            json.dumps(outcome.summary)
        records = client.jobs(batch=batch_id)
        assert all(r.unreadable is None and r.result is not None for r in records)
    record(
        "JSON nested past the cap (RESULT, tool arguments, MCP answers) through a real worker",
        runtime,
        True,
        {
            "RESULT depths refused": list(RESULT_DEPTHS_REFUSED),
            "arguments": "ValueError naming the cap (stub and raw frame)",
            "MCP": "past the cap refused; 100,000 deep ends the connection; the server comes back",
            "readers": "batch --out, jobs, result, audit --verify, replay, replay --batch, Flower, client",
        },
    )


def per_job_readers(job_id: str) -> list[tuple[str, ...]]:
    """The commands that read one job back: its result, its audit chain verified, its events."""
    return [("result", job_id, "--json"), ("audit", job_id, "--verify"), ("audit", job_id, "--json")]


def deep_text(depth: int) -> str:
    return "[" * depth + "]" * depth


def _result_fields(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("line", "question", "verified")}


# ---- a catastrophic pattern in a server's schema: checked without holding the GIL ---------------------


class PaceWatch:
    """A thread that wakes every 5 ms and keeps the longest gap between two wakes: what every other
    thread of the worker (heartbeats, cancels, other jobs) would have waited."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(0.005)
            now = time.perf_counter()
            self.longest_s = max(self.longest_s, now - last)
            last = now

    def __enter__(self) -> PaceWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def hostile_sessions() -> Iterator[Any]:
    from sandfleet.worker.mcp.config import parse_mcp_config
    from sandfleet.worker.mcp.sessions import McpSessions

    config = parse_mcp_config(json.dumps({"mcpServers": {"hostile": stdio(HOSTILE)}}))
    with McpSessions(config, backoff_start_s=0.2, backoff_max_s=1.0) as started:
        assert all(s.up for s in started.status()), started.status()
        yield started


def test_the_watch_sees_a_thread_that_holds_the_gil(docker_engine: object) -> None:
    """The control: Python's own re on the same pattern holds the GIL, and the watch sees it."""
    with PaceWatch() as watch:
        held = threading.Thread(target=re.search, args=("^(a+)+$", "a" * 23 + "b"))
        began = time.perf_counter()
        held.start()
        held.join()
        took = time.perf_counter() - began
    assert watch.longest_s > 0.5 * took > 0.05, (watch.longest_s, took)


def test_a_catastrophic_pattern_in_a_servers_schema_does_not_stall_the_worker(
    run: Callable[..., Any], runtime: str, hostile_sessions: Any
) -> None:
    from sandfleet.worker.mcp.catalog import ToolCatalog
    from sandfleet.worker.tools.registry import ToolRegistry

    registry = ToolCatalog(ToolRegistry(), hostile_sessions).registry()
    assert "hostile__lookahead" not in registry  # a pattern RE2 cannot compile: the tool is not offered
    source = program(
        f"""
        import json, time
        from sandfleet_tools import hostile__match, hostile__shout
        out = {{}}
        began = time.monotonic()
        for name, call in (("input", hostile__match), ("output", hostile__shout)):
            for _ in range(3):
                try:
                    call({CATASTROPHIC_INPUT!r})
                    out[name] = "accepted"
                except Exception as e:
                    out[name] = [type(e).__name__, str(e)]
        out["took_s"] = time.monotonic() - began
        print("RESULT: " + json.dumps(out))
        """
    )
    with PaceWatch() as watch:
        done = run(
            source, runtime, registry=registry, tools=["hostile__match", "hostile__shout"], exec_timeout=60
        )

    assert done.ok, (done.failure(), done.stderr[-2000:])
    out = done.result
    assert out["input"][0] == "ValueError" and "does not match '^(a+)+$'" in out["input"][1], out
    # the server's structured output, checked by the SDK against its output schema on the MCP thread
    assert out["output"][0] == "ToolServerError" and "does not match '^(a+)+$'" in out["output"][1], out
    # With Python's re each of these six checks alone would have held the GIL for about 30 s: the
    # bounds are far under that and far over what a loaded shared host adds to linear-time checks.
    assert watch.longest_s < 10, f"another thread waited {watch.longest_s:.2f} s"
    assert out["took_s"] < 30, out
    record(
        "MCP: a catastrophic pattern in a tool's input and output schema",
        runtime,
        True,
        {"matched by": "RE2 (linear time)", "longest stall_s": round(watch.longest_s, 3)},
    )


def test_unique_objects_are_checked_in_one_pass_not_pairwise(
    run: Callable[..., Any], hostile_sessions: Any
) -> None:
    from sandfleet.worker.mcp.catalog import ToolCatalog
    from sandfleet.worker.tools.registry import ToolRegistry

    registry = ToolCatalog(ToolRegistry(), hostile_sessions).registry()
    source = """
        import json, time
        from sandfleet_tools import hostile__distinct
        began = time.monotonic()
        try:
            hostile__distinct([{"id": i} for i in range(20000)] + [{"id": 7}])
            out = ["accepted"]
        except Exception as e:
            out = [type(e).__name__, len(str(e)), str(e)[-60:]]
        print("RESULT: " + json.dumps({"out": out, "took_s": time.monotonic() - began}))
        """
    done = run(program(source), "runc", registry=registry, tools=["hostile__distinct"], exec_timeout=120)

    assert done.ok, (done.failure(), done.stderr[-2000:])
    kind, size, tail = done.result["out"]
    assert kind == "ValueError" and tail.endswith("has non-unique elements"), done.result
    assert size < 9000, "the message quoting the argument is cut at MAX_ERROR_CHARS"
    # jsonschema's pairwise check: 1,000 objects 1 s, 4,000 15 s, so 20,000 about 6 minutes
    assert done.result["took_s"] < 30, done.result
    record(
        "MCP: uniqueItems over 20,000 objects (jsonschema compares every pair)",
        "runc",
        True,
        {"checked by": "one pass with hashable keys", "took_s": round(done.result["took_s"], 2)},
    )


# ---- the store writes only records a reader can read back ---------------------------------------------


def test_a_record_a_reader_could_not_read_is_written_as_a_record_limit_error_and_the_job_ends(
    docker_engine: object, redis_server: str, tmp_path: Path
) -> None:
    from fleet.helpers import TEST_WORKER, fleet_settings_for, keys_under, start_job

    from sandfleet.core.key_registry import KeyRegistry, start_signer
    from sandfleet.core.redis_keys import FleetKeys
    from sandfleet.core.store import JobStore
    from sandfleet.producer.client import Client

    settings = fleet_settings_for(redis_server, worker_state_dir=str(tmp_path / "state"))
    r = redis.Redis.from_url(redis_server, decode_responses=True)
    signer = start_signer(settings, TEST_WORKER, KeyRegistry(r, FleetKeys(settings.key_prefix)))
    store = JobStore(r, settings, signer)
    try:
        with Client(settings=settings) as client:
            handles = [client.submit({"question": f"deep {d}"}) for d in (MAX_RECORD_DEPTH, 300)]
            for handle, depth in zip(handles, (MAX_RECORD_DEPTH, 300), strict=True):
                sink = start_job(store, handle.job_id)
                sink.emit("tool_call", {"result": json.loads(deep_text(depth)) if depth < 900 else None})
                value: Any = []
                for _ in range(depth - 1):
                    value = [value]
                store.finish(
                    handle.job_id, JobResult(job_id=handle.job_id, status=JobStatus.SUCCEEDED, result=value)
                )
            for handle in handles:
                checked = client.get(handle.job_id).checked()
                assert checked.verified and checked.result is not None
                assert checked.result.status == JobStatus.FAILED and checked.result.error is not None
                assert checked.result.error.kind == ErrorKind.RECORD_LIMIT
                assert (
                    "the final record would be nested more than 128 deep" in checked.result.error.message
                    or "cannot be written as JSON" in checked.result.error.message
                )
                events = client.get(handle.job_id).audit()
                omitted = [e for e in events if e.kind == "tool_call"]
                assert len(omitted) == 1 and "omitted" in omitted[0].data, omitted
    finally:
        if leftovers := keys_under(r, settings.key_prefix):
            r.delete(*leftovers)
        r.close()


def test_a_planted_record_no_reader_can_parse_breaks_no_listing_and_is_refused_by_name(
    docker_engine: object, redis_server: str, tmp_path: Path
) -> None:
    """Whoever can write Redis (or a worker from before the caps) leaves a record nested past what
    pydantic reads (200): ``jobs`` still lists every job, ``result`` refuses that one (exit 4)."""
    from fleet.helpers import fleet_settings_for, keys_under

    from sandfleet.producer.client import Client

    settings = fleet_settings_for(redis_server)
    r = redis.Redis.from_url(redis_server, decode_responses=True)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
    }
    try:
        with Client(settings=settings) as client:
            planted, fine = client.submit({"question": "planted"}), client.submit({"question": "fine"})
            fields = {"schema_version": 1, "job_id": planted.job_id, "status": "succeeded", "result": "DEEP"}
            deep = json.dumps(fields).replace('"DEEP"', deep_text(300))
            r.hset(client.keys.job(planted.job_id), mapping={"status": "succeeded", "result": deep})
            [record_] = [rec for rec in client.jobs() if rec.job_id == planted.job_id]
            assert record_.result is None and "its final result cannot be read" in (record_.unreadable or "")
        listed = subprocess.run([SANDFLEET, "jobs"], env=env, capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr[-2000:]
        assert {planted.job_id, fine.job_id} <= {line.split()[0] for line in listed.stdout.splitlines()}
        shown = subprocess.run(
            [SANDFLEET, "result", planted.job_id], env=env, capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 4 and "refused" in shown.stderr and "Traceback" not in shown.stderr, (
            shown.stderr
        )
    finally:
        if leftovers := keys_under(r, settings.key_prefix):
            r.delete(*leftovers)
        r.close()
