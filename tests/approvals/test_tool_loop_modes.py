"""Approvals in shell and chat jobs (and a code-action job suspended twice), through a real worker: real
Redis, real Docker session sandboxes, the replay model over HTTP. ``issue_refund`` is gated (grace 1 s);
the test tools write every real execution to a ledger, so a test proves each call ran exactly once."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import redis
from sandfleet_testing.workers import FleetWorker, WorkerFactory

from sandfleet.core.approvals import ApprovalStatus
from sandfleet.core.contracts import JobStatus
from sandfleet.core.errors import ApprovalWithdrawnError

from .helpers import (
    JOB_TIMEOUT_S,
    approval_env,
    gated_worker,
    ledger,
    own_containers,
    pending_of,
    program,
    wait_for,
)

pytestmark = [pytest.mark.slow]


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


SCRIPTS: dict[str, list[Any]] = {
    "chat-approve": [
        call("lookup_order", order_id="C-1"),
        call("issue_refund", order_id="C-1", amount=25.0),
        'Refunded.\nRESULT: "refunded"',
    ],
    "chat-deny": [call("issue_refund", order_id="C-2", amount=10.0), 'Not refunded.\nRESULT: "denied"'],
    "chat-twice": [
        call("issue_refund", order_id="C-3", amount=3.0),
        call("lookup_order", order_id="C-3"),
        call("issue_refund", order_id="C-4", amount=4.0),
        'RESULT: "both"',
    ],
    "shell-approve": [
        call("sandbox_write_file", path="notes/before.txt", content="written before the wait"),
        call("sandbox_write_file", path="out/report.txt", content="the report"),
        # two links: one out of /workspace (never restored), one inside it (made again)
        call(
            "sandbox_exec", command="ln -s /etc/hostname notes/host.txt && ln -s before.txt notes/latest.txt"
        ),
        call("issue_refund", order_id="S-1", amount=7.0),
        call("sandbox_read_file", path="notes/before.txt"),
        call("sandbox_exec", command="readlink notes/latest.txt && cat notes/latest.txt"),
        'RESULT: "ok"',
    ],
    "shell-deny": [call("issue_refund", order_id="S-2", amount=8.0), 'RESULT: "denied"'],
    "shell-twice": [
        call("sandbox_exec", command="echo first >> a.txt"),
        call("issue_refund", order_id="S-3", amount=3.0),
        call("sandbox_exec", command="echo more >> a.txt"),
        call("issue_refund", order_id="S-4", amount=4.0),
        call("sandbox_read_file", path="a.txt"),
        'RESULT: "both"',
    ],
    "shell-cancel": [
        call("sandbox_write_file", path="draft.txt", content="kept for the wait"),
        call("issue_refund", order_id="S-6", amount=6.0),
        'RESULT: "should not get here"',
    ],
    "shell-planted": [
        call("sandbox_write_file", path="mine.txt", content="genuine"),
        call("issue_refund", order_id="S-5", amount=5.0),
        'RESULT: "should not get here"',
    ],
}
TWICE_PROGRAM = program(
    'a = issue_refund("K-1", 1.0)\n'
    'info = lookup_order("K-1")\n'
    'b = issue_refund("K-2", 2.0)\n'
    'print("RESULT:", json.dumps([a, b, info["paid"]]))\n'
)


def model_of(worker: FleetWorker, name: str) -> str:
    """A replay script answering the job's question ``name`` (written in the worker's scripts folder)."""
    path = Path(worker.scripts_dir) / f"loop-{name}.json"
    if name == "code-twice":
        rules = [{"match": name, "responses": [f"```python\n{TWICE_PROGRAM}```"]}]
    else:
        rules = [{"match": name, "responses": SCRIPTS[name]}]
    path.write_text(json.dumps({"rules": rules}))
    return f"replay:{path}"


def submit(worker: FleetWorker, name: str, mode: str, tools: list[str]) -> Any:
    return worker.client.submit(name, tools=tools, mode=mode, model=model_of(worker, name))


def refunds(worker: FleetWorker, *orders: str) -> list[str]:
    return [
        e["order_id"]
        for e in ledger(worker.fleet.data_dir)
        if e["tool"] == "issue_refund" and e.get("order_id") in orders
    ]


def one_pending(worker: FleetWorker, job: Any, seen: tuple[str, ...] = ()) -> Any:
    """The job's one pending request (not one of ``seen``), once the job is suspended for it."""
    wait_for(lambda: job.status() == JobStatus.AWAITING_APPROVAL, what="the job to be suspended")
    [request] = wait_for(
        lambda: [r for r in pending_of(worker, job.job_id) if r.id not in seen], what="the request"
    )
    return request


@pytest.fixture(scope="module")
def loop_fleet(module_fleet_worker: WorkerFactory) -> FleetWorker:
    return gated_worker(module_fleet_worker, "loop-approvals", approval_env())


@pytest.mark.parametrize("mode", ["chat", "shell"])
def test_an_approved_call_in_a_tool_loop_runs_once_and_the_job_goes_on(
    loop_fleet: FleetWorker, mode: str
) -> None:
    name = f"{mode}-approve"
    tools = ["lookup_order", "issue_refund"]
    job = submit(loop_fleet, name, mode, tools)
    request = one_pending(loop_fleet, job)
    assert request.tool == "issue_refund" and f"{mode} job, turn" in request.program
    wait_for(lambda: own_containers(loop_fleet) == [], 15, what="no container while the person decides")
    order = "C-1" if mode == "chat" else "S-1"
    assert refunds(loop_fleet, order) == []  # not run before the decision
    loop_fleet.client.approve(request.id)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert refunds(loop_fleet, order) == [order]  # once
    calls = [c for t in result.turns for c in t.calls]
    [refund] = [c for c in calls if c.tool == "issue_refund"]
    assert refund.ok and refund.result == f"refund-{order}-{7 if mode == 'shell' else 25}"
    events = job.audit()
    kinds = [e.data["event"] for e in events if e.kind == "approval"]
    assert kinds == ["requested", "resumed", "approved", "executed"]
    assert [e.data["status"] for e in events if e.kind == "state"] == [
        "queued",
        "running",
        "awaiting_approval",
        "running",
        "succeeded",
    ]
    # The gated call announced once, answered once: nothing before it was made again.
    assert [e.data["seq"] for e in events if e.kind == "function_call"] == [c.seq for c in calls]
    if mode == "chat":
        assert [e["tool"] for e in ledger(loop_fleet.fleet.data_dir) if e.get("order_id") == "C-1"] == [
            "lookup_order",
            "issue_refund",
        ]
    else:  # the file written before the suspension is there after it, in a fresh session sandbox
        [read] = [c for c in calls if c.tool == "sandbox_read_file"]
        assert "written before the wait" in json.dumps(read.result)
        sessions = [e.data for e in events if e.kind == "session"]
        assert [s["event"] for s in sessions] == [
            "started",
            "saved",
            "destroyed",
            "started",
            "restored",
            "destroyed",
        ]
        saved, restored = sessions[1], sessions[4]
        assert saved["workspace_sha256"] == restored["workspace_sha256"] and restored["files"] == 2
        assert sessions[0]["container_id"] != sessions[3]["container_id"]
        assert [a.name for a in result.artifacts] == ["report.txt"]  # collected after the resume
        # The model is told, after the approved call's result, what the fresh session lacks.
        [resumed_call] = [e.data for e in events if e.kind == "model_call" and e.attempt == 5]
        [note] = [m["content"] for m in resumed_call["messages"] if m.get("role") == "user"]
        assert note.startswith("Note from the sandbox host") and "2 files" in note
        assert "processes you started" in note and "/tmp" in note
        assert "notes/host.txt (link: not restored)" in note and restored["skipped"] == [
            "notes/host.txt (link: not restored)"
        ]
        assert restored["links"] == 1 and "1 links inside it" in note
        [*_, through] = [c for c in calls if c.tool == "sandbox_exec"]
        assert through.result["stdout"] == "before.txt\nwritten before the wait", through.result
        assert job.artifact("report.txt") == b"the report"


@pytest.mark.parametrize("mode", ["chat", "shell"])
def test_a_denied_call_reaches_the_model_as_a_tool_error(loop_fleet: FleetWorker, mode: str) -> None:
    name = f"{mode}-deny"
    job = submit(loop_fleet, name, mode, ["issue_refund"])
    request = one_pending(loop_fleet, job)
    loop_fleet.client.deny(request.id, "not this week")
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED and result.result == "denied", result.error
    [denied] = result.turns[0].calls
    assert (
        not denied.ok and denied.error_type == "ToolDeniedError" and "not this week" in (denied.error or "")
    )
    order = "C-2" if mode == "chat" else "S-2"
    assert refunds(loop_fleet, order) == []
    # What the model was sent next: the tool message with the denial.
    [second] = [e for e in job.audit() if e.kind == "model_call" and e.attempt == 2]
    tool_messages = [m for m in second.data["messages"] if m.get("role") == "tool"]
    assert tool_messages and tool_messages[-1]["content"].startswith("ToolDeniedError: ")
    assert "not this week" in tool_messages[-1]["content"]


@pytest.mark.parametrize("mode", ["chat", "shell", "code-action"])
def test_a_job_suspended_twice_never_repeats_a_call(loop_fleet: FleetWorker, mode: str) -> None:
    name = f"{mode}-twice" if mode != "code-action" else "code-twice"
    job = submit(loop_fleet, name, mode, ["lookup_order", "issue_refund"])
    first = one_pending(loop_fleet, job)
    loop_fleet.client.approve(first.id)
    second = one_pending(loop_fleet, job, seen=(first.id,))
    assert second.arguments["order_id"] in ("C-4", "S-4", "K-2")
    loop_fleet.client.approve(second.id)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    orders = {"chat": ("C-3", "C-4"), "shell": ("S-3", "S-4"), "code-action": ("K-1", "K-2")}[mode]
    entries = [e for e in ledger(loop_fleet.fleet.data_dir) if e.get("order_id") in orders]
    expected_lookup = {"chat": "C-3", "shell": None, "code-action": "K-1"}[mode]
    assert [(e["tool"], e["order_id"]) for e in entries] == [
        ("issue_refund", orders[0]),
        *([("lookup_order", expected_lookup)] if expected_lookup else []),
        ("issue_refund", orders[1]),
    ]
    states = [e.data["status"] for e in job.audit() if e.kind == "state"]
    assert states.count("awaiting_approval") == 2
    if mode == "code-action":
        assert result.result == ["refund-K-1-1", "refund-K-2-2", 25.0]
    if mode == "shell":  # each command ran once, across two suspensions and three session sandboxes
        [read] = [c for t in result.turns for c in t.calls if c.tool == "sandbox_read_file"]
        assert json.dumps(read.result).count("first") == 1 and json.dumps(read.result).count("more") == 1


def test_a_planted_workspace_archive_is_not_restored(loop_fleet: FleetWorker) -> None:
    """Whoever can write Redis replaces the saved /workspace while the job waits: refused, nothing run."""
    job = submit(loop_fleet, "shell-planted", "shell", ["issue_refund"])
    request = one_pending(loop_fleet, job)
    [saved] = [e.data for e in job.audit() if e.kind == "session" and e.data["event"] == "saved"]
    client = redis.Redis.from_url(loop_fleet.settings.redis_url)
    [key] = [
        k for k in client.scan_iter(match=f"{loop_fleet.settings.key_prefix}*{saved['workspace_sha256']}*")
    ]
    planted = client.get(key)
    assert planted is not None and b"genuine" in planted
    client.set(key, planted.replace(b"genuine", b"planted"))  # same size, other bytes
    loop_fleet.client.approve(request.id)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.FAILED and result.error is not None
    assert result.error.kind == "untrusted_state" and "was changed" in result.error.message
    assert refunds(loop_fleet, "S-5") == []  # the approved call never ran on planted state
    client.close()


def test_waiting_shell_and_chat_jobs_resume_on_another_worker(fleet_worker: WorkerFactory) -> None:
    first = gated_worker(fleet_worker, "first", approval_env())
    shell = submit(first, "shell-approve", "shell", ["lookup_order", "issue_refund"])
    chat = submit(first, "chat-approve", "chat", ["lookup_order", "issue_refund"])
    requests = [one_pending(first, shell), one_pending(first, chat)]
    first.fleet.kill(first.worker, signal.SIGTERM)  # gone: it holds nothing of the waiting jobs
    first.worker.process.wait(timeout=90)
    second = first.fleet.start_worker(wait=False)
    for request in requests:
        first.client.approve(request.id)
    for job, order in ((shell, "S-1"), (chat, "C-1")):
        result = job.result(timeout=JOB_TIMEOUT_S)
        assert result.status == JobStatus.SUCCEEDED, result.error
        assert job.record().worker == second.name != first.worker.name
        assert refunds(first, order) == [order]
    [read] = [c for t in shell.result().turns for c in t.calls if c.tool == "sandbox_read_file"]
    assert "written before the wait" in json.dumps(read.result)


def test_a_cancelled_suspended_shell_job_ends_at_once_and_its_workspace_is_never_restored(
    loop_fleet: FleetWorker,
) -> None:
    """Cancelled while it waits: ended by the cancel watcher with no session made, the request
    withdrawn (an approval then fails), the call never run; the saved archive is left to expire with
    the job's records (docs/approvals.md)."""
    job = submit(loop_fleet, "shell-cancel", "shell", ["issue_refund"])
    request = one_pending(loop_fleet, job)
    [saved] = [e.data for e in job.audit() if e.kind == "session" and e.data["event"] == "saved"]
    job.cancel()
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.CANCELLED, result.error
    assert loop_fleet.client.approval(request.id).status == ApprovalStatus.WITHDRAWN
    with pytest.raises(ApprovalWithdrawnError, match="withdrawn"):
        loop_fleet.client.approve(request.id)
    sessions = [e.data["event"] for e in job.audit() if e.kind == "session"]
    assert sessions == ["started", "saved", "destroyed"]  # no fresh session, nothing restored
    assert refunds(loop_fleet, "S-6") == []
    assert own_containers(loop_fleet) == []
    client = redis.Redis.from_url(loop_fleet.settings.redis_url)
    [key] = client.keys(f"{loop_fleet.settings.key_prefix}*{saved['workspace_sha256']}*")
    ttl = client.ttl(key)
    client.close()
    assert 0 < ttl <= loop_fleet.settings.retention_s  # left, expiring with the records
