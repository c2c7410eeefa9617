"""A job's audit stream, written as a hash chain (see :mod:`sandfleet.core.records` for the scheme).

Two deliveries of one job may write at once; each append is a compare-and-set on the chain tip
(a Lua script), retried with the tip the other writer left, so the chain never forks.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from sandfleet.core.chain import GENESIS_HASH, chain_hash, encode_event
from sandfleet.core.contracts import AuditEvent, AuditKind
from sandfleet.core.keys import FleetKeys
from sandfleet.core.lua import AUDIT_APPEND
from sandfleet.core.records import RecordReader
from sandfleet.core.replies import text_or_none
from sandfleet.core.settings import Settings

log = logging.getLogger(__name__)

MAX_APPEND_TRIES = 50


class RedisAuditSink:
    """The engine's ``AuditSink`` for one job: ``emit`` appends one chained event to its stream.

    Raises redis errors as they come: a job whose record cannot be written is better retried
    than run unrecorded.
    """

    def __init__(self, client: redis.Redis, settings: Settings, job_id: str) -> None:
        self.job_id = job_id
        self._redis = client
        self._keys = FleetKeys(settings.key_prefix)
        self._secret = settings.audit_secret
        self._ttl_s = settings.retention_s
        self._append = client.register_script(AUDIT_APPEND)
        self._head: str | None = None

    def emit(self, kind: AuditKind, data: dict[str, Any], attempt: int = 0) -> None:
        event = AuditEvent(ts=time.time(), job_id=self.job_id, attempt=attempt, kind=kind, data=data)
        event_json = encode_event(event)
        keys = [self._keys.job(self.job_id), self._keys.audit(self.job_id)]
        head = self._head
        if head is None:
            head = text_or_none(self._redis.hget(keys[0], "audit_head")) or GENESIS_HASH
        for _ in range(MAX_APPEND_TRIES):
            digest = chain_hash(self._secret, head, event_json)
            appended, tip = self._append(keys=keys, args=[head, event_json, digest, self._ttl_s])
            if appended == 1:
                self._head = digest
                return
            if appended == -1:
                log.warning("job %s has no record: audit event %r dropped", self.job_id, kind)
                return
            head = tip  # another writer appended first: chain onto its event
        raise RuntimeError(f"audit stream of job {self.job_id} kept moving; event {kind!r} not written")


def verify_chain(client: redis.Redis, settings: Settings, job_id: str) -> tuple[bool, int | None]:
    """Whether the job's audit chain holds: ``(True, None)`` or ``(False, first_bad_index)``."""
    return RecordReader(client, FleetKeys(settings.key_prefix), settings.audit_secret).verify_chain(job_id)
