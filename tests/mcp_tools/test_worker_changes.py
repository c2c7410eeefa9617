"""MCP servers that change, through the whole fleet: a real ``sandfleet worker`` on a real Redis, jobs
submitted through the Client, programs written by the replay model and run in Docker sandboxes.

- the tests' changing server (stdio, 2026-07-28: changes on a listen stream) drops a tool and adds one
  while a job runs: the running job keeps the tools it was admitted with (its repair still has the
  dropped one), a new job calls the added one, a new job naming the dropped one is refused;
- a program reads the server's resources through ``ch__read_resource`` (never gated, even by
  ``ch__*``); a URI never listed and a resource past the job's reply limit are refused;
- odd.py over streamable HTTP is stopped: the worker's ping notices it within its interval,
  ``sandfleet doctor`` (reading the worker's heartbeat report) and the metrics show it down, a job
  naming its tool fails fast; started again, it is shown up and serves the next job.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from sandfleet_testing.workers import JOB_TIMEOUT_S, SANDFLEET, FleetWorker, WorkerFactory

from sandfleet.core.contracts import JobStatus
from sandfleet.fleet.loadtest.scrape import scrape

from .helpers import CHANGING, ODD, HttpServer, stdio, wait_until, write_config

PING_INTERVAL_S = 1.0
UP = "sandfleet_mcp_server_up{server=flaky}"


def block(source: str) -> str:
    return f"```python\n{source.strip()}\n```"


CHANGE_FIRST = """
import time
from sandfleet_tools import ch__change, ch__doomed, ch__served
first = ch__doomed()
ch__change(add=["fresh"], remove=["doomed"])
for _ in range(600):  # until a job admitted after the change has called the new tool
    if "fresh" in ch__served()["called"]:
        break
    time.sleep(0.2)
raise RuntimeError("the first attempt fails on purpose, after " + first)
"""
CHANGE_REPAIRED = """
import json
import sandfleet_tools
from sandfleet_tools import ch__doomed, ToolError
try:
    outcome = ch__doomed()
except ToolError as e:
    outcome = str(e)
names = sorted(n for n in dir(sandfleet_tools) if n.startswith("ch__"))
print("RESULT: " + json.dumps({"doomed": outcome, "names": names}))
"""
READ = """
import json
from sandfleet_tools import ch__read_resource
out = {"notes": ch__read_resource("data://notes.txt")["text"], "day": ch__read_resource("notes://friday")["text"]}
for uri in ("secret://token", "data://huge.txt"):
    try:
        ch__read_resource(uri)
        out[uri] = "read"
    except Exception as e:
        out[uri] = [type(e).__name__, str(e)]
print("RESULT: " + json.dumps(out))
"""


def script() -> dict[str, Any]:
    return {
        "rules": [
            {"match": "Change the tools", "responses": [block(CHANGE_FIRST), block(CHANGE_REPAIRED)]},
            {
                "match": "Call the fresh tool",
                "responses": [block('import json\nfrom sandfleet_tools import ch__fresh\nprint("RESULT: " + json.dumps(ch__fresh()))')],
            },
            {"match": "Read the resources", "responses": [block(READ)]},
            {
                "match": "Search the flaky server",
                "responses": [block('import json\nfrom sandfleet_tools import flaky__search\nprint("RESULT: " + json.dumps(flaky__search("q")["arguments"]))')],
            },
        ],
        "default": [block('print("RESULT: no rule matched")')],
    }  # fmt: skip


@pytest.fixture(scope="module")
def flaky() -> Iterator[HttpServer]:
    server = HttpServer(ODD).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fleet(
    module_fleet_worker: WorkerFactory, flaky: HttpServer, tmp_path_factory: pytest.TempPathFactory
) -> FleetWorker:
    config = write_config(
        tmp_path_factory.mktemp("mcp-changes"), {"ch": stdio(CHANGING), "flaky": {"url": flaky.url}}
    )
    return module_fleet_worker(
        "mcp-changes",
        script=script(),
        metrics=True,
        env={
            "SANDFLEET_MCP_CONFIG": str(config),
            "SANDFLEET_MCP_PING_INTERVAL_S": str(PING_INTERVAL_S),
            "SANDFLEET_MCP_PING_TIMEOUT_S": "5",
            "SANDFLEET_TRANSIENT_RETRIES": "1",
            "SANDFLEET_TRANSIENT_BACKOFF_S": "0.2",
        },
    )


def submit(fleet: FleetWorker, question: str, tools: list[str], **options: Any) -> tuple[Any, Any]:
    job = fleet.client.submit(question, tools=tools, model=fleet.model, **options)
    return job, job.result(timeout=JOB_TIMEOUT_S)


def doctor_rows(fleet: FleetWorker) -> dict[str, dict[str, Any]]:
    """``sandfleet doctor --json`` from another process (no MCP config of its own): the rows the
    worker's heartbeat report gives, by check name."""
    env = {k: v for k, v in os.environ.items() if k != "SANDFLEET_MCP_CONFIG"}
    env |= {
        "SANDFLEET_REDIS_URL": fleet.settings.redis_url,
        "SANDFLEET_KEY_PREFIX": fleet.settings.key_prefix,
    }
    done = subprocess.run(
        [SANDFLEET, "doctor", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    rows = json.loads(done.stdout)
    return {row["check"]: row for row in rows if row["check"].startswith("MCP server ")}


def flaky_row(fleet: FleetWorker) -> dict[str, Any] | None:
    return doctor_rows(fleet).get(f"MCP server flaky on {fleet.worker.name}")


def refreshes(fleet: FleetWorker) -> float:
    return scrape(fleet.metrics_url).get("sandfleet_mcp_list_refreshes_total{server=ch}", 0)


def test_a_running_job_keeps_its_tools_while_new_jobs_see_the_change(fleet: FleetWorker) -> None:
    tools = ["ch__change", "ch__doomed", "ch__served"]
    job = fleet.client.submit(
        "Change the tools",
        tools=tools,
        model=fleet.model,
        code_action={"max_tool_calls": 1000},
    )
    assert wait_until(lambda: refreshes(fleet) >= 1, 120, 0.2), fleet.log()[-3000:]  # A changed the server

    # B is admitted while A still runs (A waits for B's call): the worker's catalog is the new one.
    _job, fresh = submit(fleet, "Call the fresh tool", ["ch__fresh"])
    assert fresh.status == JobStatus.SUCCEEDED, (fresh.error, fleet.log()[-3000:])
    assert fresh.result == "fresh here"

    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.log()[-3000:])
    assert result.repairs == 1
    first, second = result.attempts
    assert first.tool_calls[0].tool == "ch__doomed" and first.tool_calls[0].result == "doomed here"
    # The repair ran after B: it still has the tools A was given, ch__doomed included, and no ch__fresh.
    assert result.result["names"] == ["ch__change", "ch__doomed", "ch__served"]
    assert result.result["doomed"] == "ch__doomed failed: Unknown tool: doomed"  # the server's own answer
    assert [c.tool for c in second.tool_calls] == ["ch__doomed"] and not second.tool_calls[0].ok

    _job, gone = submit(fleet, "Change the tools", ["ch__doomed"])
    assert gone.status == JobStatus.REFUSED
    assert "unknown tool ch__doomed" in gone.error.message and "ch__fresh" in gone.error.message


def test_a_program_reads_the_servers_resources_and_nothing_it_did_not_list(fleet: FleetWorker) -> None:
    job, result = submit(
        fleet,
        "Read the resources",
        ["ch__read_resource"],
        code_action={"max_response_bytes": 1024**2},
        approval_tools=["ch__*"],  # every tool of the server gated, but the reader only reads: never
    )

    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.log()[-3000:])
    out = result.result
    assert out["notes"] == "the notes" and out["day"] == "notes of friday"
    kind, message = out["secret://token"]
    assert kind == "ValueError" and "MCP server 'ch' did not list the resource 'secret://token'" in message
    kind, message = out["data://huge.txt"]
    assert "1048576" in message, out["data://huge.txt"]  # the job's reply limit, as for any tool
    calls = [e.data for e in job.audit() if e.kind == "tool_call"]
    assert [c["tool"] for c in calls] == ["ch__read_resource"] * 4
    assert calls[0]["result"]["text"] == "the notes" and calls[0]["ok"]


def test_a_stopped_http_server_is_noticed_by_the_ping_shown_down_and_back_up(
    fleet: FleetWorker, flaky: HttpServer
) -> None:
    _job, first = submit(fleet, "Search the flaky server", ["flaky__search"])  # the servers start with a job
    assert first.status == JobStatus.SUCCEEDED, (first.error, fleet.log()[-3000:])
    assert first.result == {"query": "q"}
    assert wait_until(lambda: (flaky_row(fleet) or {}).get("ok") is True, 60, 0.5), doctor_rows(fleet)
    assert scrape(fleet.metrics_url)[UP] == 1

    flaky.stop()
    assert wait_until(lambda: (flaky_row(fleet) or {}).get("ok") is False, 60, 0.5), doctor_rows(fleet)
    row = flaky_row(fleet)
    assert row is not None and row["detail"].startswith("down for ")
    assert f"cannot connect to {flaky.url}" in row["detail"] and "start the server at" in row["fix"]
    samples = scrape(fleet.metrics_url)
    assert samples[UP] == 0 and samples["sandfleet_mcp_server_up{server=ch}"] == 1
    job, down = submit(fleet, "Search the flaky server", ["flaky__search"])
    assert down.status == JobStatus.FAILED and down.error.kind == "tool_server_unavailable"
    assert "MCP server 'flaky' (tool flaky__search) is down" in down.error.message
    assert not [e for e in job.audit() if e.kind == "model_call"], "refused before any work"

    flaky.start()
    assert wait_until(lambda: (flaky_row(fleet) or {}).get("ok") is True, 60, 0.5), doctor_rows(fleet)
    assert scrape(fleet.metrics_url)[UP] == 1
    assert wait_until(lambda: "; last ping " in (flaky_row(fleet) or {}).get("detail", ""), 60, 0.5)
    _job, again = submit(fleet, "Search the flaky server", ["flaky__search"])
    assert again.status == JobStatus.SUCCEEDED, (again.error, fleet.log()[-3000:])
