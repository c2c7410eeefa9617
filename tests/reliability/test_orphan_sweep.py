"""The recovery sweep's orphans (sandfleet/worker/delivery/recovery.py), on a real Redis with kombu's
own restore: an unacknowledged message that no live worker holds goes back once sweeps have seen it
so for ``orphan_after_s`` by Redis's clock, whatever delivery time the delivering host's clock wrote.

The entries are written as kombu's Redis transport writes them (``unacked`` holds the message, its
exchange and routing key; ``unacked_index`` the delivery time as the consuming host's clock read it).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from celery import Celery

from sandfleet.core.redis_keys import FleetKeys
from sandfleet.worker.delivery.recovery import KOMBU_UNACKED, KOMBU_UNACKED_INDEX, sweep

AN_HOUR_BEHIND_S = 3600.0
AFTER_S = 1.0


@dataclass
class Broker:
    client: redis.Redis
    keys: FleetKeys
    app: Celery
    queue: str

    def delivered(self, job_id: str, *, clock_offset_s: float = 0.0) -> str:
        """A message of this queue delivered and not acknowledged, by a host whose clock is off."""
        tag = f"tag-{uuid.uuid4().hex}"
        payload = {
            "body": "",
            "headers": {"id": job_id},
            "properties": {"delivery_tag": tag, "delivery_info": {}},
        }
        self.client.hset(KOMBU_UNACKED, tag, json.dumps([payload, "", self.queue]))
        self.client.zadd(KOMBU_UNACKED_INDEX, {tag: time.time() + clock_offset_s})
        return tag

    def held_by_live_worker(self, tag: str, job_id: str) -> None:
        self.client.sadd(self.keys.workers, "alive")
        self.client.set(self.keys.heartbeat("alive"), "{}", ex=60)
        self.client.hset(self.keys.worker_held("alive"), tag, job_id)

    def sweep(self) -> list[str]:
        report = sweep(self.client, self.keys, self.app, self.queue, orphan_after_s=AFTER_S)
        assert report.ran
        return report.orphans

    def queued_ids(self) -> list[str]:
        return [json.loads(raw)["headers"]["id"] for raw in self.client.lrange(self.queue, 0, -1)]


@pytest.fixture
def broker(redis_server: str) -> Iterator[Broker]:
    client = redis.Redis.from_url(redis_server)
    app = Celery(broker=redis_server)
    run = uuid.uuid4().hex[:8]
    try:
        yield Broker(client, FleetKeys(f"orphans-{run}"), app, f"queue-{run}")
    finally:
        app.close()
        client.close()


def test_a_message_delivered_by_a_host_an_hour_behind_is_not_handed_back_at_first_sight(
    broker: Broker,
) -> None:
    tag = broker.delivered("j1", clock_offset_s=-AN_HOUR_BEHIND_S)  # by its clock, an hour old already
    assert broker.sweep() == []  # a worker may be recording it as held this very moment
    assert broker.client.hexists(broker.keys.orphan_suspects, tag)
    time.sleep(AFTER_S + 0.2)
    assert broker.sweep() == [tag]
    assert broker.queued_ids() == ["j1"] and not broker.client.hexists(KOMBU_UNACKED, tag)
    broker.sweep()
    assert not broker.client.hexists(broker.keys.orphan_suspects, tag)  # handed back: forgotten


def test_a_message_delivered_by_a_host_ahead_still_goes_back(broker: Broker) -> None:
    tag = broker.delivered("j2", clock_offset_s=+AN_HOUR_BEHIND_S)  # by its clock, not delivered yet
    assert broker.sweep() == []
    time.sleep(AFTER_S + 0.2)
    assert broker.sweep() == [tag] and broker.queued_ids() == ["j2"]


def test_a_message_a_live_worker_holds_never_goes_back(broker: Broker) -> None:
    tag = broker.delivered("j3", clock_offset_s=-AN_HOUR_BEHIND_S)
    broker.held_by_live_worker(tag, "j3")
    for _ in range(2):
        assert broker.sweep() == []
        time.sleep(AFTER_S + 0.2)
    assert broker.queued_ids() == [] and broker.client.hexists(KOMBU_UNACKED, tag)
    assert not broker.client.hexists(broker.keys.orphan_suspects, tag)


def test_a_suspect_acknowledged_between_sweeps_is_forgotten(broker: Broker) -> None:
    tag = broker.delivered("j4")
    assert broker.sweep() == []
    broker.client.hdel(KOMBU_UNACKED, tag)
    broker.client.zrem(KOMBU_UNACKED_INDEX, tag)
    time.sleep(AFTER_S + 0.2)
    assert broker.sweep() == [] and broker.queued_ids() == []
    assert not broker.client.hexists(broker.keys.orphan_suspects, tag)


def test_a_planted_first_sight_that_is_not_a_time_is_counted_from_now(broker: Broker) -> None:
    """Whoever can write Redis: a garbled entry does not stop the sweep (nor hand the message back)."""
    tag = broker.delivered("j5")
    broker.client.hset(broker.keys.orphan_suspects, tag, "long ago")
    assert broker.sweep() == []
    time.sleep(AFTER_S + 0.2)
    assert broker.sweep() == [tag]
