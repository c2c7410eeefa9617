"""Helpers of the fleet tests (importable, unlike conftest.py)."""

from __future__ import annotations

import uuid

import redis

from sandfleet.core.audit import RedisAuditSink
from sandfleet.core.chain import sha256_hex
from sandfleet.core.contracts import AuditKind
from sandfleet.core.settings import Settings
from sandfleet.core.store import JobStore
from sandfleet.fleet.local_redis import free_port as free_port  # shared by the tests here

TEST_WORKER = "test-worker@tests"  # the worker the ``store`` fixture signs as


def fleet_settings_for(url: str, **overrides: object) -> Settings:
    """Settings with a fresh key prefix (and so a fresh queue) on the Redis at ``url``."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    return Settings(redis_url=url, key_prefix=prefix, retention_s=3600, **overrides)


def keys_under(client: redis.Redis, prefix: str) -> list[str]:
    """Every key the fleet wrote under ``prefix``, the broker queue included."""
    return sorted(client.scan_iter(match=f"{prefix}*", count=1000))


def start_job(store: JobStore, job_id: str) -> RedisAuditSink:
    """Mark the job running and write its ``running`` event, as a worker's delivery does; returns its
    audit sink (signed with the store's key)."""
    record = store.record(job_id)
    assert record is not None and record.spec is not None and store.signer is not None
    store.mark_running(job_id, store.signer.worker)
    sink = store.audit_sink(job_id)
    spec_digest = sha256_hex(record.spec.model_dump_json())
    sink.emit(
        AuditKind.STATE, {"status": "running", "worker": store.signer.worker, "spec_sha256": spec_digest}
    )
    return sink
