"""Hostile decisions, through a real worker: whoever can write Redis writes a decision without a
signature, signs one with a key the approvers file does not list or has revoked, gets a genuine one
signed for another call or copies one from another request, or edits one after it was signed. The
worker refuses each before the call runs (the ledger of real executions proves it), tells the
program why (ToolDeniedError), and records the refusal in the job's chain. Then the two settings:
no approvers file (a job naming a gated tool is refused before it starts) and unsigned decisions
allowed (accepted, recorded as unsigned; a signature that does not hold is still refused)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
from sandfleet_testing.workers import FleetWorker, WorkerFactory

from sandfleet.core.approvals import ApprovalRequest
from sandfleet.core.approvers import load_approver_key, make_approver_key
from sandfleet.core.contracts import JobStatus
from sandfleet.core.decisions import sign_decision
from sandfleet.core.errors import ApprovalUnverifiedError
from sandfleet.core.redis_keys import FleetKeys

from .helpers import JOB_TIMEOUT_S, approval_env, gated_worker, ledger, pending_of, sandfleet, wait_for

pytestmark = [pytest.mark.slow]
OTHER_CALL_SHA256 = "ab" * 32


@pytest.fixture(scope="module")
def guarded(module_fleet_worker: WorkerFactory) -> FleetWorker:
    """A worker whose gated calls wait in their program (grace 30 s) while the attacker writes."""
    env = approval_env(SANDFLEET_APPROVAL_GRACE_S="30", SANDFLEET_APPROVAL_TIMEOUT_S="90")
    return gated_worker(module_fleet_worker, "guarded", env)


def waiting(fleet: FleetWorker) -> tuple[Any, ApprovalRequest]:
    """A job whose ``issue_refund("O-2", 10.0)`` waits for a decision (the program catches a denial)."""
    job = fleet.client.submit("Refund order two", tools=["issue_refund"], model=fleet.model)
    [request] = wait_for(lambda: pending_of(fleet, job.job_id), what="the request")
    return job, request


def write(fleet: FleetWorker, target: ApprovalRequest, **fields: str) -> None:
    """What whoever can write Redis does: HSET on the request, no script, no key."""
    client = redis.Redis.from_url(fleet.settings.redis_url, decode_responses=True)
    client.hset(FleetKeys(fleet.settings.key_prefix).approval(target.id), mapping=fields)
    client.close()


def refused(fleet: FleetWorker, job: Any, request: ApprovalRequest, refunds_before: int) -> str:
    """The job ends with its program told why, the refund never ran, the chain records the refusal;
    returns the refusal's text."""
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result["type"] == "ToolDeniedError", result.result
    assert sum(e["tool"] == "issue_refund" for e in ledger(fleet.fleet.data_dir)) == refunds_before
    approvals = [e.data for e in job.audit() if e.kind == "approval"]
    assert [a["event"] for a in approvals] == ["requested", "refused"]  # never "approved"
    problem = approvals[1]["problem"]
    assert problem in result.result["denied"] and fleet.client.approval(request.id).refused == problem
    return str(problem)


def refunds(fleet: FleetWorker) -> int:
    return sum(e["tool"] == "issue_refund" for e in ledger(fleet.fleet.data_dir))


def test_a_decision_written_straight_to_redis_without_a_signature_is_refused(guarded: FleetWorker) -> None:
    before = refunds(guarded)
    job, request = waiting(guarded)
    write(guarded, request, status="approved", decided_by="ana", decided_at="1")
    problem = refused(guarded, job, request, before)
    assert problem.startswith(f"decision for job {job.job_id} request {request.id} is not signed: refused")
    shown = sandfleet(guarded, "approvals", "show", request.id)
    assert "refused:" in shown.stdout and "is not signed" in shown.stdout


def test_a_decision_signed_by_a_key_the_approvers_file_does_not_list_is_refused(
    guarded: FleetWorker, tmp_path: Path
) -> None:
    before = refunds(guarded)
    mallory = make_approver_key(tmp_path / "mallory.pem")  # a real key, never added by the operator
    job, request = waiting(guarded)
    guarded.client.approve(request.id, key=mallory, by="ana")  # claims to be ana
    problem = refused(guarded, job, request, before)
    approvers_file = guarded.approvers.file
    assert problem == (
        f"decision for job {job.job_id} request {request.id} is signed by key {mallory.key_id}, which is "
        f"not in the approvers file {approvers_file}: refused"
    )


def test_a_genuine_decision_signed_for_another_call_is_refused(guarded: FleetWorker) -> None:
    """The attacker rewrites the request ana reads (another call, its hash): the client refuses it
    (not the request the worker signed); if ana signs what she was shown regardless, the worker
    compares the signed hash with the call the program is making."""
    before = refunds(guarded)
    job, request = waiting(guarded)
    shown = json.loads(request.static_json()) | {
        "arguments": {"order_id": "O-3", "amount": 1.0},
        "call_sha256": OTHER_CALL_SHA256,
    }
    write(guarded, request, request=json.dumps(shown), call_sha256=OTHER_CALL_SHA256)
    with pytest.raises(ApprovalUnverifiedError, match="call_sha256 differ from what the worker signed"):
        guarded.client.approve(request.id)  # the client's own check sees the rewrite
    approved = guarded.client.approve(request.id, trust_unverified_request=True)  # ana's key, unchecked
    assert approved.call_sha256 == OTHER_CALL_SHA256
    problem = refused(guarded, job, request, before)
    assert (
        f"was signed for the call with SHA-256 {OTHER_CALL_SHA256[:16]}..., not the pending call" in problem
    )


def test_a_decision_replayed_from_another_request_is_refused(guarded: FleetWorker) -> None:
    before = refunds(guarded)
    first, first_request = waiting(guarded)
    guarded.client.approve(first_request.id)  # genuine, for the first job: its refund runs
    assert first.result(timeout=JOB_TIMEOUT_S).result == {"refund": "refund-O-2-10"}
    genuine = guarded.client.approval(first_request.id).decision
    assert genuine and refunds(guarded) == before + 1

    job, request = waiting(guarded)  # the same call, another job: the attacker copies the decision
    write(guarded, request, status="approved", decided_by="ana", decided_at="1", decision=genuine)
    problem = refused(guarded, job, request, before + 1)
    assert problem == (
        f"decision for job {job.job_id} request {request.id} was signed for job {first.job_id} request "
        f"{first_request.id} (a decision replayed from another request): refused"
    )


def test_a_denial_edited_into_an_approval_after_it_was_signed_is_refused(guarded: FleetWorker) -> None:
    before = refunds(guarded)
    job, request = waiting(guarded)
    ana = load_approver_key(guarded.approvers.keys["ana"])
    denial = sign_decision(
        ana,
        job_id=job.job_id,
        request_id=request.id,
        call_sha256=request.call_sha256,
        decision="denied",
        by="ana",
        reason="no",
    )
    edited = json.loads(denial.text())
    edited["decision"]["decision"] = "approved"
    write(guarded, request, status="approved", decided_by="ana", decided_at="1", decision=json.dumps(edited))
    problem = refused(guarded, job, request, before)
    assert f"its signature does not verify with key {ana.key_id} of approver ana" in problem


def test_a_decision_signed_by_a_revoked_key_is_refused_with_no_restart(guarded: FleetWorker) -> None:
    """The operator revokes bo with the real command; the running worker reads the file again."""
    approvers_file = guarded.approvers.file
    bo = load_approver_key(guarded.approvers.keys["bo"])
    revoked = sandfleet(guarded, "approvers", "revoke", "bo", "--file", str(approvers_file))
    assert revoked.returncode == 0 and f"{bo.key_id}  revoked  bo" in revoked.stdout, revoked.stderr
    before = refunds(guarded)
    job, request = waiting(guarded)
    guarded.client.approve(request.id, key=bo)
    problem = refused(guarded, job, request, before)
    assert problem == (
        f"decision for job {job.job_id} request {request.id} is signed by key {bo.key_id} of approver bo, "
        f"which is revoked in the approvers file {approvers_file}: refused"
    )


def test_an_unsigned_approval_of_a_suspended_job_is_refused_when_it_resumes(
    approval_fleet: FleetWorker,
) -> None:
    """The decision path itself (`approvals approve --unsigned`, the Lua step, the job queued and
    published again) with no signature: the resumed run refuses it in a fresh sandbox."""
    before = refunds(approval_fleet)
    job = approval_fleet.client.submit("Refund order two", tools=["issue_refund"], model=approval_fleet.model)
    wait_for(lambda: job.status() == JobStatus.AWAITING_APPROVAL, what="the job to be suspended")
    [request] = pending_of(approval_fleet, job.job_id)
    unsigned = sandfleet(approval_fleet, "approvals", "approve", request.id, "--unsigned", "--by", "ana")
    assert unsigned.returncode == 0 and "(unsigned)" in unsigned.stdout, unsigned.stderr
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert "is not signed: refused" in result.result["denied"]
    assert refunds(approval_fleet) == before
    events = [e.data["event"] for e in job.audit() if e.kind == "approval"]
    assert events == ["requested", "resumed", "refused"]


def test_without_an_approvers_file_a_job_naming_a_gated_tool_is_refused_before_it_starts(
    fleet_worker: WorkerFactory,
) -> None:
    worker = gated_worker(fleet_worker, "no-approvers", approval_env(SANDFLEET_APPROVERS_FILE=""))
    job = worker.client.submit("Refund order two", tools=["issue_refund"], model=worker.model)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.REFUSED and result.error is not None
    assert "issue_refund need a person's approval, and this worker accepts no decision" in (
        result.error.message
    )
    assert "SANDFLEET_APPROVERS_FILE" in result.error.message
    assert not [e for e in job.audit() if e.kind in ("model_call", "sandbox_run")]  # nothing ran
    assert worker.client.approvals(job_id=job.job_id) == []


def test_unsigned_decisions_allowed_are_accepted_as_unsigned_and_a_bad_signature_is_still_refused(
    fleet_worker: WorkerFactory,
) -> None:
    env = approval_env(
        SANDFLEET_APPROVERS_FILE="", SANDFLEET_APPROVAL_ALLOW_UNSIGNED="true", SANDFLEET_APPROVAL_GRACE_S="30"
    )
    worker = gated_worker(fleet_worker, "unsigned", env)
    client, before = worker.client, refunds(worker)
    job, request = waiting(worker)
    client.approve(request.id, unsigned=True, by="old-approver")
    assert job.result(timeout=JOB_TIMEOUT_S).result == {"refund": "refund-O-2-10"}
    [approval] = [e.data for e in job.audit() if e.kind == "approval" and e.data["event"] == "approved"]
    assert approval["by"] == "old-approver" and approval["signed"] is False
    assert approval["decision"] is None and refunds(worker) == before + 1

    job, request = waiting(worker)
    client.approve(request.id)  # signed with ana's key, which this worker cannot check
    problem = refused(worker, job, request, before + 1)
    assert "is signed by key" in problem and "this worker has no approvers file" in problem
