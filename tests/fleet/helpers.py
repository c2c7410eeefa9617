"""Helpers of the fleet tests (importable, unlike conftest.py)."""

from __future__ import annotations

import socket
import uuid

import redis

from producer.settings import Settings

AUDIT_SECRET = "fleet-test-secret"


def free_port() -> int:
    """A port nothing listens on (for "Redis is down")."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fleet_settings_for(url: str, **overrides: object) -> Settings:
    """Settings with a fresh key prefix (and so a fresh queue) on the Redis at ``url``."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    return Settings(
        redis_url=url, key_prefix=prefix, audit_secret=AUDIT_SECRET, retention_s=3600, **overrides
    )


def keys_under(client: redis.Redis, prefix: str) -> list[str]:
    """Every key the fleet wrote under ``prefix``, the broker queue included."""
    return sorted(client.scan_iter(match=f"{prefix}*", count=1000))
