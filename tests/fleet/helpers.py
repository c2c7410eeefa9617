"""Helpers of the fleet tests (importable, unlike conftest.py)."""

from __future__ import annotations

import uuid

import redis

from sandfleet.core.settings import Settings
from sandfleet.fleet.local_redis import free_port as free_port  # shared by the tests here

AUDIT_SECRET = "fleet-test-secret"


def fleet_settings_for(url: str, **overrides: object) -> Settings:
    """Settings with a fresh key prefix (and so a fresh queue) on the Redis at ``url``."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    return Settings(
        redis_url=url, key_prefix=prefix, audit_secret=AUDIT_SECRET, retention_s=3600, **overrides
    )


def keys_under(client: redis.Redis, prefix: str) -> list[str]:
    """Every key the fleet wrote under ``prefix``, the broker queue included."""
    return sorted(client.scan_iter(match=f"{prefix}*", count=1000))
