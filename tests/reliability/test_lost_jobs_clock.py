"""Reconciliation ages a job by Redis's clock, not by the sweeping host's (issue 24: a host whose
clock is 30 s off). A producer records a job, then publishes its message; a sweep that looks in
between must not take it for lost. With the sweeper's own clock 30 s ahead, a job recorded a moment
ago looked 30 s old, past the 10 s ``LOST_AFTER_S``, and was published a second time."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import pytest
import redis

from sandfleet.core.contracts import JobSpec, JobStatus
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.store import JobStore
from sandfleet.worker.delivery import recovery

SKEW_S = 30.0


def test_a_sweeper_30_s_ahead_does_not_take_a_job_still_being_published_for_lost(
    redis_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"lost-clock-{uuid.uuid4().hex[:8]}"
    store = JobStore.from_settings(Settings(redis_url=redis_server, key_prefix=prefix))
    keys = FleetKeys(prefix)
    client = redis.Redis.from_url(redis_server)
    try:
        # Recorded by a producer whose clock is right; its message is not published yet.
        store.record_queued([("just-recorded", JobSpec(question="q"))])
        # A job recorded 11 s ago (by Redis's clock) whose message never came: really lost.
        seconds, _ = client.time()
        client.zadd(keys.status_index(JobStatus.QUEUED), {"long-lost": seconds - 11})
        ahead = SimpleNamespace(time=lambda: time.time() + SKEW_S, monotonic=time.monotonic)
        monkeypatch.setattr(recovery, "time", ahead)  # the sweeping worker's host runs 30 s ahead
        assert recovery.lost_jobs(client, keys, prefix, min_age_s=recovery.LOST_AFTER_S) == ["long-lost"]
    finally:
        client.delete(*client.keys(f"{prefix}:*") or ["-"])
        client.close()
        store.redis.close()
