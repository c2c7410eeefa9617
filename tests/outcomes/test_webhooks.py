"""Completion webhooks end to end: a real Redis and ``sandfleet worker``, a replay model over HTTP,
Docker sandboxes, and a real HTTP server started here that receives the POSTs.

Checked: one POST per job and one for the whole batch, each signature verified with the secret (and
refused with another one); the body matches the job's final record, which was already written when
the POST arrived; a POST answered 500 is retried; a receiver that never answers is given up after
the retries; a host the operator did not list gets nothing (the audit says why); every POST is committed in the job's audit chain (its body's SHA-256), which verifies.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandfleet_testing.workers import FleetWorker, WorkerFactory, fleet_settings_for

from sandfleet.core.contracts import AuditKind, JobStatus
from sandfleet.core.webhook_signing import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    verify_signature,
)
from sandfleet.fleet.local_redis import free_port

from .webhook_receiver import Receiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SECRET = "test-webhook-secret"
SCRIPT = {
    "rules": [
        {"match": "good question", "responses": ["```python\nprint('RESULT: {\"answer\": 42}')\n```"]},
        {"match": "bad question", "responses": ["```python\nraise ValueError('nope')\n```"]},
    ]
}


@pytest.fixture
def fleet(
    redis_server: str, fleet_worker: WorkerFactory, tmp_path: Path
) -> Iterator[tuple[FleetWorker, Receiver]]:
    settings = fleet_settings_for(redis_server, worker_state_dir=str(tmp_path / "state"))
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(SCRIPT))
    receiver = Receiver(redis_server, settings.key_prefix)
    env = {
        "SANDFLEET_MODEL": f"replay:{path}",
        "SANDFLEET_WEBHOOK_SECRET": SECRET,
        "SANDFLEET_POLICY_WEBHOOK_HOSTS": "127.0.0.1",
        "SANDFLEET_WEBHOOK_BACKOFF_S": "0.2",
        "SANDFLEET_WEBHOOK_RETRIES": "2",
        "SANDFLEET_WEBHOOK_TIMEOUT_S": "2",
    }
    try:
        yield fleet_worker("worker", settings=settings, env=env), receiver
    finally:
        receiver.close()


def test_job_and_batch_webhooks(fleet) -> None:  # type: ignore[no-untyped-def]
    worker, receiver = fleet
    client = worker.client
    specs = [
        {"question": "good question 1", "webhook": f"{receiver.url}/jobs"},
        {"question": "good question 2", "webhook": f"{receiver.url}/jobs"},
        {"question": "bad question", "webhook": f"{receiver.url}/jobs", "code_action": {"max_repairs": 0}},
    ]
    batch = client.submit_batch(specs, batch_webhook=f"{receiver.url}/batch")
    results = {r.job_id: r for r in batch.wait(timeout=180)}
    posts = receiver.wait_for(5)  # 3 jobs (one retried after a 500) + 1 batch
    time.sleep(1.0)  # nothing more arrives
    posts = receiver.posts
    job_posts = [p for p in posts if p["path"] == "/jobs"]
    batch_posts = [p for p in posts if p["path"] == "/batch"]
    assert len(job_posts) == 4 and len(batch_posts) == 1, [
        (p["path"], p["headers"][DELIVERY_HEADER]) for p in posts
    ]

    now = time.time()
    for post in posts:
        signature, timestamp = post["headers"][SIGNATURE_HEADER], post["headers"][TIMESTAMP_HEADER]
        verify_signature(SECRET, signature, timestamp, post["body"], now=now)
        with pytest.raises(ValueError, match="does not match"):
            verify_signature("another secret", signature, timestamp, post["body"], now=now)
        with pytest.raises(ValueError, match="does not match"):
            verify_signature(SECRET, signature, timestamp, post["body"] + b" ", now=now)
        with pytest.raises(ValueError, match="does not match"):
            verify_signature(SECRET, signature, str(int(timestamp) + 1), post["body"], now=now)
    by_job = {p["headers"][DELIVERY_HEADER]: p for p in job_posts}
    assert set(by_job) == set(results)
    for job_id, result in results.items():
        post = by_job[job_id]
        body = json.loads(post["body"])
        assert post["headers"][EVENT_HEADER] == "job.ended"
        assert body["job_id"] == job_id and body["batch_id"] == batch.batch_id
        assert body["status"] == result.status.value
        assert post["job_status"] == result.status.value  # the final record was written before the POST
        if result.status == JobStatus.SUCCEEDED:
            assert body["result"] == {"answer": 42} and body["error"] is None
        else:
            assert body["error"]["kind"] == result.error.kind.value
        # Committed in the chain (which the client verified when it read the result): the body's hash.
        events = [e for e in client.get(job_id).audit() if e.kind == AuditKind.WEBHOOK]
        hashes = {e.data["body_sha256"] for e in events}
        assert hashlib.sha256(post["body"]).hexdigest() in hashes
        assert client.get(job_id).verify().verified
    batch_body = json.loads(batch_posts[0]["body"])
    assert batch_posts[0]["headers"][EVENT_HEADER] == "batch.ended"
    assert batch_body["batch_id"] == batch.batch_id
    assert batch_body["counts"] == {"total": 3, "succeeded": 2, "failed": 1}

    # The outcome of each delivery is in the records: one job's POST needed a second try.
    r = client.redis
    tries = sorted(int(r.hget(f"{worker.settings.key_prefix}:job:{j}", "webhook_tries")) for j in results)
    assert tries == [1, 1, 2]
    assert {r.hget(f"{worker.settings.key_prefix}:job:{j}", "webhook_status") for j in results} == {
        "delivered"
    }
    batch_record = r.hgetall(f"{worker.settings.key_prefix}:batch:{batch.batch_id}:webhook")
    assert batch_record["status"] == "delivered" and batch_record["tries"] == "1"


def test_unreachable_receiver_is_given_up_after_the_retries(fleet) -> None:  # type: ignore[no-untyped-def]
    worker, _ = fleet
    dead = f"http://127.0.0.1:{free_port()}/nobody"
    job = worker.client.submit({"question": "good question", "webhook": dead})
    began = time.monotonic()
    assert job.result(timeout=120).status == JobStatus.SUCCEEDED  # the job is not held up by its webhook
    key = f"{worker.settings.key_prefix}:job:{job.job_id}"
    while worker.client.redis.hget(key, "webhook_status") is None and time.monotonic() - began < 30:
        time.sleep(0.1)
    record = worker.client.redis.hgetall(key)
    assert record["webhook_status"] == "failed" and record["webhook_tries"] == "3", record
    assert "ConnectionRefused" in record["webhook_error"] or "URLError" in record["webhook_error"]


def test_a_host_outside_the_policy_gets_nothing(fleet) -> None:  # type: ignore[no-untyped-def]
    worker, receiver = fleet
    port = receiver.url.rsplit(":", 1)[1]
    job = worker.client.submit({"question": "good question", "webhook": f"http://localhost:{port}/jobs"})
    assert job.result(timeout=120).status == JobStatus.SUCCEEDED
    time.sleep(1.0)
    assert receiver.posts == []  # the same server, by a name the policy (127.0.0.1) does not list
    events = [e for e in job.audit() if e.kind == AuditKind.WEBHOOK]
    assert len(events) == 1 and events[0].data["sent"] is False
    assert "SANDFLEET_POLICY_WEBHOOK_HOSTS" in events[0].data["reason"]
