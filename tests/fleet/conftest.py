"""Fleet test fixtures: per-test key prefixes on the shared throwaway Redis (tests/conftest.py).

Each test gets its own ``key_prefix``, and the broker queue is named after the prefix, so tests on one
Redis never see each other's records or messages. Everything under the prefix is deleted afterwards.
The ``store`` plays a worker: it signs with the key of worker ``TEST_WORKER``, made in the test's own
worker state folder and registered like a real worker's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from sandfleet.core.key_registry import KeyRegistry, start_signer
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings, get_settings
from sandfleet.core.signing import FileSigner
from sandfleet.core.store import JobStore
from sandfleet.producer.client import Client

from .helpers import TEST_WORKER, fleet_settings_for, keys_under


@pytest.fixture
def settings(redis_server: str, tmp_path: Path) -> Settings:
    return fleet_settings_for(redis_server, worker_state_dir=str(tmp_path / "worker-state"))


@pytest.fixture
def raw_redis(redis_server: str, settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    yield client
    leftovers = keys_under(client, settings.key_prefix)
    if leftovers:
        client.delete(*leftovers)
    client.close()


@pytest.fixture
def client(settings: Settings, raw_redis: redis.Redis) -> Iterator[Client]:
    with Client(settings=settings) as c:
        yield c


@pytest.fixture
def signer(settings: Settings, raw_redis: redis.Redis) -> FileSigner:
    """Worker ``TEST_WORKER``'s key, registered in the fleet's key register."""
    return start_signer(settings, TEST_WORKER, KeyRegistry(raw_redis, FleetKeys(settings.key_prefix)))


@pytest.fixture
def store(settings: Settings, signer: FileSigner) -> Iterator[JobStore]:
    s = JobStore.from_settings(settings, signer)
    yield s
    s.redis.close()


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Environment for ``sandfleet`` commands run in this process (the settings cache is cleared)."""
    env = {
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
        "SANDFLEET_WORKER_STATE_DIR": settings.worker_state_dir,
        "SANDFLEET_RETENTION_S": str(settings.retention_s),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield env
    get_settings.cache_clear()
