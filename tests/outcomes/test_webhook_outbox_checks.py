"""The webhook outbox on a real Redis with real HTTP receivers, no worker process: the worker's own
``Webhooks`` commits POSTs in signed chains (a real key, the real audit sink and seal) whose first try
fails (the receiver is down), then its outbox sweep is run at chosen times.

Checked: an entry is sent only once due, not while its worker beats inside its retry schedule, and
then with the committed body, timestamp, signature and ``Idempotency-Key``; delivered, it leaves the
outbox and the record says so, and a re-planted copy is not sent again; a commit not sealed yet
waits; only the sealing delivery's commit is sent, and a late duplicate delivery keeps none; a worker whose policy does not list the host
sends nothing and leaves it to others; an entry too old is given up; a batch's webhook is sent once.
Hostile: planted entries (another URL, body, timestamp or event, a job without a record or without a
webhook, a chain with an event added after the seal, a member naming another body, garbage) are all
refused, say why in ``{p}:rejected``, and reach no server. (Through real workers:
tests/outcomes/test_webhook_outbox.py, tests/security/test_webhook_outbox_planted.py.)
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import redis
from fleet.helpers import fleet_settings_for, free_port, keys_under, start_job

from sandfleet.core.contracts import AuditKind, JobResult, JobSpec, JobStatus
from sandfleet.core.key_registry import KeyRegistry, start_signer, worker_ring
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.signing import KeyRing
from sandfleet.core.store import JobStore
from sandfleet.core.webhook_outbox import OUTBOX_GRACE_S, OutboxEntry
from sandfleet.core.webhook_signing import IDEMPOTENCY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from sandfleet.worker.delivery.job_end import JobEnd, JobEnding
from sandfleet.worker.delivery.reporting import WebhookHook
from sandfleet.worker.webhooks import Webhooks
from sandfleet.worker.webhooks.sender import retry_schedule_s

from .webhook_receiver import OutboxReceiver

pytestmark = [pytest.mark.timeout(120)]

SECRET = "outbox-test-secret"
WORKER = "outbox-test@host"


@dataclass
class Fleet:
    settings: Settings
    store: JobStore
    webhooks: Webhooks
    redis: redis.Redis
    keys: FleetKeys
    port: int  # the receiver's port: refused until a test starts the receiver there
    registry: KeyRegistry

    def sweeper(self, **settings: object) -> Webhooks:
        """Another worker's Webhooks (its own settings) sweeping the same outbox."""
        other = self.settings.model_copy(update=settings)
        signer = self.store.signer
        assert signer is not None
        ring = lambda: worker_ring(other, self.registry, signer.key_info())  # noqa: E731
        return Webhooks(other, self.redis, worker="sweeper@host", ring=ring)


@pytest.fixture
def fleet(redis_server: str, tmp_path: Path) -> Iterator[Fleet]:
    settings = fleet_settings_for(
        redis_server,
        worker_state_dir=str(tmp_path / "worker-state"),
        webhook_secret=SECRET,
        policy_webhook_hosts=["127.0.0.1"],
        webhook_retries=0,
        webhook_backoff_s=0.1,
        webhook_timeout_s=2.0,
    )
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    keys = FleetKeys(settings.key_prefix)
    registry = KeyRegistry(client, keys)
    signer = start_signer(settings, WORKER, registry)
    store = JobStore(client, settings, signer)
    ring = lambda: worker_ring(settings, registry, signer.key_info())  # noqa: E731
    webhooks = Webhooks(settings, client, worker=WORKER, ring=ring)
    yield Fleet(settings, store, webhooks, client, keys, free_port(), registry)
    webhooks.close()
    if leftovers := keys_under(client, settings.key_prefix):
        client.delete(*leftovers)
    client.close()


def ended_job(fleet: Fleet, spec: JobSpec | None = None, token: str | None = None) -> str:
    """A job ended through the job-end hooks whose first webhook try failed (the receiver is down)."""
    job_id = str(uuid.uuid4())
    spec = spec or JobSpec(question="q", webhook=f"http://127.0.0.1:{fleet.port}/jobs")
    fleet.store.record_queued([(job_id, spec)], submitter_token=token)
    start_job(fleet.store, job_id)
    job_end = JobEnd()
    job_end.add(WebhookHook(fleet.webhooks))
    result = JobResult(job_id=job_id, status=JobStatus.SUCCEEDED, result={"answer": 42})
    job_end.finish(JobEnding(fleet.store, job_id, result, worker=WORKER))
    if spec.webhook:
        key = fleet.keys.job(job_id)
        deadline = time.monotonic() + 20
        while fleet.redis.hget(key, "webhook_status") != "failed" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fleet.redis.hget(key, "webhook_status") == "failed"
    return job_id


def members(fleet: Fleet) -> list[str]:
    return list(fleet.redis.zrange(fleet.keys.webhook_outbox, 0, -1))


def the_entry(fleet: Fleet, job_id: str) -> OutboxEntry:
    [member] = [m for m in members(fleet) if m.startswith(f"{job_id}/")]
    entry = fleet.webhooks.outbox.read(member)
    assert entry is not None
    return entry


def committed(fleet: Fleet, job_id: str) -> dict[str, object]:
    [event] = [e for e in fleet.store.reader.audit(job_id) if e.kind == AuditKind.WEBHOOK]
    return event.data


def test_a_committed_webhook_nobody_delivered_is_sent_with_its_first_signature_and_key(fleet: Fleet) -> None:
    job_id = ended_job(fleet)
    entry = the_entry(fleet, job_id)
    early = fleet.webhooks.sweep(entry.committed_at + 1)  # not due yet (the grace)
    assert early is not None and early.sent == [] and early.waiting == [] and early.refused == []
    fleet.redis.set(fleet.keys.heartbeat(WORKER), "{}", ex=30)  # its worker beats: it may still be sending
    inside = entry.committed_at + OUTBOX_GRACE_S + retry_schedule_s(fleet.settings) - 1  # due, still inside
    assert inside > entry.committed_at + OUTBOX_GRACE_S
    assert fleet.webhooks.sweep(inside).waiting == [entry.member]
    receiver = OutboxReceiver(fleet.port)
    try:
        past_schedule = entry.committed_at + retry_schedule_s(fleet.settings) + 10
        assert fleet.webhooks.sweep(past_schedule).sent == [entry.member]  # beating, but past its retries
        [post] = receiver.wait_for(1)
        data = committed(fleet, job_id)
        assert hashlib.sha256(post["body"]).hexdigest() == data["body_sha256"]
        assert post["headers"][TIMESTAMP_HEADER] == str(data["timestamp"])
        assert post["headers"][SIGNATURE_HEADER] == sign(SECRET, int(str(data["timestamp"])), post["body"])
        assert post["headers"][IDEMPOTENCY_HEADER] == f"job.ended:{job_id}"
        record_key = fleet.keys.job(job_id)
        deadline = time.monotonic() + 10
        while fleet.redis.hget(record_key, "webhook_status") != "delivered" and time.monotonic() < deadline:
            time.sleep(0.05)
        record = fleet.redis.hgetall(record_key)
        assert record["webhook_status"] == "delivered" and record["webhook_outbox_tries"] == "1"
        assert members(fleet) == [] and fleet.redis.hgetall(fleet.keys.job_webhooks(job_id)) == {}

        fleet.webhooks.outbox.add(entry, due_at=0)  # the same entry planted again after its delivery
        report = fleet.webhooks.sweep(past_schedule + 100)
        assert report.sent == [] and report.dropped == [entry.member] and members(fleet) == []
        fleet.webhooks.close()
        assert len(receiver.posts) == 1
    finally:
        receiver.close()


def test_a_dead_workers_entry_is_sent_once_due_and_a_commit_not_sealed_waits(fleet: Fleet) -> None:
    job_id = ended_job(fleet)
    entry = the_entry(fleet, job_id)
    unsealed = str(uuid.uuid4())
    spec = JobSpec(question="q", webhook=f"http://127.0.0.1:{fleet.port}/jobs")
    fleet.store.record_queued([(unsealed, spec)])
    sink = start_job(fleet.store, unsealed)
    record = fleet.store.record(unsealed)
    assert record is not None
    fleet.webhooks.before_seal(record, JobResult(job_id=unsealed, status=JobStatus.SUCCEEDED), sink)
    receiver = OutboxReceiver(fleet.port)
    try:
        report = fleet.webhooks.sweep(time.time() + 10)  # no heartbeat: the committing worker is dead
        assert report.sent == [entry.member]
        assert [m for m in report.waiting if m.startswith(unsealed)] and len(report.waiting) == 1
        receiver.wait_for(1)
        assert any(m.startswith(f"{unsealed}/") for m in members(fleet))  # kept until its job is sealed
        fleet.webhooks.close()
        assert [p["headers"][IDEMPOTENCY_HEADER] for p in receiver.posts] == [f"job.ended:{job_id}"]
    finally:
        receiver.close()


def test_only_the_sealing_deliverys_commit_is_sent(fleet: Fleet) -> None:
    job_id = str(uuid.uuid4())
    spec = JobSpec(question="q", webhook=f"http://127.0.0.1:{fleet.port}/jobs")
    fleet.store.record_queued([(job_id, spec)])
    sink = start_job(fleet.store, job_id)
    record = fleet.store.record(job_id)
    assert record is not None
    lost = JobResult(job_id=job_id, status=JobStatus.FAILED)
    won = JobResult(job_id=job_id, status=JobStatus.SUCCEEDED, result={"answer": 42})
    fleet.webhooks.before_seal(record, lost, sink)  # a delivery that then lost the race (or died)
    time.sleep(0.01)
    fleet.webhooks.before_seal(record, won, sink)
    fleet.store.finish(job_id, won, worker=WORKER)  # the worker is killed before it sends
    receiver = OutboxReceiver(fleet.port)
    try:
        report = fleet.webhooks.sweep(time.time() + 10)
        assert len(report.sent) == 1 and len(report.refused) == 1, report
        assert "body_sha256 is not the one the job's chain committed" in report.refused[0][1]
        [post] = receiver.wait_for(1)
        assert json.loads(post["body"])["status"] == "succeeded"
    finally:
        receiver.close()


def test_a_late_duplicate_delivery_leaves_nothing_in_the_outbox(fleet: Fleet) -> None:
    job_id = ended_job(fleet)
    entry = the_entry(fleet, job_id)
    late = fleet.sweeper()  # another process ending the same job after it ended
    job_end = JobEnd()
    job_end.add(WebhookHook(late))
    result = JobResult(job_id=job_id, status=JobStatus.FAILED)
    assert job_end.finish(JobEnding(fleet.store, job_id, result, worker=WORKER)).value == "final"
    late.close()
    assert members(fleet) == [entry.member]  # only the sealing delivery's entry is left
    assert list(fleet.redis.hkeys(fleet.keys.job_webhooks(job_id))) == [entry.field]


def test_a_worker_whose_policy_does_not_list_the_host_leaves_the_entry_to_others(fleet: Fleet) -> None:
    job_id = ended_job(fleet)
    entry = the_entry(fleet, job_id)
    narrow = fleet.sweeper(policy_webhook_hosts=["receiver.invalid"])
    receiver = OutboxReceiver(fleet.port)
    try:
        report = narrow.sweep(entry.committed_at + 10)
        assert report.sent == [] and report.waiting == [entry.member] and members(fleet) == [entry.member]
        narrow.close()
        assert receiver.posts == []
        assert fleet.webhooks.sweep(entry.committed_at + 30).sent == [entry.member]  # after the lease
        receiver.wait_for(1)
    finally:
        receiver.close()


def test_an_entry_past_the_maximum_age_is_given_up(fleet: Fleet) -> None:
    job_id = ended_job(fleet)
    entry = the_entry(fleet, job_id)
    report = fleet.webhooks.sweep(entry.committed_at + fleet.settings.webhook_outbox_max_age_s + 10)
    assert report.sent == [] and report.dropped == [entry.member] and members(fleet) == []
    record = fleet.redis.hgetall(fleet.keys.job(job_id))
    assert record["webhook_status"] == "failed" and "outbox gave up" in record["webhook_error"]


def test_a_batch_webhook_is_sent_from_the_outbox_once(fleet: Fleet) -> None:
    batch_id = f"batch-{uuid.uuid4().hex[:8]}"
    url = f"http://127.0.0.1:{fleet.port}"
    spec = JobSpec(question="q", webhook=f"{url}/jobs", batch_webhook=f"{url}/batch", batch_id=batch_id)
    job_id = ended_job(fleet, spec, token="submitter-token")
    assert len(members(fleet)) == 2
    deadline = time.monotonic() + 10  # the batch's first try fails too (it claimed the batch's webhook)
    while fleet.redis.hget(fleet.keys.batch_webhook(batch_id), "status") != "failed":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    receiver = OutboxReceiver(fleet.port)
    try:
        assert len(fleet.webhooks.sweep(time.time() + 10).sent) == 2
        posts = receiver.wait_for(2)
        keys = sorted(p["headers"][IDEMPOTENCY_HEADER] for p in posts)
        assert keys == [f"batch.ended:batch:{batch_id}", f"job.ended:{job_id}"]
        deadline = time.monotonic() + 10
        while members(fleet) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert members(fleet) == []
        assert fleet.redis.hget(fleet.keys.batch_webhook(batch_id), "status") == "delivered"
    finally:
        receiver.close()


def test_planted_outbox_entries_are_refused_and_reach_nobody(fleet: Fleet) -> None:
    job_id = ended_job(fleet)
    genuine = the_entry(fleet, job_id)
    fleet.webhooks.outbox.remove(genuine.member)
    plain = ended_job(fleet, JobSpec(question="no webhook"))
    tampered = ended_job(fleet)
    tampered_entry = the_entry(fleet, tampered)
    fleet.webhooks.outbox.remove(tampered_entry.member)  # planted back below, once its chain is tampered
    fleet.redis.xadd(
        fleet.keys.audit(tampered), {"event": "{}", "hash": "0" * 64, "sig": "AA==", "key": "k"}
    )  # an event after the seal, as a Redis writer would add one
    receiver = OutboxReceiver(fleet.port)
    attacker = OutboxReceiver()
    planted = {
        "url": replace(genuine, url=f"{attacker.url}/steal"),
        "body": replace(genuine, body=genuine.body.replace(b"42", b"43")),
        "timestamp": replace(genuine, timestamp=genuine.timestamp + 1),
        "event": replace(genuine, event="batch.ended"),
        "no record": replace(genuine, job_id=str(uuid.uuid4())),
        "no webhook": replace(genuine, job_id=plain),
        "chain": tampered_entry,
    }
    why = {
        "url": "its url is not the one the job's chain committed",
        "body": "its body_sha256 is not the one",
        "timestamp": "its timestamp is not the one",
        "event": "committed no batch.ended webhook",
        "no record": "missing: no record",
        "no webhook": "committed no job.ended webhook",
        "chain": "MISMATCHED",
        "another body": "is not the one its name holds",
        "garbage": "is not JOB/EVENT/SHA256",
    }
    ghost = replace(genuine, job_id=str(uuid.uuid4()))  # another body under the genuine body's name
    other_body = replace(ghost, body=b'{"event":"job.ended"}')

    def plant(name: str) -> str:
        """One planted member (several share the genuine one's name: one at a time, as in Redis)."""
        if name == "another body":
            fleet.redis.hset(fleet.keys.job_webhooks(ghost.job_id), genuine.field, other_body.to_json())
            fleet.redis.zadd(fleet.keys.webhook_outbox, {ghost.member: 0})
            return ghost.member
        if name == "garbage":
            fleet.redis.zadd(fleet.keys.webhook_outbox, {"garbage": 0})
            return "garbage"
        entry = replace(planted[name], worker="dead@host")  # a worker that does not beat
        fleet.webhooks.outbox.add(entry, due_at=0)
        return entry.member

    try:
        for name, expected in why.items():
            member = plant(name)
            report = fleet.webhooks.sweep(time.time() + 10)
            assert report is not None and report.sent == [], name
            refused = dict(report.refused)
            assert expected in refused.get(member, ""), (name, refused)
            assert members(fleet) == [], name
        fleet.webhooks.close()  # every send it started has ended
        assert receiver.posts == [] and attacker.posts == []
        rejected = fleet.redis.xrange(fleet.keys.rejected)
        assert sum(f["reason"] == "webhook outbox entry refused" for _id, f in rejected) == len(why)
    finally:
        receiver.close()
        attacker.close()


def test_a_chain_signed_with_a_key_planted_in_the_register_is_refused_pinned_or_not(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The attacker registers a key of its own (made anywhere but this host's state folder) and writes a
    whole job with it: a chain committing a body of its choosing to its own server. A worker pinning
    its key set refuses the entry, and so does one that does not pin: unpinned, a worker acts only on
    chains signed with keys made on its own host (sandfleet/core/host_keys.py), never the register's."""
    attacker = OutboxReceiver()
    try:
        elsewhere = fleet.settings.model_copy(update={"worker_state_dir": str(tmp_path / "attacker")})
        forger = start_signer(elsewhere, "attacker@host", fleet.registry)  # registered in Redis
        forged_store = JobStore(fleet.redis, fleet.settings, forger)
        forged = Webhooks(fleet.settings, fleet.redis, worker="attacker@host")
        job_id = str(uuid.uuid4())
        fleet.store.record_queued([(job_id, JobSpec(question="q", webhook=f"{attacker.url}/steal"))])
        sink = start_job(forged_store, job_id)
        result = JobResult(job_id=job_id, status=JobStatus.SUCCEEDED, result="the attacker's words")
        record = fleet.store.record(job_id)
        assert record is not None
        forged.before_seal(record, result, sink)
        forged_store.finish(job_id, result, worker="attacker@host")  # never sent by the attacker itself
        forged.close()
        [member] = members(fleet)
        planted = fleet.webhooks.outbox.read(member)
        assert planted is not None
        signer = fleet.store.signer
        assert signer is not None
        own = signer.key_info()
        pinned = Webhooks(
            fleet.settings,
            fleet.redis,
            worker="pinned@host",
            ring=lambda: KeyRing([own], "the pinned key set").with_own(own),
        )
        report = pinned.sweep(time.time() + 10)
        assert report is not None and report.sent == [] and members(fleet) == []
        assert "not in the key set" in dict(report.refused)[member]
        pinned.close()

        fleet.webhooks.outbox.add(planted, due_at=0)  # planted again, for a worker that does not pin
        assert fleet.settings.trusted_keys is None
        report = fleet.webhooks.sweep(time.time() + 10)
        assert report is not None and report.sent == [] and members(fleet) == []
        refused = dict(report.refused)[member]
        assert "not in the key set (this host's keys in" in refused and "SANDFLEET_TRUSTED_KEYS" in refused
        fleet.webhooks.close()
        assert attacker.posts == []
    finally:
        attacker.close()
