"""Approve, deny, approve twice, decide too late: a real worker, real Redis, real Docker sandboxes,
the replay model over HTTP. The test tools write every real execution to a ledger."""

from __future__ import annotations

import json

import pytest
from sandfleet_testing.workers import FleetWorker

from sandfleet.core.approvals import ApprovalStatus
from sandfleet.core.approvers import ApproversFile, load_approver_key
from sandfleet.core.contracts import JobStatus
from sandfleet.core.decisions import SignedDecision
from sandfleet.core.errors import ApprovalDecidedError, ApprovalNotFoundError, ApprovalWithdrawnError

from .helpers import JOB_TIMEOUT_S, approval_events, ledger, own_containers, pending_of, sandfleet, wait_for

pytestmark = [pytest.mark.slow]


def test_an_approved_call_runs_once_after_the_job_was_suspended_without_a_container(
    approval_fleet: FleetWorker,
) -> None:
    client, data = approval_fleet.client, approval_fleet.fleet.data_dir
    job = client.submit(
        "Refund order one", tools=["lookup_order", "issue_refund"], model=approval_fleet.model
    )
    wait_for(lambda: job.status() == JobStatus.AWAITING_APPROVAL, what="the job to be suspended")
    # No container is held while a person decides (its removal runs in the background: a moment).
    wait_for(lambda: own_containers(approval_fleet) == [], 10, what="the suspended run's container to go")
    [request] = pending_of(approval_fleet, job.job_id)
    assert request.tool == "issue_refund" and request.arguments == {"order_id": "O-1", "amount": 25.0}
    assert "issue_refund" in request.program and request.question == "Refund order one"
    assert [e["tool"] for e in ledger(data)] == ["lookup_order"]  # the gated call has not run

    listed = sandfleet(approval_fleet, "approvals", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert request.id in [json.loads(line)["id"] for line in listed.stdout.splitlines()]
    jobs = sandfleet(approval_fleet, "jobs", "--json")
    assert {"job_id": job.job_id, "status": "awaiting_approval"}.items() <= next(
        json.loads(line) for line in jobs.stdout.splitlines() if job.job_id in line
    ).items()

    approved = sandfleet(approval_fleet, "approvals", "approve", request.id, "--by", "ana")
    assert approved.returncode == 0, approved.stderr
    result = job.result(timeout=JOB_TIMEOUT_S)  # verified against its chain
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == {"refund": "refund-O-1-25", "paid": 25.0}
    # lookup_order ran once (the resumed program was served its recorded result), the refund once.
    assert [e["tool"] for e in ledger(data)] == ["lookup_order", "issue_refund"]
    decided = client.approval(request.id)
    assert decided.status == ApprovalStatus.EXECUTED and decided.decided_by == "ana" and decided.decided_at

    # Who approved is proven: ana's key signed exactly this job, request and call; the chain holds it.
    ana = load_approver_key(approval_fleet.approvers.keys["ana"])
    [approval] = [e for e in job.audit() if e.kind == "approval" and e.data["event"] == "approved"]
    assert approval.data["by"] == "ana" and approval.data["key_id"] == ana.key_id and approval.data["signed"]
    signed = SignedDecision.model_validate(approval.data["decision"])
    assert (signed.decision.job_id, signed.decision.request_id) == (job.job_id, request.id)
    assert signed.decision.call_sha256 == request.call_sha256 and signed.decision.decision == "approved"
    assert (
        ApproversFile(approval_fleet.approvers.file)
        .ring()
        .check(ana.key_id, signed.decision.message(), signed.signature)
        is None
    )  # an auditor re-checks it with the approvers file alone

    events = job.audit()
    assert approval_events(events) == [
        ("requested", "issue_refund"),
        ("resumed", ""),
        ("approved", "issue_refund"),
        ("executed", "issue_refund"),  # signed before its outcome is stored: what a re-run may be served
    ]
    assert [e.data["status"] for e in events if e.kind == "state"] == [
        "queued",
        "running",
        "awaiting_approval",
        "running",
        "succeeded",
    ]
    [refund_call] = [e for e in events if e.kind == "tool_call" and e.data["tool"] == "issue_refund"]
    assert refund_call.data["approval_id"] == request.id and refund_call.data["ok"]

    # The same request approved again: a clear error, nothing runs.
    with pytest.raises(ApprovalDecidedError, match="approved by ana"):
        client.approve(request.id)
    again = sandfleet(approval_fleet, "approvals", "approve", request.id)
    assert again.returncode == 1 and "refused" in again.stderr
    with pytest.raises(ApprovalNotFoundError):
        client.approve("apr-00000000000000000000")
    assert [e["tool"] for e in ledger(data)] == ["lookup_order", "issue_refund"]

    # Replayed from the chain: the approved call's recorded result, the same RESULT.
    replay = sandfleet(approval_fleet, "replay", job.job_id, "--json")
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert json.loads(replay.stdout)["match"] is True
    assert [e["tool"] for e in ledger(data)] == ["lookup_order", "issue_refund"]


def test_a_denial_raises_tool_denied_error_in_the_program_with_the_reason(
    approval_fleet: FleetWorker,
) -> None:
    client, data = approval_fleet.client, approval_fleet.fleet.data_dir
    before = len(ledger(data))
    job = client.submit("Refund order two", tools=["issue_refund"], model=approval_fleet.model)
    wait_for(lambda: pending_of(approval_fleet, job.job_id), what="the request")
    [request] = pending_of(approval_fleet, job.job_id)
    bo_key = str(approval_fleet.approvers.keys["bo"])
    denied = sandfleet(
        approval_fleet, "approvals", "deny", request.id, "--reason", "duplicate refund", "--key", bo_key
    )
    assert denied.returncode == 0, denied.stderr
    assert "signed by key" in denied.stdout
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result["type"] == "ToolDeniedError" and result.result["permission"] is True
    # bo, named by the approvers file for the key that signed (no --by given: the name is not typed in)
    assert "denied by bo: duplicate refund" in result.result["denied"]
    assert len(ledger(data)) == before  # the refund never ran
    assert ("denied", "issue_refund") in approval_events(job.audit())
    [denial] = [e for e in job.audit() if e.kind == "approval" and e.data["event"] == "denied"]
    assert denial.data["by"] == "bo" and denial.data["decision"]["decision"]["decision"] == "denied"
    [call] = [c for a in result.attempts for c in a.tool_calls if c.tool == "issue_refund"]
    assert not call.ok and call.error_type == "ToolDeniedError"
    with pytest.raises(ApprovalDecidedError):
        client.approve(request.id)
    assert len(ledger(data)) == before


def test_a_decision_after_the_job_timed_out_is_refused_and_the_call_never_runs(
    patient_fleet: FleetWorker,
) -> None:
    client, data = patient_fleet.client, patient_fleet.fleet.data_dir
    before = len(ledger(data))
    # The gated call waits in a thread (its grace is 10 s) while the program runs past its 1 s: the job
    # ends timed out with the request undecided.
    job = client.submit(
        "Refund too late",
        tools=["issue_refund"],
        model=patient_fleet.model,
        code_action={"exec_timeout": 1, "max_repairs": 0},
    )
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.TIMED_OUT, result.error
    [request] = client.approvals(job_id=job.job_id)
    assert request.status == ApprovalStatus.WITHDRAWN
    seal = job.audit()[-1]
    assert seal.data["approvals_withdrawn"] == [{"id": request.id, "was": "pending"}]
    with pytest.raises(ApprovalWithdrawnError, match="has ended"):
        client.approve(request.id)
    late = sandfleet(patient_fleet, "approvals", "approve", request.id)
    assert late.returncode == 1 and "withdrawn" in late.stderr
    assert len(ledger(data)) == before  # nothing ran late


def test_a_call_nobody_decides_times_out_as_a_denial_while_it_waits(patient_fleet: FleetWorker) -> None:
    client, data = patient_fleet.client, patient_fleet.fleet.data_dir
    before = len(ledger(data))
    job = client.submit("Refund order two", tools=["issue_refund"], model=patient_fleet.model)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result["type"] == "ToolDeniedError" and "timed out" in result.result["denied"]
    [request] = client.approvals(job_id=job.job_id)
    assert request.status == ApprovalStatus.TIMED_OUT and request.decided_by == "timeout"
    with pytest.raises(ApprovalDecidedError, match="timed out"):
        client.approve(request.id)
    assert len(ledger(data)) == before
    assert ("timed_out", "issue_refund") in approval_events(job.audit())


def test_a_suspended_job_whose_request_times_out_resumes_with_the_denial(quick_fleet: FleetWorker) -> None:
    client, data = quick_fleet.client, quick_fleet.fleet.data_dir
    before = len(ledger(data))
    job = client.submit("Refund order two", tools=["issue_refund"], model=quick_fleet.model)
    wait_for(lambda: job.status() == JobStatus.AWAITING_APPROVAL, what="the job to be suspended")
    result = job.result(timeout=JOB_TIMEOUT_S)  # the workers' sweep times the request out: the job resumes
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result["type"] == "ToolDeniedError" and "timed out" in result.result["denied"]
    assert len(ledger(data)) == before
    with pytest.raises(ApprovalDecidedError):
        client.approve(client.approvals(job_id=job.job_id)[0].id)


def test_cancelling_a_suspended_job_withdraws_its_request_and_the_call_never_runs(
    approval_fleet: FleetWorker,
) -> None:
    """Cancel (issue 13) meets approvals (issue 16): a job that waits in Redis for a person, with no
    container and no worker holding it, ends ``cancelled``; the request is withdrawn, so a late
    approval is refused and the gated tool never runs."""
    client, data = approval_fleet.client, approval_fleet.fleet.data_dir
    before = len(ledger(data))
    job = client.submit(
        "Refund order one", tools=["lookup_order", "issue_refund"], model=approval_fleet.model
    )
    wait_for(lambda: job.status() == JobStatus.AWAITING_APPROVAL, what="the job to be suspended")
    [request] = pending_of(approval_fleet, job.job_id)

    cancelled = sandfleet(approval_fleet, "cancel", job.job_id)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    wait_for(lambda: job.status() == JobStatus.CANCELLED, what="the suspended job to end cancelled")
    assert client.approval(request.id).status == ApprovalStatus.WITHDRAWN
    with pytest.raises(ApprovalWithdrawnError):
        client.approve(request.id)
    assert [e["tool"] for e in ledger(data)[before:]] == ["lookup_order"]  # the refund never ran
    assert own_containers(approval_fleet) == []
    assert [e.data["status"] for e in job.audit() if e.kind == "state"][-2:] == [
        "awaiting_approval",
        "cancelled",
    ]
