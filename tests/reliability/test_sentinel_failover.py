"""Redis without a single point of failure: primary + replica + three Sentinels (sandfleet/fleet/sentinel_redis.py).

Clients of the fleet reach Redis through the ``sentinel://`` form and follow a failover by
themselves; a final record is acknowledged by the replica (WAIT) before its job counts as done; a
fleet of real workers loses no job and runs none twice to the end when the primary is SIGKILLed
mid-batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from sandfleet.core.contracts import JobResult, JobSpec, JobStatus
from sandfleet.core.redis_connect import connect
from sandfleet.core.settings import Settings
from sandfleet.core.signing import FileSigner
from sandfleet.core.store import JobStore
from sandfleet.fleet.local import LocalFleet
from sandfleet.fleet.sentinel_redis import SentinelRedis

from .harness import final_state_events, note_figure, outcome_of, running_on, sleeper_script, wait_for

JOBS = 6


@pytest.fixture
def sentinel_redis(tmp_path: Path, redis_binary: str) -> Iterator[SentinelRedis]:
    cluster = SentinelRedis(tmp_path / "sentinel").start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_client_on_the_sentinel_url_follows_a_failover_by_itself(sentinel_redis: SentinelRedis) -> None:
    client = connect(sentinel_redis.url, Settings())
    try:
        # Acknowledged by the replica before the kill (WAIT on the SET's own connection, as the
        # store's seal does): replication is asynchronous, and a loaded CI run once lost it.
        before = client.pipeline(transaction=False)
        before.set("before", "1")
        before.execute_command("WAIT", 1, 5000)
        assert before.execute() == [True, 1]
        first = sentinel_redis.primary_port()
        assert first == sentinel_redis.primary.port
        sentinel_redis.primary.stop(kill=True)
        # No retry loop here: the client's own retries span the failover.
        assert wait_for(lambda: sentinel_redis.primary_port() == sentinel_redis.replica.port, 30)
        client.set("after", "2")
        assert client.get("after") == "2"
        assert client.get("before") == "1"  # replicated before the primary died
        assert int(client.connection_pool.get_master_address()[1]) == sentinel_redis.replica.port  # type: ignore[attr-defined]
    finally:
        client.close()


def test_a_final_record_is_acknowledged_by_the_replica(sentinel_redis: SentinelRedis, tmp_path: Path) -> None:
    settings = Settings(redis_url=sentinel_redis.url, key_prefix="wait", worker_state_dir=str(tmp_path / "w"))
    store = JobStore.from_settings(settings)
    store.signer = FileSigner(tmp_path / "w" / "keys" / "w1.pem", "w1")
    try:
        store.record_queued([("job-1", JobSpec(question="q"))])
        assert store.await_replicas("job-1") == 1
        store.finish("job-1", JobResult(job_id="job-1", status=JobStatus.SUCCEEDED, result="r"))
        replica = redis.Redis(port=sentinel_redis.replica.port, decode_responses=True)
        assert replica.hget(store.keys.job("job-1"), "status") == "succeeded"  # there already, no polling
        replica.close()
    finally:
        store.redis.close()


@pytest.mark.slow
def test_the_primary_killed_mid_batch_loses_no_job_and_runs_none_twice(
    sentinel_redis: SentinelRedis, make_fleet: Callable[..., LocalFleet]
) -> None:
    fleet = make_fleet(sentinel_redis.url)
    model = f"replay:{sleeper_script(fleet.scripts_dir, 3)}"
    fleet.start_worker(concurrency=2, sandboxes=2)
    fleet.start_worker(concurrency=2, sandboxes=2)
    with fleet.client() as client:
        jobs = [client.submit(f"Sleep {i}", model=model) for i in range(JOBS)]
        assert wait_for(lambda: sum(running_on(client, j.job_id) is not None for j in jobs) >= 2, 60)
    sentinel_redis.primary.stop(kill=True)
    with fleet.client() as client:
        outcomes = {j.job_id: outcome_of(client, j.job_id, 180) for j in jobs}
        twice = sum(
            final_state_events(client, j) > 1 for j, o in outcomes.items() if not o.startswith("lost")
        )
        unverified = [j for j in outcomes if not client.get(j).verify().verified]
    figures: dict[str, Any] = {
        "jobs": JOBS,
        "lost": sum(o.startswith("lost") for o in outcomes.values()),
        "done_twice": twice,
        "outcomes": sorted(outcomes.values()),
        "primary_now": sentinel_redis.primary_port(),
    }
    note_figure("sentinel_failover", figures)
    assert figures["primary_now"] == sentinel_redis.replica.port, figures
    assert figures["lost"] == 0 and figures["done_twice"] == 0, figures
    assert set(outcomes.values()) == {"succeeded"}, figures
    assert unverified == [], figures  # every audit event a result depends on survived the failover
