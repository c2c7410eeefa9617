"""The write side of job records against a real Redis: transitions, exactly one final record,
delivery counts, the audit hash chain, batch counts and retention."""

from __future__ import annotations

import json
import threading

import pytest
import redis

from sandfleet.core.audit import RedisAuditSink
from sandfleet.core.chain import encode_event, link_hash, signed_message
from sandfleet.core.contracts import AuditEvent, JobResult, JobStatus
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.signing import ChainSigner, KeyStatus, WorkerKey
from sandfleet.core.store import JobStore, Transition
from sandfleet.producer.client import Client
from sandfleet.worker.delivery.job_end import error_result

from .helpers import TEST_WORKER, start_job


def succeeded(job_id: str, value: object = 42) -> JobResult:
    return JobResult(job_id=job_id, status=JobStatus.SUCCEEDED, result=value)


def test_transitions_record_timestamps_counts_and_indexes(client: Client, store: JobStore) -> None:
    job = client.submit("What is 6 x 7?")
    keys = store.keys
    assert store.mark_running(job.job_id, "w1") == Transition.APPLIED
    record = job.record()
    assert record.status == JobStatus.RUNNING and record.attempts == 1 and record.worker == "w1"
    assert record.timestamps["running"] >= record.timestamps["queued"]
    assert store.redis.zscore(keys.status_index("running"), job.job_id) is not None
    assert store.redis.zscore(keys.status_index("queued"), job.job_id) is None

    assert store.finish(job.job_id, succeeded(job.job_id)) == Transition.APPLIED
    record = job.record()
    assert record.status == JobStatus.SUCCEEDED
    assert set(record.timestamps) == {"queued", "running", "succeeded"}
    assert record.result == succeeded(job.job_id)
    assert store.redis.zscore(keys.status_index("succeeded"), job.job_id) is not None
    assert store.redis.zscore(keys.status_index("running"), job.job_id) is None


def race_to_finish(settings: Settings, job_id: str, writers: int, signer: ChainSigner) -> list[Transition]:
    """``writers`` threads, each with its own connection (as separate workers), finish at once."""
    stores = [JobStore.from_settings(settings, signer) for _ in range(writers)]
    barrier = threading.Barrier(writers)
    outcomes: list[Transition] = []

    def write(i: int) -> None:
        result = succeeded(job_id, value=i)
        barrier.wait()
        outcomes.append(stores[i].finish(job_id, result, token=f"w{i}"))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.redis.close()
    return outcomes


def test_exactly_one_final_record_under_racing_writers(
    client: Client, store: JobStore, settings: Settings
) -> None:
    writers = 4
    for _ in range(20):
        job = client.submit("Race me")
        store.mark_running(job.job_id, "w")
        outcomes = race_to_finish(settings, job.job_id, writers, store.signer)
        assert outcomes.count(Transition.APPLIED) == 1
        assert outcomes.count(Transition.ALREADY_FINAL) == writers - 1
        winner = store.redis.get(store.keys.final_guard(job.job_id))
        assert job.result(timeout=1).result == int(winner.removeprefix("w"))
        assert store.redis.llen(store.keys.done(job.job_id)) == 1


def test_a_final_record_refuses_every_later_transition(client: Client, store: JobStore) -> None:
    job = client.submit("Once")
    store.finish(job.job_id, succeeded(job.job_id))
    assert store.mark_running(job.job_id, "late") == Transition.ALREADY_FINAL
    failed = JobResult(job_id=job.job_id, status=JobStatus.FAILED)
    assert store.finish(job.job_id, failed) == Transition.ALREADY_FINAL
    assert job.status() == JobStatus.SUCCEEDED and job.record().attempts == 0


def test_transitions_of_an_unknown_job_write_nothing(store: JobStore, settings: Settings) -> None:
    assert store.mark_running("no-such-job", "w") == Transition.MISSING
    assert store.finish("no-such-job", succeeded("no-such-job")) == Transition.MISSING
    assert not store.redis.exists(store.keys.job("no-such-job"))


def test_delivery_counter_counts_per_retry_message(client: Client, store: JobStore) -> None:
    job = client.submit("Count my deliveries")
    assert [store.count_delivery(job.job_id, retry=0) for _ in range(3)] == [1, 2, 3]
    assert store.count_delivery(job.job_id, retry=1) == 1  # a retry is a new message
    assert job.record().deliveries == 4
    assert store.redis.ttl(store.keys.deliveries(job.job_id)) > 0


def test_batch_counts_follow_every_transition(client: Client, store: JobStore) -> None:
    batch = client.submit_batch(["a?", "b?", "c?"])
    assert batch.progress().counts["queued"] == 3 and batch.progress().total == 3
    a, b, c = batch.job_ids
    store.mark_running(a, "w")
    store.mark_running(b, "w")
    store.mark_running(b, "w")  # a redelivery: still one job running
    store.finish(a, succeeded(a))
    store.finish(c, error_result(c, JobStatus.REFUSED, "invalid_spec", "no"))
    progress = batch.progress()
    assert (progress.counts["queued"], progress.counts["running"]) == (0, 1)
    assert (progress.counts["succeeded"], progress.counts["refused"], progress.done) == (1, 1, 2)
    assert not progress.finished
    store.mark_queued(b)
    assert batch.progress().counts["queued"] == 1


def test_batch_counts_follow_transitions_told_the_batch_by_the_caller(
    client: Client, store: JobStore
) -> None:
    """A delivery passes the batch its record named (no read of it in the store): same counts."""
    batch = client.submit_batch(["a?", "b?"])
    a, b = batch.job_ids
    record = store.record(a)
    assert record is not None and record.batch_id == batch.batch_id
    store.mark_running(a, "w", batch_id=record.batch_id)
    store.mark_running(b, "w", batch_id=batch.batch_id)
    assert batch.progress().counts["running"] == 2
    store.finish(a, succeeded(a), batch_id=batch.batch_id)
    progress = batch.progress()
    assert (progress.counts["running"], progress.counts["succeeded"]) == (1, 1)
    alone = client.submit("alone?").job_id  # no batch: "" touches no batch's counts
    store.mark_running(alone, "w", batch_id="")
    store.finish(alone, succeeded(alone), batch_id="")
    assert store.status(alone) == JobStatus.SUCCEEDED
    assert batch.progress().counts == progress.counts


def test_every_key_of_a_job_expires_with_the_retention(
    client: Client, store: JobStore, settings: Settings
) -> None:
    batch = client.submit_batch(["retention?"])
    job_id = batch.job_ids[0]
    store.count_delivery(job_id)
    start_job(store, job_id).emit("program", {"code": "print(1)"})
    store.finish(job_id, succeeded(job_id))
    keys = FleetKeys(settings.key_prefix)
    for key in (*keys.job_keys(job_id), keys.batch_jobs(batch.batch_id), keys.batch_counts(batch.batch_id)):
        ttl = store.redis.ttl(key)
        assert 0 < ttl <= settings.retention_s, (key, ttl)


def test_audit_chain_verifies_and_detects_tampering(client: Client, store: JobStore) -> None:
    job = client.submit("Audit me")
    audit = start_job(store, job.job_id)
    audit.emit("model_call", {"prompt": "p", "reply": "r", "tokens": 12}, attempt=1)
    audit.emit("tool_call", {"tool": "load_orders", "args": [], "ok": True}, attempt=1)
    events = job.audit()
    assert [e.kind for e in events] == ["state", "state", "model_call", "tool_call"]
    assert job.verify_audit() == (True, None) and job.verify().state == "unfinished"

    # Rewrite the stream with event 2 edited (its stored hash kept): the chain breaks at index 2.
    stream = store.keys.audit(job.job_id)
    entries = store.redis.xrange(stream)
    store.redis.delete(stream)
    for index, (_entry_id, fields) in enumerate(entries):
        if index == 2:
            event = json.loads(fields["event"])
            event["data"]["reply"] = "something else"
            fields = {**fields, "event": json.dumps(event)}
        store.redis.xadd(stream, fields)
    assert job.verify_audit() == (False, 2)
    assert "does not chain" in job.verify().problems[0]


def test_audit_chain_detects_a_removed_last_event(client: Client, store: JobStore) -> None:
    job = client.submit("Truncate me")
    start_job(store, job.job_id).emit("program", {"code": "x"})
    stream = store.keys.audit(job.job_id)
    last_id = store.redis.xrevrange(stream, count=1)[0][0]
    store.redis.xdel(stream, last_id)
    assert job.verify_audit() == (False, 2)


def test_an_event_needs_a_registered_workers_signature(client: Client, store: JobStore) -> None:
    """Links have no key (anyone can compute one), so a forged event with a correct link and no
    signature, or one made with a key the fleet never registered, is refused by the signature check."""
    job = client.submit("Forge me")
    start_job(store, job.job_id)
    record_key, stream = store.keys.job(job.job_id), store.keys.audit(job.job_id)
    forged = encode_event(AuditEvent(ts=0.0, job_id=job.job_id, kind="program", data={"code": "evil"}))
    head = store.redis.hget(record_key, "audit_head")
    link = link_hash(head, forged)
    store.redis.xadd(stream, {"event": forged, "hash": link, "sig": "", "key": ""})
    store.redis.hset(record_key, mapping={"audit_head": link, "audit_count": 3})
    assert job.verify_audit() == (False, 2) and job.verify().problems == ["event 2: not signed"]

    outsider = WorkerKey.generate(TEST_WORKER)  # same worker name, a key the fleet never registered
    last_id = store.redis.xrevrange(stream, count=1)[0][0]
    store.redis.xdel(stream, last_id)
    sig = outsider.sign(signed_message(job.job_id, link))
    store.redis.xadd(stream, {"event": forged, "hash": link, "sig": sig, "key": outsider.key_id})
    verdict = job.verify()
    assert verdict.bad_index == 2 and "not in the key set" in verdict.problems[0]


def test_concurrent_audit_writers_keep_one_chain(
    client: Client, store: JobStore, settings: Settings, redis_server: str
) -> None:
    job = client.submit("Two deliveries write at once")
    start_job(store, job.job_id)
    writers, per_writer = 4, 25
    barrier = threading.Barrier(writers)

    def write(i: int) -> None:
        conn = redis.Redis.from_url(redis_server, decode_responses=True)
        sink = RedisAuditSink(conn, settings, job.job_id, store.signer)
        barrier.wait()
        for n in range(per_writer):
            sink.emit("tool_call", {"writer": i, "n": n})
        conn.close()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(job.audit()) == 2 + writers * per_writer
    assert job.verify_audit() == (True, None)


def test_racing_finishes_seal_the_chain_once_and_match_the_record(
    client: Client, store: JobStore, settings: Settings
) -> None:
    """The first final write wins, record and seal together: one seal, committing to the served record."""
    for _ in range(10):
        job = client.submit("Race me to the seal")
        start_job(store, job.job_id)
        outcomes = race_to_finish(settings, job.job_id, 4, store.signer)
        assert outcomes.count(Transition.APPLIED) == 1
        seals = [e for e in job.audit() if e.kind == "state" and e.data["status"] == "succeeded"]
        assert len(seals) == 1 and job.verify().verified
        assert job.result(timeout=1).result == int(store.redis.get(store.keys.final_guard(job.job_id))[1:])


def test_a_stale_or_planted_tip_guess_links_to_the_tip_redis_holds(client: Client, store: JobStore) -> None:
    """A delivery seeds its sink with the tip read with the record, and the seal with its sink's last
    tip, to save two reads: guesses only. A wrong one (another writer appended meanwhile, or someone
    who can write Redis planted the record's ``audit_head``) is refused by the compare-and-set of the
    append and of the seal, and each links to the real tip: the chain still verifies, no fork."""
    job = client.submit("Guess my tip")
    real = start_job(store, job.job_id)
    stale = store.audit_sink(job.job_id, head=store.record(job.job_id).audit_head)
    real.emit("tool_call", {"n": 1})  # moves the tip past the guess
    stale.emit("tool_call", {"n": 2})
    planted = store.audit_sink(job.job_id, head=link_hash("", "planted"))
    planted.emit("tool_call", {"n": 3})
    assert store.finish(job.job_id, succeeded(job.job_id), head=real.head) == Transition.APPLIED
    events = job.audit()
    assert [e.data.get("n") for e in events if e.kind == "tool_call"] == [1, 2, 3]
    assert events[-1].kind == "state" and job.verify().verified
    assert (
        store.record(job.job_id).audit_head
        == store.redis.xrevrange(store.keys.audit(job.job_id))[0][1]["hash"]
    )


def test_a_sealed_chain_takes_no_more_events(client: Client, store: JobStore) -> None:
    job = client.submit("Late writer")
    sink = start_job(store, job.job_id)
    store.finish(job.job_id, succeeded(job.job_id))
    sink.emit("tool_call", {"tool": "late"})  # a late duplicate delivery: dropped, not appended
    assert [e.kind for e in job.audit()][-1] == "state" and job.verify().verified


def test_audit_events_hold_values_json_cannot(client: Client, store: JobStore) -> None:
    job = client.submit("Odd values")
    start_job(store, job.job_id).emit("limit", {"hit": {"pids"}, "ratio": 0.5})
    assert job.audit()[-1].data["ratio"] == 0.5
    assert job.verify_audit() == (True, None)


def test_rejected_messages_are_recorded(store: JobStore) -> None:
    store.record_rejected("no job record", job_id="x", retries=0)
    ((_entry_id, fields),) = store.redis.xrange(store.keys.rejected)
    assert fields["reason"] == "no job record" and json.loads(fields["details"])["job_id"] == "x"


def test_finish_requires_a_final_status(client: Client, store: JobStore) -> None:
    job = client.submit("Not final")
    with pytest.raises(ValueError, match="final status"):
        store.finish(job.job_id, JobResult(job_id=job.job_id, status=JobStatus.RUNNING))


def test_a_key_register_that_lost_its_data_gets_the_key_back_with_the_next_entry(
    client: Client, store: JobStore
) -> None:
    """A Redis restarted without persistence forgets the register; a worker's entries bring their key
    back (never over a revoked one)."""
    job = client.submit("After a Redis wipe")
    store.redis.delete(store.keys.signing_keys)
    start_job(store, job.job_id)
    assert job.verify().holds and client.registry.get(store.signer.key_info().key_id) is not None
    store.redis.delete(store.keys.signing_keys)
    store.finish(job.job_id, succeeded(job.job_id))
    assert job.verify().verified

    other = client.submit("Revoked meanwhile")
    client.registry.set_status(store.signer.key_info().key_id, KeyStatus.REVOKED)
    start_job(store, other.job_id)
    assert client.registry.get(store.signer.key_info().key_id).status == KeyStatus.REVOKED
    assert "is revoked" in other.verify().problems[0]
