"""Whoever can write Redis plants a cancel request or an approval request nested past every cap: the
readers never raise RecursionError (Python's json gives up near 1,000 levels), a planted cancel
still cancels (the key's presence is the request), and one unreadable approval request leaves the
approvers' listing intact. Real Redis; no worker needed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from sandfleet.core.approvals import ApprovalStore
from sandfleet.core.cancel import CancelRequests
from sandfleet.core.errors import JsonLimitError
from sandfleet.core.redis_keys import FleetKeys

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture
def planted(redis_server: str) -> Iterator[tuple[redis.Redis, FleetKeys]]:
    client = redis.Redis.from_url(redis_server, decode_responses=True)
    keys = FleetKeys(f"caps-{uuid.uuid4().hex[:8]}")
    yield client, keys
    if found := list(client.scan_iter(f"{keys.prefix}:*")):
        client.delete(*found)
    client.close()


def test_a_planted_deep_cancel_request_still_cancels_and_never_recurses(
    planted: tuple[redis.Redis, FleetKeys],
) -> None:
    client, keys = planted
    job_id = str(uuid.uuid4())
    client.set(keys.cancel(job_id), DEEP)
    request = CancelRequests(client, keys, 60).requested(job_id)
    assert request is not None and request.by == "an unreadable request"


def test_one_planted_deep_approval_request_leaves_the_listing_intact(
    planted: tuple[redis.Redis, FleetKeys],
) -> None:
    client, keys = planted
    store = ApprovalStore(client, keys, 60)
    rid = "apr-" + "0" * 20
    client.hset(keys.approval(rid), mapping={"request": DEEP, "status": "pending"})
    client.zadd(keys.approvals_pending, {rid: time.time()})
    client.zadd(keys.approvals, {rid: time.time()})
    assert store.requests() == []  # left out, not a RecursionError
    assert store.requests(pending_only=False) == []
    with pytest.raises(JsonLimitError, match="nested"):
        store.get(rid)
