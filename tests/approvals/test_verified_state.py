"""Verify before use, on a real Redis with no worker process: the approval gate serves a stored outcome
only while the job's verified chain holds the signed ``executed`` event committing to it, and a
checkpoint is used only when a signed ``awaiting_approval`` event of a verified chain commits to it.
(Through a real worker and sandboxes: tests/security/test_trusted_state.py.)"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from fleet.helpers import fleet_settings_for, keys_under, start_job

from sandfleet.core.approvals import ApprovalStatus, ApprovalStore, encode_outcome, outcome_sha256
from sandfleet.core.audit import RedisAuditSink
from sandfleet.core.chain import link_hash, sha256_hex
from sandfleet.core.contracts import AuditEvent, AuditKind, JobSpec, JobStatus
from sandfleet.core.errors import UntrustedStateError
from sandfleet.core.key_registry import KeyRegistry, start_signer, worker_ring
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.store import JobStore
from sandfleet.worker.approval.checkpoint import Checkpoint, CheckpointMismatchError, load_checkpoint
from sandfleet.worker.approval.gate import ApprovalService
from sandfleet.worker.program.bridge import call_key

WORKER = "gate-test@host"
ARGS = ["O-1", 25.0]


@dataclass
class Fleet:
    settings: Settings
    store: JobStore
    service: ApprovalService
    redis: redis.Redis
    keys: FleetKeys


@pytest.fixture
def fleet(redis_server: str, tmp_path: Path) -> Iterator[Fleet]:
    settings = fleet_settings_for(
        redis_server,
        worker_state_dir=str(tmp_path / "worker-state"),
        approval_tools=["issue_refund"],
        approval_grace_s=0,
        approval_allow_unsigned=True,  # decisions here are the store's own (what is checked is the state)
    )
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    keys = FleetKeys(settings.key_prefix)
    registry = KeyRegistry(client, keys)
    signer = start_signer(settings, WORKER, registry)
    store = JobStore(client, settings, signer)
    service = ApprovalService(
        ApprovalStore(client, keys, settings.retention_s),
        settings,
        WORKER,
        ring=lambda: worker_ring(settings, registry, signer.key_info()),
    )
    yield Fleet(settings, store, service, client, keys)
    if leftovers := keys_under(client, settings.key_prefix):
        client.delete(*leftovers)
    client.close()


def running_job(fleet: Fleet) -> tuple[str, JobSpec, RedisAuditSink]:
    job_id = str(uuid.uuid4())
    spec = JobSpec(question="Refund order one", tools=["issue_refund"])
    fleet.store.record_queued([(job_id, spec)])
    return job_id, spec, start_job(fleet.store, job_id)


def admit(fleet: Fleet, job_id: str, spec: JobSpec, audit: RedisAuditSink):  # type: ignore[no-untyped-def]
    """A program run's first call of issue_refund(*ARGS), as the bridge asks the gate about it."""
    gate = fleet.service.gate(job_id=job_id, spec=spec, attempt=1, program="p", audit=audit)
    return gate, gate.admit(
        call_key("issue_refund", ARGS, {}), "issue_refund", None, ARGS, {}, threading.Event()
    )


def test_a_stored_outcome_is_served_only_while_the_signed_executed_event_commits_to_it(fleet: Fleet) -> None:
    job_id, spec, audit = running_job(fleet)
    _gate, first = admit(fleet, job_id, spec, audit)
    assert first.kind == "suspend"  # grace 0: undecided
    fleet.service.store.decide(first.request_id, ApprovalStatus.APPROVED, by="ana")
    gate, run = admit(fleet, job_id, spec, audit)  # the resumed run: approved, taken once
    assert run.kind == "run"
    gate.executed(run.request_id, {"ok": True, "value": "refund-O-1-25"})
    [executed] = [e for e in fleet.store.reader.audit(job_id) if e.data.get("event") == "executed"]
    assert executed.data["outcome_sha256"] == outcome_sha256({"ok": True, "value": "refund-O-1-25"})
    assert executed.data["tool"] == "issue_refund" and executed.data["id"] == run.request_id

    _gate, served = admit(fleet, job_id, spec, audit)  # a re-run (a redelivery): served, not run again
    assert served.kind == "served" and served.outcome == {"ok": True, "value": "refund-O-1-25"}

    key = fleet.keys.approval(run.request_id)
    fleet.redis.hset(key, "outcome", encode_outcome({"ok": True, "value": "refund-INVENTED"}))
    _gate, lied = admit(fleet, job_id, spec, audit)
    assert lied.kind == "untrusted" and "the stored outcome was changed" in lied.message
    assert f"approval request {run.request_id} (issue_refund) is not served" in lied.message


def test_an_outcome_with_no_executed_event_or_a_broken_chain_is_not_served(fleet: Fleet) -> None:
    job_id, spec, audit = running_job(fleet)
    _gate, first = admit(fleet, job_id, spec, audit)
    outcome = encode_outcome({"ok": True, "value": "refund-INVENTED"})
    fleet.redis.hset(
        fleet.keys.approval(first.request_id), mapping={"status": "executed", "outcome": outcome}
    )
    _gate, lied = admit(fleet, job_id, spec, audit)
    assert lied.kind == "untrusted" and "no signed 'executed' event" in lied.message

    # Now a genuine event committing to that digest, then an entry of the chain removed: not served.
    audit.emit(
        AuditKind.APPROVAL,
        {"event": "executed", "id": first.request_id, "outcome_sha256": sha256_hex(outcome)},
        1,
    )
    _gate, served = admit(fleet, job_id, spec, audit)
    assert served.kind == "served"
    [running_entry] = [i for i, _ in fleet.redis.xrange(fleet.keys.audit(job_id))][1:2]
    fleet.redis.xdel(fleet.keys.audit(job_id), running_entry)
    _gate, broken = admit(fleet, job_id, spec, audit)
    assert broken.kind == "untrusted" and "the job's audit chain does not verify" in broken.message


def checkpoint_json() -> str:
    return Checkpoint(number=1, program="print(1)", reply="r", messages=[]).model_dump_json()


def event(status: str, digest: str) -> AuditEvent:
    return AuditEvent(
        ts=time.time(), job_id="j", attempt=1, kind=AuditKind.STATE,
        data={"status": status, "checkpoint_sha256": digest},
    )  # fmt: skip


def test_a_checkpoint_needs_the_last_awaiting_approval_event_after_entry_zero() -> None:
    raw = checkpoint_json()
    queued = event(JobStatus.QUEUED.value, "")
    awaiting = event(JobStatus.AWAITING_APPROVAL.value, sha256_hex(raw))
    assert load_checkpoint(raw, [queued, awaiting]).program == "print(1)"
    with pytest.raises(CheckpointMismatchError, match="no signed awaiting_approval event"):
        load_checkpoint(raw, [awaiting])  # entry 0 is the producer's, unsigned: it never commits
    later = event(JobStatus.AWAITING_APPROVAL.value, sha256_hex("another"))
    with pytest.raises(CheckpointMismatchError, match="was changed"):
        load_checkpoint(raw, [queued, awaiting, later])
    with pytest.raises(CheckpointMismatchError, match="was changed"):  # compared before it is parsed
        load_checkpoint("{not json", [queued, awaiting])
    assert issubclass(CheckpointMismatchError, UntrustedStateError)


def test_a_checkpoint_is_used_only_through_a_verified_chain(fleet: Fleet) -> None:
    job_id, _spec, audit = running_job(fleet)
    raw = checkpoint_json()
    fleet.redis.set(fleet.keys.checkpoint(job_id), raw)
    with pytest.raises(CheckpointMismatchError, match="no signed awaiting_approval"):
        fleet.service.resume_point(job_id)
    # The attacker's own event (unsigned, linked to the tip, the record's tip moved to it).
    head = fleet.redis.hget(fleet.keys.job(job_id), "audit_head") or ""
    fake = event(JobStatus.AWAITING_APPROVAL.value, sha256_hex(raw)).model_copy(update={"job_id": job_id})
    fake_json = json.dumps(fake.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    link = link_hash(head, fake_json)
    fleet.redis.xadd(fleet.keys.audit(job_id), {"event": fake_json, "hash": link, "sig": "", "key": ""})
    fleet.redis.hset(fleet.keys.job(job_id), "audit_head", link)
    fleet.redis.hincrby(fleet.keys.job(job_id), "audit_count", 1)
    with pytest.raises(UntrustedStateError, match=r"does not verify \(event 2: not signed\)"):
        fleet.service.resume_point(job_id)
    fleet.redis.xdel(fleet.keys.audit(job_id), fleet.redis.xrange(fleet.keys.audit(job_id))[-1][0])
    fleet.redis.hset(fleet.keys.job(job_id), mapping={"audit_head": head})
    fleet.redis.hincrby(fleet.keys.job(job_id), "audit_count", -1)
    audit.emit(AuditKind.STATE, {"status": "awaiting_approval", "checkpoint_sha256": sha256_hex(raw)}, 1)
    resumed = fleet.service.resume_point(job_id)  # the worker's own signed event: used
    assert resumed is not None and resumed.program == "print(1)"
