"""Helpers of the fleet tests (importable, unlike conftest.py)."""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from sandfleet.core.settings import Settings
from sandfleet.fleet.local import FleetConfig, LocalFleet, WorkerProcess
from sandfleet.fleet.local_redis import free_port as free_port  # shared by the tests here
from sandfleet.producer.client import Client

AUDIT_SECRET = "fleet-test-secret"
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

    def log(self) -> str:
        return self.worker.log()

    def alive(self) -> bool:
        return self.worker.alive()


def start_worker(
    settings: Settings, folder: Path, *, tools: str = "", sandboxes: int = 2, concurrency: int = 8
) -> FleetWorker:
    """A worker with ``settings``' Redis, key prefix, audit secret and retention; fails the test if it
    does not start."""
    config = FleetConfig(
        workers=0,
        concurrency=concurrency,
        sandboxes=sandboxes,
        tools=tools,
        loglevel="info",
        env={"SANDFLEET_RETENTION_S": str(settings.retention_s), "SANDFLEET_POOL_SIZE": "0"},
    )
    fleet = LocalFleet(
        config,
        folder,
        redis_url=settings.redis_url,
        key_prefix=settings.key_prefix,
        audit_secret=settings.audit_secret,
    )
    try:
        worker = fleet.start_worker(f"test-{uuid.uuid4().hex[:6]}")
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
    return Settings(
        redis_url=url, key_prefix=prefix, audit_secret=AUDIT_SECRET, retention_s=3600, **overrides
    )


def keys_under(client: redis.Redis, prefix: str) -> list[str]:
    """Every key the fleet wrote under ``prefix``, the broker queue included."""
    return sorted(client.scan_iter(match=f"{prefix}*", count=1000))
