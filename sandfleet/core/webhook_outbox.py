"""The webhook outbox: committed completion webhooks not yet delivered, kept in Redis so that any live
worker sends them when the worker that committed them cannot (killed between the seal and a
successful POST, or still failing after its retries).

A worker that commits a POST in a job's chain (sandfleet/worker/webhooks/hooks.py) also writes it
here, before the seal: the entry (``{p}:job:{id}:webhooks``, the exact body and the committed
timestamp, the committing worker) and its member in the fleet's sorted set
(``{p}:webhooks:outbox``), scored by when a sweep first looks at it. A successful POST removes both
in the same MULTI that records the delivery. Each worker's sweep (sandfleet/worker/webhooks/sweep.py)
takes the due members, claims one with :data:`~sandfleet.core.lua.CLAIM_WEBHOOK` (an atomic move of
its score past the try's lease, so two workers do not send one entry at the same moment) and sends
it, once the job's verified chain shows that its sealing worker committed exactly that POST.

The entry is a Redis value a worker reads back: its member names the body's SHA-256, its body must
hash to it, and nothing of it is trusted before the chain check (SECURITY.md, "Webhook outbox").
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import redis
from redis.typing import EncodableT, FieldT

from sandfleet.core import json_limits
from sandfleet.core.lua import CLAIM_WEBHOOK
from sandfleet.core.redis_keys import FleetKeys, check_id
from sandfleet.core.replies import text_list, text_or_none

OUTBOX_GRACE_S = 5.0  # a new entry is first looked at this long after its commit
SWEEP_BATCH = 100  # entries one sweep looks at, at most (a flood of planted members costs no more)
MAX_ENTRY_CHARS = 1024**2  # a committed body is at most ~70 KiB (payloads.MAX_RESULT_BYTES + the rest)
_FIELD = re.compile(r"^([a-z]+\.[a-z]+)/([0-9a-f]{64})$")


class OutboxEntryError(ValueError):
    """An outbox member or entry that is not one a worker wrote (malformed, or its body not its hash)."""


@dataclass(frozen=True)
class OutboxEntry:
    """One committed POST: the job whose chain commits it, where, which event, the delivery id, the
    exact body and its signing timestamp, the worker that committed it and when (epoch seconds)."""

    job_id: str
    url: str
    event: str
    delivery_id: str
    body: bytes
    timestamp: int
    worker: str
    committed_at: float

    @property
    def body_sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()

    @property
    def field(self) -> str:
        """The entry's field in the job's outbox hash: ``{event}/{body sha256}``."""
        return f"{self.event}/{self.body_sha256}"

    @property
    def member(self) -> str:
        """The entry's member in the fleet's outbox: ``{job id}/{event}/{body sha256}``."""
        return f"{self.job_id}/{self.field}"

    def to_json(self) -> str:
        data = {
            "url": self.url,
            "event": self.event,
            "delivery": self.delivery_id,
            "body": self.body.decode(),
            "timestamp": self.timestamp,
            "worker": self.worker,
            "committed_at": self.committed_at,
        }
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, member: str, raw: str) -> OutboxEntry:
        """The entry stored under ``member``.

        Raises:
            OutboxEntryError: not a JSON object of the right fields, or its event or body is not the
                one its member names.
        """
        job_id, event, sha = parse_member(member)
        if len(raw) > MAX_ENTRY_CHARS:
            raise OutboxEntryError(
                f"outbox entry {member} has {len(raw)} characters; at most {MAX_ENTRY_CHARS}"
            )
        try:
            data: Any = json_limits.loads(raw, "a webhook outbox entry", cap=4)
            entry = cls(
                job_id,
                _str(data, "url"),
                _str(data, "event"),
                _str(data, "delivery"),
                _str(data, "body").encode(),
                int(data["timestamp"]),
                _str(data, "worker"),
                float(data["committed_at"]),
            )
        except (ValueError, TypeError, KeyError) as e:
            raise OutboxEntryError(f"outbox entry {member} cannot be read: {e}") from None
        if entry.event != event or entry.body_sha256 != sha:
            raise OutboxEntryError(f"outbox entry {member}: its event or body is not the one its name holds")
        return entry


def _str(data: Any, name: str) -> str:
    value = data[name]
    if not isinstance(value, str):
        raise TypeError(f"{name} is not a string")
    return value


def parse_member(member: str) -> tuple[str, str, str]:
    """``(job id, event, body sha256)`` of an outbox member.

    Raises:
        OutboxEntryError: not ``{job id}/{event}/{sha256}`` with a safe job id.
    """
    job_id, _, field = member.partition("/")
    match = _FIELD.match(field)
    try:
        check_id(job_id)
    except ValueError as e:
        raise OutboxEntryError(f"outbox member {member[:200]!r}: {e}") from None
    if match is None:
        raise OutboxEntryError(f"outbox member {member[:200]!r} is not JOB/EVENT/SHA256")
    return job_id, match.group(1), match.group(2)


class WebhookOutbox:
    """The outbox of one fleet (its key prefix). Raises redis errors as they come."""

    def __init__(self, client: redis.Redis, keys: FleetKeys, retention_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.retention_s = retention_s
        self._claim = client.register_script(CLAIM_WEBHOOK)

    def add(self, entry: OutboxEntry, due_at: float) -> None:
        """Keep ``entry`` (with the retention as its TTL) and make it due at ``due_at``."""
        key = self.keys.job_webhooks(entry.job_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hset(key, entry.field, entry.to_json())
        pipe.expire(key, self.retention_s)
        pipe.zadd(self.keys.webhook_outbox, {entry.member: due_at})
        pipe.execute()

    def due(self, now: float, limit: int = SWEEP_BATCH) -> list[str]:
        """Members due at ``now``, the longest due first."""
        return text_list(self.redis.zrangebyscore(self.keys.webhook_outbox, "-inf", now, start=0, num=limit))

    def read(self, member: str) -> OutboxEntry | None:
        """The entry of ``member``; None when it is gone (delivered meanwhile, or expired).

        Raises:
            OutboxEntryError: a member or an entry no worker wrote.
        """
        job_id, _event, _sha = parse_member(member)
        raw = text_or_none(self.redis.hget(self.keys.job_webhooks(job_id), member.partition("/")[2]))
        return None if raw is None else OutboxEntry.from_json(member, raw)

    def postpone(self, member: str, at: float) -> None:
        """Look at ``member`` again at ``at`` (only while it is in the outbox)."""
        self.redis.zadd(self.keys.webhook_outbox, {member: at}, xx=True)

    def claim(
        self, member: str, now: float, *, backoff_s: float, max_backoff_s: float, timeout_s: float
    ) -> int:
        """Claim one try of a due ``member``: its number (1, 2, ...), or 0 when it is not due or another
        worker claimed it first. The lease: ``min(max_backoff_s, backoff_s * 2**(try-1)) + timeout_s``."""
        job_id, _event, _sha = parse_member(member)
        keys = [self.keys.webhook_outbox, self.keys.job_webhooks(job_id)]
        field = member.partition("/")[2]
        args: list[str | float] = [member, repr(now), f"{field}:tries", backoff_s, max_backoff_s, timeout_s]
        return int(self._claim(keys=keys, args=args))

    def remove(
        self, member: str, record_key: str | None = None, fields: dict[FieldT, EncodableT] | None = None
    ) -> None:
        """Take ``member`` out of the outbox; with ``record_key``, write ``fields`` there in the same
        MULTI (a delivery's outcome: recorded delivered exactly when the entry is gone)."""
        job_id, _event, _sha = parse_member(member)
        field = member.partition("/")[2]
        pipe = self.redis.pipeline(transaction=True)
        if record_key is not None and fields:
            pipe.hset(record_key, mapping=fields)
        pipe.hdel(self.keys.job_webhooks(job_id), field, f"{field}:tries")
        pipe.zrem(self.keys.webhook_outbox, member)
        pipe.execute()

    def drop_member(self, member: str) -> None:
        """Take a member that names no readable entry out of the sorted set (nothing else is touched)."""
        self.redis.zrem(self.keys.webhook_outbox, member)
