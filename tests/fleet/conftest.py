"""Fleet test fixtures: per-test key prefixes on the shared throwaway Redis (tests/conftest.py).

Each test gets its own ``key_prefix``, and the broker queue is named after the prefix, so tests on one
Redis never see each other's records or messages. Everything under the prefix is deleted afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from sandfleet.core.settings import Settings, get_settings
from sandfleet.core.store import JobStore
from sandfleet.producer.client import Client

from .helpers import fleet_settings_for, keys_under


@pytest.fixture
def settings(redis_server: str) -> Settings:
    return fleet_settings_for(redis_server)


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
def store(settings: Settings, raw_redis: redis.Redis) -> Iterator[JobStore]:
    s = JobStore.from_settings(settings)
    yield s
    s.redis.close()


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Environment for ``sandfleet`` commands run in this process (the settings cache is cleared)."""
    env = {
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
        "SANDFLEET_AUDIT_SECRET": settings.audit_secret,
        "SANDFLEET_RETENTION_S": str(settings.retention_s),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    yield env
    get_settings.cache_clear()
