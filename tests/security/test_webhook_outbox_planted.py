"""Whoever can write Redis, against the webhook outbox a worker reads back: it plants entries to make a
live worker POST somewhere, or something, of its choosing.

A real ``sandfleet worker`` (replay model, Docker sandbox) on the test's Redis, whose webhook policy
lists 127.0.0.1; a job's webhook is delivered to a real receiver there. The test then writes Redis
with plain commands, as anyone holding the Redis password can, planting one outbox entry at a time
(due at once, naming a dead worker) for that job: its genuine body to another server on 127.0.0.1 (a
host the policy allows), a body of the attacker's own to that server, and the genuine POST again.
The worker's sweep refuses the first two (the job's signed chain commits neither), says why in the
log and ``{p}:rejected``, and drops the third (the record says it was delivered): the other server
gets nothing, the receiver nothing more. (The whole matrix, and the residual of a key planted in the
register: tests/outcomes/test_webhook_outbox_checks.py.)
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from outcomes.webhook_receiver import OutboxReceiver
from sandfleet_testing.workers import FleetWorker, WorkerFactory

from sandfleet.core.contracts import JobStatus
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.webhook_outbox import OutboxEntry, WebhookOutbox
from sandfleet.core.webhook_signing import DELIVERY_HEADER, EVENT_HEADER, TIMESTAMP_HEADER

from .helpers import record

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = {"rules": [], "default": ["```python\nprint('RESULT: 42')\n```"] * 3}


@pytest.fixture
def worker(fleet_worker: WorkerFactory, tmp_path: Path) -> FleetWorker:
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(SCRIPT))
    env = {
        "SANDFLEET_MODEL": f"replay:{path}",
        "SANDFLEET_WEBHOOK_SECRET": "planted-outbox-secret",
        "SANDFLEET_POLICY_WEBHOOK_HOSTS": "127.0.0.1",
        "SANDFLEET_WEBHOOK_RETRIES": "0",
    }
    return fleet_worker("worker", env=env)


def swept(worker: FleetWorker, outbox: WebhookOutbox, member: str, timeout_s: float = 30.0) -> None:
    """Wait until the worker's sweep has taken ``member`` out of the outbox."""
    deadline = time.monotonic() + timeout_s
    while worker.client.redis.zscore(outbox.keys.webhook_outbox, member) is not None:
        assert time.monotonic() < deadline, f"the worker never swept {member}"
        time.sleep(0.1)


def test_planted_outbox_entries_make_a_live_worker_post_nothing(worker: FleetWorker) -> None:
    receiver = OutboxReceiver()
    other = OutboxReceiver()  # on 127.0.0.1 too: the policy would let a POST through
    try:
        job = worker.client.submit({"question": "q", "webhook": f"{receiver.url}/jobs"})
        assert job.result(timeout=120).status == JobStatus.SUCCEEDED
        [post] = receiver.wait_for(1)
        keys = FleetKeys(worker.settings.key_prefix)
        outbox = WebhookOutbox(worker.client.redis, keys, worker.settings.retention_s)
        deadline = time.monotonic() + 30
        while worker.client.redis.zcard(keys.webhook_outbox) and time.monotonic() < deadline:
            time.sleep(0.1)
        genuine = OutboxEntry(
            job.job_id,
            f"{receiver.url}/jobs",
            post["headers"][EVENT_HEADER],
            post["headers"][DELIVERY_HEADER],
            post["body"],
            int(post["headers"][TIMESTAMP_HEADER]),
            "dead-worker@nowhere",
            time.time() - 60,
        )
        planted = {
            "its genuine body to another server": replace(genuine, url=f"{other.url}/steal"),
            "a body of the attacker's own": replace(genuine, body=post["body"].replace(b"42", b"4242")),
            "the genuine POST again": genuine,
        }
        for case, entry in planted.items():
            outbox.add(entry, due_at=0)
            swept(worker, outbox, entry.member)
            record(f"webhook outbox: {case}", "runc", not other.posts, f"{len(other.posts)} POSTs elsewhere")
        time.sleep(1.0)  # a send the sweep started would have arrived by now
        assert other.posts == [] and len(receiver.posts) == 1
        rejected = [f for _id, f in worker.client.redis.xrange(keys.rejected)]
        whys = [
            json.loads(f["details"])["why"] for f in rejected if f["reason"] == "webhook outbox entry refused"
        ]
        assert sorted(whys) == [
            "its body_sha256 is not the one the job's chain committed",
            "its url is not the one the job's chain committed",
        ]
        assert worker.log().count("refused, not sent") == 2
    finally:
        receiver.close()
        other.close()
