"""Broker and records apart: SANDFLEET_RESULTS_REDIS_URL holds records, audit and keys; the broker
Redis holds only Celery's messages. Real workers, end to end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from sandfleet.fleet.local import LocalFleet
from sandfleet.producer.client import Client

from .harness import outcome_of, sleeper_script

pytestmark = [pytest.mark.slow]


def test_records_live_in_the_results_redis_and_jobs_run_through_the_broker(
    redis_factory: Callable[..., Any], make_fleet: Callable[..., LocalFleet]
) -> None:
    broker, records = redis_factory(), redis_factory()
    fleet = make_fleet(broker.url, SANDFLEET_RESULTS_REDIS_URL=records.url)
    model = f"replay:{sleeper_script(fleet.scripts_dir, 0.1)}"
    fleet.start_worker(concurrency=2, sandboxes=2)
    settings = fleet.settings.model_copy(update={"results_redis_url": records.url})
    with Client(settings=settings) as client:
        jobs = [client.submit(f"Sleep {i}", model=model) for i in range(3)]
        outcomes = [outcome_of(client, j.job_id, 120) for j in jobs]
        verified = [client.get(j.job_id).verify().verified for j in jobs]
    assert outcomes == ["succeeded"] * 3
    assert verified == [True] * 3
    prefix = fleet.key_prefix
    on_broker = redis.Redis.from_url(broker.url, decode_responses=True)
    on_records = redis.Redis.from_url(records.url, decode_responses=True)
    try:
        for job in jobs:
            assert on_records.hget(f"{prefix}:job:{job.job_id}", "status") == "succeeded"
            assert not on_broker.exists(f"{prefix}:job:{job.job_id}")
        assert not list(on_broker.scan_iter(f"{prefix}:job:*"))
        assert on_broker.exists("_kombu.binding." + prefix)  # Celery's messages went through the broker
        assert not on_records.exists("_kombu.binding." + prefix)
    finally:
        on_broker.close()
        on_records.close()
