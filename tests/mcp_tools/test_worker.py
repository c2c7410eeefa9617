"""MCP tools through the whole fleet: a real ``sandfleet worker`` (SANDFLEET_MCP_CONFIG) on a real Redis, jobs
submitted through the Client, programs written by the replay model (an HTTP server speaking the
OpenAI API), run in Docker sandboxes, calling real MCP servers: mcp-server-time and mcp-server-git
from PyPI over stdio, the tests' lab server over stdio (the reference orders) and streamable HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from sandfleet_testing.workers import JOB_TIMEOUT_S, SANDFLEET, FleetWorker, WorkerFactory, stop_worker

from sandfleet.core.contracts import JobStatus

from .helpers import LAB, HttpServer, git, make_repo, stdio, third_party, write_config

TIME_QUESTION = "What time is it in UTC when it is noon in Tokyo?"
COMMIT_QUESTION = "Commit the notes file"
ALLOW_QUESTION = "Read the git log without being allowed to"
BOTH_QUESTION = "Stats over HTTP beside the time"
BREAK_QUESTION = "Break the orders server"


def block(source: str) -> str:
    return f"```python\n{source.strip()}\n```"


def script(repo: Path) -> dict[str, object]:
    from sandfleet.worker.tools.examples.scenario import REFERENCE_PROGRAM

    reference = REFERENCE_PROGRAM.replace("load_orders()", "orders__load_orders()")
    commit = f"""
from sandfleet_tools import git__git_add, git__git_commit
git__git_add({str(repo)!r}, ["notes.txt"])
print(git__git_commit({str(repo)!r}, "Add the notes"))
raise RuntimeError("something failed after the commit")
"""
    repaired = f"""
import json
from sandfleet_tools import git__git_add, git__git_commit
git__git_add({str(repo)!r}, ["notes.txt"])
print("RESULT: " + json.dumps(git__git_commit({str(repo)!r}, "Add the notes")))
"""
    return {
        "rules": [
            {
                "match": "noon in Tokyo",
                "responses": [
                    block("""
import json
from sandfleet_tools import time__convert_time
r = time__convert_time(source_timezone="Asia/Tokyo", time="12:00", target_timezone="UTC")
print("RESULT: " + json.dumps(r["target"]["datetime"][11:16]))
""")
                ],
            },
            {"match": "(?i)revenue per region", "responses": [block(reference)]},
            {"match": "Commit the notes", "responses": [block(commit), block(repaired)]},
            {
                "match": "without being allowed",
                "responses": [
                    block(f"""
import json
from sandfleet_tools import _call
try:
    _call("git__git_log", [{str(repo)!r}], {{}})
    outcome = "ran"
except NameError as e:
    outcome = str(e)
print("RESULT: " + json.dumps(outcome))
""")
                ],
            },
            {
                "match": "Break the orders server",
                "responses": [
                    block("""
import json
from sandfleet_tools import orders__crash, orders__garbled, orders__wait, ToolError
out = {}
for name, call in (("garbled", orders__garbled), ("hang", lambda: orders__wait(30)), ("crash", orders__crash)):
    try:
        call()
        out[name] = "returned"
    except (ToolError, TimeoutError) as e:
        out[name] = type(e).__name__
print("RESULT: " + json.dumps(out))
""")
                ],
            },
            {
                "match": "Stats over HTTP",
                "responses": [
                    block("""
import json
from sandfleet_tools import lab__stats, time__get_current_time
print("RESULT: " + json.dumps([lab__stats([2, 4])["mean"], time__get_current_time("UTC")["timezone"]]))
""")
                ],
            },
        ],
        "default": [block('print("RESULT: no rule matched")')],
    }


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The git repository the fleet's git server works on, with a file to commit."""
    made = make_repo(tmp_path_factory.mktemp("mcp-repo") / "repo")
    (made / "notes.txt").write_text("notes to commit\n")
    return made


@pytest.fixture(scope="module")
def mcp_fleet(
    module_fleet_worker: WorkerFactory,
    lab_http: HttpServer,
    lab_data: Path,
    repo: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> FleetWorker:
    folder = tmp_path_factory.mktemp("mcp-fleet")
    config = write_config(
        folder,
        {
            "time": third_party("mcp-server-time", "--local-timezone", "UTC"),
            "git": third_party("mcp-server-git", "--repository", str(repo), sideEffects=["git_commit"]),
            "orders": stdio(LAB, "--data", str(lab_data)),
            "lab": {"url": lab_http.url},
            "down": {"command": str(folder / "no-such-server")},
        },
    )
    return module_fleet_worker(
        "mcp-fleet",
        script=script(repo),
        env={
            "SANDFLEET_MCP_CONFIG": str(config),
            "SANDFLEET_TRANSIENT_RETRIES": "1",
            "SANDFLEET_TRANSIENT_BACKOFF_S": "0.2",
        },
    )


def submit(fleet: FleetWorker, question: str, tools: list[str], **options: object) -> tuple[object, object]:
    job = fleet.client.submit(question, tools=tools, model=fleet.model, **options)
    return job, job.result(timeout=JOB_TIMEOUT_S)


def test_a_pypi_servers_tool_answers_a_job_through_the_fleet(mcp_fleet: FleetWorker) -> None:
    job, result = submit(mcp_fleet, TIME_QUESTION, ["time__convert_time"])
    assert result.status == JobStatus.SUCCEEDED, (result.error, mcp_fleet.log()[-3000:])
    assert result.result == "03:00"
    [call] = [e for e in job.audit() if e.kind == "tool_call"]
    assert call.data["tool"] == "time__convert_time" and call.data["ok"]
    assert call.data["kwargs"] == {"source_timezone": "Asia/Tokyo", "time": "12:00", "target_timezone": "UTC"}
    assert call.data["result"]["target"]["timezone"] == "UTC"
    assert job.verify_audit() == (True, None)


def test_the_reference_scenario_served_by_an_mcp_server_gives_the_exact_totals(
    mcp_fleet: FleetWorker,
) -> None:
    from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_QUESTION

    job, result = submit(mcp_fleet, REFERENCE_QUESTION, ["orders__load_orders"])
    assert result.status == JobStatus.SUCCEEDED, (result.error, mcp_fleet.log()[-3000:])
    assert result.result == REFERENCE_ANSWER and list(result.result) == list(REFERENCE_ANSWER)
    assert result.result == {"North America": 108664.0, "LATAM": 81328.0, "EMEA": 77689.0, "APAC": 65023.0}
    [call] = [e for e in job.audit() if e.kind == "tool_call"]
    assert call.data["tool"] == "orders__load_orders" and len(call.data["result"]) == 500


def test_the_finished_job_replays_from_its_audit_record(mcp_fleet: FleetWorker) -> None:
    from sandfleet.worker.tools.examples.scenario import REFERENCE_QUESTION

    job, result = submit(mcp_fleet, REFERENCE_QUESTION, ["orders__load_orders"])
    assert result.status == JobStatus.SUCCEEDED
    settings = mcp_fleet.settings
    env = {
        **os.environ,
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
    }
    done = subprocess.run(
        [SANDFLEET, "replay", job.job_id, "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    replayed = json.loads(done.stdout)
    assert replayed["match"] is True and replayed["replayed"] == result.result


def test_a_side_effecting_mcp_tool_is_not_repeated_by_a_repair(mcp_fleet: FleetWorker, repo: Path) -> None:
    before = git(repo, "rev-list", "--count", "HEAD").strip()
    _job, result = submit(mcp_fleet, COMMIT_QUESTION, ["git__git_add", "git__git_commit"])
    assert result.status == JobStatus.SUCCEEDED, (result.error, mcp_fleet.log()[-3000:])
    assert result.repairs == 1
    first, second = result.attempts
    commits = [c for c in first.tool_calls + second.tool_calls if c.tool == "git__git_commit"]
    assert [c.replayed for c in commits] == [False, True], "the repair got the earlier commit's result"
    assert commits[0].result == commits[1].result == result.result
    assert int(git(repo, "rev-list", "--count", "HEAD")) == int(before) + 1, "exactly one commit"
    assert git(repo, "log", "-1", "--format=%s").strip() == "Add the notes"


def test_an_mcp_tool_outside_the_jobs_allow_list_is_refused_on_the_host(mcp_fleet: FleetWorker) -> None:
    job, result = submit(mcp_fleet, ALLOW_QUESTION, ["time__get_current_time"])
    assert result.status == JobStatus.SUCCEEDED, (result.error, mcp_fleet.log()[-3000:])
    assert result.result == (
        "tool 'git__git_log' is not allowed for this job; allowed tools: time__get_current_time"
    )
    [call] = [e for e in job.audit() if e.kind == "tool_call"]
    assert call.data["tool"] == "git__git_log" and call.data["error_type"] == "NameError"


def test_stdio_and_http_servers_serve_one_job(mcp_fleet: FleetWorker) -> None:
    _job, result = submit(mcp_fleet, BOTH_QUESTION, ["lab__stats", "time__get_current_time"])
    assert result.status == JobStatus.SUCCEEDED, (result.error, mcp_fleet.log()[-3000:])
    assert result.result == [3.0, "UTC"]


def test_a_job_naming_a_tool_of_a_server_that_is_down_fails_fast_naming_it(mcp_fleet: FleetWorker) -> None:
    job, result = submit(mcp_fleet, TIME_QUESTION, ["time__convert_time", "down__anything"])
    assert result.status == JobStatus.FAILED
    assert result.error.kind == "tool_server_unavailable"
    assert "MCP server 'down' (tool down__anything) is down: cannot start" in result.error.message
    assert "(after 1 retries)" in result.error.message
    events = job.audit()
    retried = [
        e for e in events if e.kind == "state" and e.data.get("status") == "queued" and "retry" in e.data
    ]
    assert len(retried) == 1 and retried[0].data["error"].startswith(
        "tool server unavailable: MCP server 'down'"
    )
    assert not [e for e in events if e.kind == "model_call"], "no model call: it failed before any work"


def test_an_unknown_mcp_tool_of_a_server_that_is_up_is_refused(mcp_fleet: FleetWorker) -> None:
    _job, result = submit(mcp_fleet, TIME_QUESTION, ["time__no_such_tool"])
    assert result.status == JobStatus.REFUSED
    assert "unknown tool time__no_such_tool" in result.error.message


def test_a_misbehaving_server_gives_the_program_bounded_errors_and_the_audit_a_record(
    mcp_fleet: FleetWorker,
) -> None:
    tools = ["orders__crash", "orders__garbled", "orders__wait"]
    job, result = submit(mcp_fleet, BREAK_QUESTION, tools, code_action={"tool_timeout": 2})
    assert result.status == JobStatus.SUCCEEDED, (result.error, mcp_fleet.log()[-3000:])
    assert result.result == {"garbled": "ToolServerError", "hang": "TimeoutError", "crash": "ToolServerError"}
    calls = {e.data["tool"]: e.data for e in job.audit() if e.kind == "tool_call"}
    assert "answered garbled unreadably" in calls["orders__garbled"]["error"]
    assert calls["orders__wait"]["error"].startswith("MCP server 'orders' did not answer wait within 2 s")
    assert "MCP server 'orders' failed during the call to crash" in calls["orders__crash"]["error"]
    assert all(not c["ok"] for c in calls.values()) and mcp_fleet.alive()
    assert result.timings["run_s"] < 15, "nothing waited past the per-call timeout"


def test_stopping_the_worker_stops_its_mcp_servers(mcp_fleet: FleetWorker) -> None:
    import time

    import psutil

    _job, result = submit(
        mcp_fleet, TIME_QUESTION, ["time__convert_time"]
    )  # the servers start with a first job
    assert result.status == JobStatus.SUCCEEDED
    worker = psutil.Process(mcp_fleet.process.pid)

    def server_names() -> list[str]:
        return sorted(Path(p.cmdline()[1]).name for p in worker.children() if len(p.cmdline()) > 1)

    deadline = time.monotonic() + 20  # the orders server may be coming back from the crash test's crash
    while len(server_names()) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_names() == ["lab.py", "mcp-server-git", "mcp-server-time"]  # lab over HTTP: the test's
    servers = worker.children(recursive=True)  # with theirs (mcp-server-git's `git cat-file`)
    stop_worker(mcp_fleet)
    deadline = time.monotonic() + 10
    while (
        any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in servers)
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert not [p for p in servers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
