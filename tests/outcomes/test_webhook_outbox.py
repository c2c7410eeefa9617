"""The webhook outbox end to end: real ``sandfleet worker`` processes on a real Redis, a replay model,
Docker sandboxes, and a real HTTP receiver; the first worker is killed (SIGKILL) after its job's seal
and before its POST got through, and a second, live worker delivers it.

Checked, with the receiver down until the kill (the first worker's tries are refused; its retries
would go on for minutes, so the second worker sends because the first one stopped beating): the POST
arrives once, with the body the chain committed, the committed timestamp, the signature of that
timestamp and body, and ``Idempotency-Key: job.ended:JOB``; the record says delivered by the outbox,
and the outbox is empty. With a receiver that got the first POST but whose answer the first worker
never read (killed while waiting): the second worker sends it again, and both POSTs carry the same
body, signature and key, so the receiver can drop the second.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sandfleet_testing.workers import FleetWorker, WorkerFactory, fleet_settings_for

from sandfleet.core.contracts import AuditKind, JobStatus
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.webhook_signing import (
    DELIVERY_HEADER,
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign,
    verify_signature,
)
from sandfleet.fleet.local_redis import free_port

from .webhook_receiver import OutboxReceiver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SECRET = "outbox-e2e-secret"
SCRIPT = {"rules": [{"match": "good question", "responses": ["```python\nprint('RESULT: 42')\n```"]}]}


@dataclass
class Fleet:
    """Workers of one fleet (one key prefix), started one after another by the test."""

    settings: Settings
    env: dict[str, str]
    start_with: WorkerFactory  # fleet_worker
    workers: list[FleetWorker] = field(default_factory=list)

    def start(self, name: str, **env: str) -> FleetWorker:
        worker = self.start_with(name, settings=self.settings, env={**self.env, **env})
        self.workers.append(worker)
        return worker

    def kill(self, worker: FleetWorker) -> None:
        """SIGKILL: it dies holding what it held (its outbox entry, a POST in flight)."""
        worker.fleet.kill(worker.worker)
        worker.worker.process.wait()

    def members(self) -> list[str]:
        client = self.workers[0].client.redis
        return list(client.zrange(FleetKeys(self.settings.key_prefix).webhook_outbox, 0, -1))

    def wait_outbox_empty(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.members() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.members() == []


@pytest.fixture
def fleet(redis_server: str, fleet_worker: WorkerFactory, tmp_path: Path) -> Fleet:
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(SCRIPT))
    env = {
        "SANDFLEET_MODEL": f"replay:{path}",
        "SANDFLEET_WEBHOOK_SECRET": SECRET,
        "SANDFLEET_POLICY_WEBHOOK_HOSTS": "127.0.0.1",
        # A long retry schedule (20 retries, minutes): another worker sends only because this one died.
        "SANDFLEET_WEBHOOK_RETRIES": "20",
        "SANDFLEET_WEBHOOK_BACKOFF_S": "1",
        "SANDFLEET_WEBHOOK_TIMEOUT_S": "2",
    }
    return Fleet(fleet_settings_for(redis_server), env, fleet_worker)


def committed(worker: FleetWorker, job_id: str) -> dict[str, object]:
    [event] = [e for e in worker.client.get(job_id).audit() if e.kind == AuditKind.WEBHOOK]
    return event.data


def test_a_worker_killed_after_the_seal_before_its_post_is_relieved_by_a_live_one(fleet: Fleet) -> None:
    port = free_port()  # nothing listens there yet: every try of the first worker is refused
    first = fleet.start("first")
    job = first.client.submit({"question": "good question", "webhook": f"http://127.0.0.1:{port}/jobs"})
    assert job.result(timeout=120).status == JobStatus.SUCCEEDED  # sealed: its final record is written
    member = fleet.members()
    assert len(member) == 1 and member[0].startswith(f"{job.job_id}/job.ended/")
    fleet.kill(first)
    key = FleetKeys(fleet.settings.key_prefix).job(job.job_id)
    assert first.client.redis.hget(key, "webhook_status") != "delivered"
    receiver = OutboxReceiver(port)  # the receiver comes up after the kill
    try:
        second = fleet.start("second")
        [post] = receiver.wait_for(1, timeout_s=90)
        data = committed(second, job.job_id)
        body, headers = post["body"], post["headers"]
        assert hashlib.sha256(body).hexdigest() == data["body_sha256"]
        assert headers[TIMESTAMP_HEADER] == str(data["timestamp"])
        assert headers[SIGNATURE_HEADER] == sign(SECRET, int(str(data["timestamp"])), body)
        verify_signature(SECRET, headers[SIGNATURE_HEADER], headers[TIMESTAMP_HEADER], body, now=time.time())
        assert headers[IDEMPOTENCY_HEADER] == f"job.ended:{job.job_id}"
        assert json.loads(body)["job_id"] == job.job_id and json.loads(body)["result"] == 42
        fleet.wait_outbox_empty()
        record = second.client.redis.hgetall(key)
        assert record["webhook_status"] == "delivered" and record["webhook_outbox_tries"] == "1", record
        assert "sending from the outbox" in second.log()
        time.sleep(1.0)
        assert len(receiver.posts) == 1  # sent once
        assert job.verify().verified
    finally:
        receiver.close()


def test_a_post_whose_answer_was_never_read_is_sent_again_with_the_same_key(fleet: Fleet) -> None:
    answer = threading.Event()
    receiver = OutboxReceiver(hold=answer)  # gets the first POST, answers it only once released
    try:
        first = fleet.start("first", SANDFLEET_WEBHOOK_TIMEOUT_S="60")
        job = first.client.submit({"question": "good question", "webhook": f"{receiver.url}/jobs"})
        receiver.wait_for(1, timeout_s=120)  # arrived; the first worker waits for the answer
        fleet.kill(first)
        answer.set()  # answered into a dead connection: nobody records the delivery
        second = fleet.start("second")
        one, two = receiver.wait_for(2, timeout_s=90)
        for header in (IDEMPOTENCY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, DELIVERY_HEADER):
            assert one["headers"][header] == two["headers"][header], header
        assert one["body"] == two["body"]
        assert one["headers"][IDEMPOTENCY_HEADER] == f"job.ended:{job.job_id}"
        fleet.wait_outbox_empty()
        key = FleetKeys(fleet.settings.key_prefix).job(job.job_id)
        assert second.client.redis.hget(key, "webhook_status") == "delivered"
    finally:
        receiver.close()
