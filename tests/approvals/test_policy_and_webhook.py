"""Redaction, a job adding a tool to the policy, the signed webhook, and a batch half of whose jobs
wait: a real worker, real Redis, real sandboxes, a real HTTP server receiving the webhook."""

from __future__ import annotations

import hashlib
import json

import pytest
from sandfleet_testing.workers import FleetWorker

from sandfleet.core.approvals import ApprovalStatus
from sandfleet.core.contracts import JobStatus
from sandfleet.worker.approval.webhook import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature

from .helpers import (
    JOB_TIMEOUT_S,
    WEBHOOK_SECRET,
    Webhook,
    ledger,
    own_containers,
    pending_of,
    sandfleet,
    wait_for,
)

pytestmark = [pytest.mark.slow]


def test_a_job_adds_a_gated_tool_its_secret_argument_is_redacted_and_the_webhook_is_signed(
    approval_fleet: FleetWorker, webhook: Webhook
) -> None:
    client = approval_fleet.client
    # connect_crm is not in the operator's policy: the job adds it (a glob). It cannot remove any.
    job = client.submit(
        "Log in to the CRM", tools=["connect_crm"], approval_tools=["connect_*"], model=approval_fleet.model
    )
    [request] = wait_for(lambda: pending_of(approval_fleet, job.job_id), what="the request")
    assert request.arguments == {"user": "ana", "password": "***"} and request.redacted == ["password"]
    shown = sandfleet(approval_fleet, "approvals", "show", request.id, "--json")
    assert shown.returncode == 0 and "hunter2" not in shown.stdout
    assert json.loads(shown.stdout)["call_sha256"] == request.call_sha256
    text = sandfleet(approval_fleet, "approvals", "show", request.id)
    assert "connect_crm" in text.stdout and 'connect_crm(user="ana"' in text.stdout  # the program shown

    # The webhook: one POST for the request, its HMAC over "timestamp.body" checks with the secret.
    def mine() -> list[tuple[dict[str, str], bytes]]:
        return [(h, b) for h, b in webhook.posts if json.loads(b)["request"]["id"] == request.id]

    [(headers, body)] = wait_for(mine, 20, what="the webhook")
    timestamp = headers[TIMESTAMP_HEADER.lower()]
    assert headers[SIGNATURE_HEADER.lower()] == signature(WEBHOOK_SECRET, timestamp, body)
    assert headers[SIGNATURE_HEADER.lower()] != signature("another secret", timestamp, body)
    assert headers[SIGNATURE_HEADER.lower()] != signature(WEBHOOK_SECRET, timestamp, body + b" ")
    payload = json.loads(body)
    assert payload["event"] == "approval.requested" and b"hunter2" not in body
    assert payload["request"]["arguments"]["password"] == "***"

    # Approved with the hash the approver saw: the tool gets the real password.
    bad = sandfleet(approval_fleet, "approvals", "approve", request.id, "--sha256", "0" * 64)
    assert bad.returncode == 1 and "hash" in bad.stderr
    client.approve(request.id, call_sha256=request.call_sha256)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == {"token": hashlib.sha256(b"ana:hunter2").hexdigest()[:12]}

    # Redacted wherever a person or an outside system sees the call: every audit event, the result's
    # records, `result --json`, `audit --json`; the chain keeps the whole call's digest.
    events = job.audit()
    assert all("hunter2" not in json.dumps(e.data) for e in events)
    [call] = [e.data for e in events if e.kind == "tool_call" and e.data["tool"] == "connect_crm"]
    assert call["kwargs"] == {"user": "ana", "password": "***"} and call["redacted"] == ["password"]
    assert call["call_sha256"] == request.call_sha256  # the hash the approver signed: what ran
    assert "hunter2" not in result.model_dump_json()
    for command in (["result", job.job_id, "--json"], ["audit", job.job_id, "--json"]):
        shown = sandfleet(approval_fleet, *command)
        assert shown.returncode == 0 and "hunter2" not in shown.stdout, shown.stderr
    # The chain still proves what ran: a replay matches the redacted call by its digest.
    replay = sandfleet(approval_fleet, "replay", job.job_id, "--json")
    assert replay.returncode == 0 and json.loads(replay.stdout)["match"] is True, replay.stdout


def test_a_password_passed_by_position_or_by_a_chat_model_is_redacted_and_replay_still_matches(
    approval_fleet: FleetWorker,
) -> None:
    client = approval_fleet.client
    job = client.submit("Log in by position", tools=["connect_crm"], model=approval_fleet.model)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == {"token": hashlib.sha256(b"ana:hunter2").hexdigest()[:12]}  # the tool got it
    [record] = result.attempts[-1].tool_calls
    assert record.args == ["ana", "***"] and record.redacted == ["password"]
    assert all("hunter2" not in json.dumps(e.data) for e in job.audit())
    replay = sandfleet(approval_fleet, "replay", job.job_id, "--json")
    assert replay.returncode == 0 and json.loads(replay.stdout)["match"] is True, replay.stdout

    chat_model = f"replay:{approval_fleet.scripts_dir / 'chat-login.json'}"
    chat = client.submit("chat: log in", tools=["connect_crm"], mode="chat", model=chat_model)
    answered = chat.result(timeout=JOB_TIMEOUT_S)
    assert answered.status == JobStatus.SUCCEEDED and answered.result == "ok", answered.error
    [called] = answered.turns[0].calls
    assert called.ok and json.loads(called.arguments) == {"user": "ana", "password": "***"}
    assert called.redacted == ["password"] and called.arguments_sha256
    kinds = {e.kind for e in chat.audit()}
    assert {"function_call", "function_result", "model_call"} <= kinds
    assert all("hunter2" not in json.dumps(e.data) for e in chat.audit())
    assert "hunter2" not in sandfleet(approval_fleet, "audit", chat.job_id, "--json").stdout


def test_a_batch_where_half_the_jobs_wait_for_approval(approval_fleet: FleetWorker) -> None:
    client, data = approval_fleet.client, approval_fleet.fleet.data_dir
    refunds_before = sum(e["tool"] == "issue_refund" for e in ledger(data))
    specs = [
        {
            "question": "Refund order one" if i % 2 else "Look up order five",
            "model": approval_fleet.model,
            "tools": ["lookup_order", "issue_refund"],
        }
        for i in range(6)
    ]
    batch = client.submit_batch(specs)
    waiting = [j for i, j in enumerate(batch.jobs()) if i % 2]
    wait_for(
        lambda: (
            batch.progress().counts.get("awaiting_approval") == 3
            and batch.progress().counts.get("succeeded") == 3
        ),
        what="three jobs done and three waiting",
    )
    wait_for(lambda: own_containers(approval_fleet) == [], 10, what="no container while they wait")
    listed = sandfleet(approval_fleet, "jobs", "--batch", batch.batch_id)
    assert listed.stdout.count("awaiting_approval") == 3
    for job in waiting:
        [request] = pending_of(approval_fleet, job.job_id)
        client.approve(request.id)
    results = batch.wait(timeout=JOB_TIMEOUT_S)
    assert [r.status for r in results] == [JobStatus.SUCCEEDED] * 6
    assert sum(e["tool"] == "issue_refund" for e in ledger(data)) == refunds_before + 3
    assert all(
        client.approval(r.id).status == ApprovalStatus.EXECUTED
        for job in waiting
        for r in client.approvals(job_id=job.job_id)
    )


@pytest.mark.parametrize("mode", ["chat", "shell"])
def test_a_gated_call_with_a_secret_in_a_tool_loop_is_redacted_for_the_approver_and_the_webhook(
    approval_fleet: FleetWorker, webhook: Webhook, mode: str
) -> None:
    """The model's function call carries the password; the request, `approvals show` and the webhook
    hide it, the tool gets it, the audit keeps the arguments' digest (what the approver signed ran)."""
    question = f"{mode}: gated login"
    script = approval_fleet.scripts_dir / f"gated-login-{mode}.json"
    login = {"name": "connect_crm", "arguments": {"user": "ana", "password": "hunter2"}}
    rule = {"match": question, "responses": [{"tool_calls": [login]}, 'RESULT: "in"']}
    script.write_text(json.dumps({"rules": [rule]}))
    job = approval_fleet.client.submit(
        question, tools=["connect_crm"], approval_tools=["connect_crm"], mode=mode, model=f"replay:{script}"
    )
    [request] = wait_for(lambda: pending_of(approval_fleet, job.job_id), what="the request")
    assert request.arguments == {"user": "ana", "password": "***"} and request.redacted == ["password"]
    for shown in (
        sandfleet(approval_fleet, "approvals", "show", request.id, "--json"),
        sandfleet(approval_fleet, "approvals", "show", request.id),
    ):
        assert shown.returncode == 0 and "connect_crm" in shown.stdout and "hunter2" not in shown.stdout
    posts = wait_for(
        lambda: [b for _h, b in webhook.posts if json.loads(b)["request"]["id"] == request.id],
        20,
        what="the webhook",
    )
    assert all(b"hunter2" not in body for body in posts)
    assert json.loads(posts[0])["request"]["arguments"]["password"] == "***"

    approval_fleet.client.approve(request.id, call_sha256=request.call_sha256)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED and result.result == "in", result.error
    [called] = result.turns[0].calls
    assert called.ok and called.result == hashlib.sha256(b"ana:hunter2").hexdigest()[:12]  # it got the secret
    assert json.loads(called.arguments) == {"user": "ana", "password": "***"} and called.arguments_sha256
    events = job.audit()
    assert all("hunter2" not in json.dumps(e.data) for e in events)
    [announced] = [e.data for e in events if e.kind == "function_call"]
    assert announced["redacted"] == ["password"]
    assert (
        announced["arguments_sha256"]
        == called.arguments_sha256
        == hashlib.sha256(json.dumps(login["arguments"]).encode()).hexdigest()
    )
    [asked] = [e.data for e in events if e.kind == "approval" and e.data["event"] == "requested"]
    assert asked["call_sha256"] == request.call_sha256
    for command in (["result", job.job_id, "--json"], ["audit", job.job_id, "--json"]):
        shown = sandfleet(approval_fleet, *command)
        assert shown.returncode == 0 and "hunter2" not in shown.stdout, shown.stderr
