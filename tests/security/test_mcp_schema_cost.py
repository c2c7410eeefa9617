"""A malicious MCP server's schemas against a real ``sandfleet worker`` (issue 22, attack row 7): the
worker keeps beating and serving other jobs while a hostile job calls the server's tools.

The server (tests/mcp_tools/servers/hostile.py, over stdio, started by the worker) offers ``match``
(a pattern Python's ``re`` needs minutes for at 30 characters: RE2 checks it), ``explode`` (2**30
visits of one value through ``$ref`` s: not offered) and ``wide`` (510 visits an item: a call with
5,000 items is refused before the check, ``MAX_CHECK_VISITS``). One job names ``explode`` and is
refused as naming an unknown tool; one calls the others, then ``ping``; a plain job runs beside it.
A thread reads the worker's heartbeat key all along: it must never be missing (its TTL is 10 s, the
beat every 2 s), which only a worker stalled for seconds would break.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis
from mcp_tools.helpers import SERVERS, stdio, write_config
from sandfleet_testing.workers import JOB_TIMEOUT_S, FleetWorker, WorkerFactory

from sandfleet.core.contracts import JobStatus
from sandfleet.core.redis_keys import FleetKeys

from .helpers import record

pytestmark = [pytest.mark.slow]

HOSTILE = SERVERS / "hostile.py"
CATASTROPHIC_INPUT = "a" * 30 + "b"  # Python's re: 1.9 s at 26 characters, doubling per character


def block(source: str) -> str:
    return f"```python\n{source.strip()}\n```"


HOSTILE_PROGRAM = f"""
import json
from sandfleet_tools import hostile__match, hostile__ping, hostile__wide
out = {{}}
for name, call, arg in (("match", hostile__match, {CATASTROPHIC_INPUT!r}), ("wide", hostile__wide, ["a"] * 5000)):
    try:
        call(arg)
        out[name] = "accepted"
    except Exception as e:
        out[name] = [type(e).__name__, str(e)[:400]]
out["ping"] = hostile__ping()
print("RESULT: " + json.dumps(out))
"""
SCRIPT = {
    "rules": [
        {"match": "hostile schemas", "responses": [block(HOSTILE_PROGRAM)]},
        {"match": "explode", "responses": [block("print('RESULT: 1')")]},
        {"match": "plain", "responses": [block("print('RESULT: 42')")]},
    ]
}


@pytest.fixture(scope="module")
def worker(module_fleet_worker: WorkerFactory, tmp_path_factory: pytest.TempPathFactory) -> FleetWorker:
    config = write_config(tmp_path_factory.mktemp("schema-cost-mcp"), {"hostile": stdio(HOSTILE)})
    return module_fleet_worker("schema-cost", script=SCRIPT, env={"SANDFLEET_MCP_CONFIG": str(config)})


class HeartbeatWatch:
    """Reads the worker's heartbeat key every 0.2 s; counts the reads that found it missing."""

    def __init__(self, worker: FleetWorker) -> None:
        self._redis = redis.Redis.from_url(worker.settings.redis_url)
        self._key = FleetKeys(worker.settings.key_prefix).heartbeat(worker.worker.name)
        self.reads = self.missing = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self.reads += 1
            self.missing += 0 if self._redis.exists(self._key) else 1

    def __enter__(self) -> HeartbeatWatch:
        assert self._redis.exists(self._key), "the worker beats before the test"
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._redis.close()


@pytest.fixture
def watch(worker: FleetWorker) -> Iterator[HeartbeatWatch]:
    with HeartbeatWatch(worker) as watching:
        yield watching


def test_a_catastrophic_schema_is_refused_and_the_worker_beats_and_serves_other_jobs(
    worker: FleetWorker, watch: HeartbeatWatch
) -> None:
    client, tools = worker.client, ["hostile__match", "hostile__wide", "hostile__ping"]
    hostile = client.submit("hostile schemas", tools=tools, model=worker.model)
    plain = client.submit("plain", model=worker.model)
    exploding = client.submit("explode", tools=["hostile__explode"], model=worker.model)
    results = {
        name: job.result(timeout=JOB_TIMEOUT_S) for name, job in (("hostile", hostile), ("plain", plain))
    }
    refused = exploding.result(timeout=JOB_TIMEOUT_S)

    assert results["plain"].status == JobStatus.SUCCEEDED and results["plain"].result == 42
    out = results["hostile"].result
    assert results["hostile"].status == JobStatus.SUCCEEDED, results["hostile"].error
    assert out["match"][0] == "ValueError" and "does not match '^(a+)+$'" in out["match"][1], out
    assert out["wide"][0] == "ValueError" and "MAX_CHECK_VISITS" in out["wide"][1], out  # never checked
    assert "5002 values" in out["wide"][1] and out["ping"] == "pong"  # the server and the bridge go on
    assert refused.status == JobStatus.REFUSED and refused.error is not None
    assert "hostile__explode" in refused.error.message, refused.error
    log = worker.log()
    assert "tool 'explode' is not offered: its inputSchema visits one value more than 1000 times" in log
    assert "tool 'wide' is not offered" not in log
    assert watch.reads > 0 and watch.missing == 0, (watch.reads, watch.missing)
    record(
        "MCP: exponential $ref/oneOf schema and a catastrophic pattern, through a real worker",
        "runc",
        True,
        {
            "explode": "not offered (visits per value past 1000)",
            "wide x5000": out["wide"][1][:120],
            "match": "RE2",
            "heartbeat reads missing": f"{watch.missing}/{watch.reads}",
            "plain job": "succeeded",
        },
    )
