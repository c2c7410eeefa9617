"""Helpers of the fleet tests (importable, unlike conftest.py)."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from sandfleet.core.audit import RedisAuditSink
from sandfleet.core.chain import sha256_hex
from sandfleet.core.contracts import AuditKind
from sandfleet.core.settings import Settings
from sandfleet.core.store import JobStore
from sandfleet.fleet.local import FleetConfig, LocalFleet, WorkerProcess
from sandfleet.fleet.local_redis import free_port as free_port  # shared by the tests here
from sandfleet.producer.client import Client

TEST_WORKER = "test-worker@tests"  # the worker the ``store`` fixture signs as
JOB_TIMEOUT_S = 120.0
SANDFLEET = str(Path(sys.executable).with_name("sandfleet"))


@dataclass
class FleetWorker:
    """One real ``sandfleet worker`` (of a LocalFleet on the test's Redis) and a client of its fleet."""

    fleet: LocalFleet
    worker: WorkerProcess
    settings: Settings
    client: Client

    @property
    def process(self) -> object:
        return self.worker.process

    @property
    def scripts_dir(self) -> Path:
        """The worker's SANDFLEET_REPLAY_SCRIPTS_DIR: a job's replay:FILE must be in there."""
        return self.fleet.scripts_dir

    def log(self) -> str:
        return self.worker.log()

    def alive(self) -> bool:
        return self.worker.alive()


def start_worker(
    settings: Settings,
    folder: Path,
    *,
    tools: str = "",
    sandboxes: int = 2,
    concurrency: int = 8,
    name: str | None = None,
    env: dict[str, str] | None = None,
    replay_scripts_dir: Path | None = None,
) -> FleetWorker:
    """A worker (``name@host``, a fresh name when None) with ``settings``' Redis, key prefix and
    retention, and its signing key in ``folder/worker-state``; fails the test if it does not start.
    ``env``: more ``SANDFLEET_*`` settings for it. ``replay_scripts_dir``: its
    SANDFLEET_REPLAY_SCRIPTS_DIR (default ``folder/scripts``; ``FleetWorker.scripts_dir``)."""
    config = FleetConfig(
        workers=0,
        concurrency=concurrency,
        sandboxes=sandboxes,
        tools=tools,
        loglevel="info",
        replay_scripts_dir=replay_scripts_dir,
        env={"SANDFLEET_RETENTION_S": str(settings.retention_s), "SANDFLEET_POOL_SIZE": "0", **(env or {})},
    )
    fleet = LocalFleet(config, folder, redis_url=settings.redis_url, key_prefix=settings.key_prefix)
    try:
        worker = fleet.start_worker(name or f"test-{uuid.uuid4().hex[:6]}")
    except RuntimeError as e:
        fleet.stop()
        pytest.fail(f"sandfleet worker did not start: {e}")
    return FleetWorker(fleet, worker, settings, Client(settings=settings))


def stop_worker(worker: FleetWorker) -> None:
    """SIGTERM (warm shutdown: the pool is drained), SIGKILL after a minute; its containers removed."""
    worker.fleet.stop()
    worker.client.close()


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
