"""A job's audit stream, written as a signed hash chain (the scheme is in :mod:`sandfleet.core.chain`).

Two deliveries of one job may write at once; each append is a compare-and-set on the chain tip
(a Lua script), retried with the tip the other writer left, so the chain never forks. Once the job
has ended its chain is sealed: later appends are refused (and logged), so the seal stays last.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from sandfleet.core import json_limits
from sandfleet.core.chain import GENESIS_HASH, ChainEntry, encode_event, link_hash, signed_message
from sandfleet.core.contracts import AuditEvent, AuditKind
from sandfleet.core.errors import JsonLimitError
from sandfleet.core.lua import AUDIT_APPEND
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.replies import text_or_none
from sandfleet.core.settings import Settings
from sandfleet.core.signing import ChainSigner

log = logging.getLogger(__name__)

MAX_APPEND_TRIES = 50


def signed_entry(signer: ChainSigner, job_id: str, prev_hash: str, event_json: str) -> ChainEntry:
    """The entry for ``event_json`` linked to ``prev_hash``, signed by ``signer``."""
    link = link_hash(prev_hash, event_json)
    sig, key_id = signer.sign(signed_message(job_id, link))
    return ChainEntry(event_json, link, sig, key_id)


def key_info_json(signer: ChainSigner, entry: ChainEntry) -> str:
    """The KeyInfo JSON of the key that signed ``entry``, for the scripts to register if missing
    ("" in the rare case the key changed between signing and asking: a rotation registers it)."""
    info = signer.key_info()
    return info.model_dump_json() if info.key_id == entry.key else ""


def readable_event_json(event: AuditEvent) -> str:
    """The event's canonical JSON; when a reader could not read that back (past ``MAX_RECORD_BYTES``
    or ``MAX_RECORD_DEPTH``, or not serialisable), the event with its data replaced by why.

    The caps on values (``MAX_JSON_DEPTH``, the bridge's sizes) keep every event far from these; the
    check makes sure a chain that is written can always be read and verified.
    """
    try:
        event_json = encode_event(event)
        json_limits.check_record(event_json, f"the {event.kind} audit event")
        return event_json
    except (ValueError, RecursionError) as e:  # JsonLimitError; pydantic's depth limit of 255
        problem = str(e) if isinstance(e, JsonLimitError) else f"the event cannot be written as JSON ({e})"
    return encode_event(event.model_copy(update={"data": {"omitted": problem}}))


class RedisAuditSink:
    """The engine's ``AuditSink`` for one job: ``emit`` appends one signed, chained event to its stream.

    Raises redis errors as they come: a job whose record cannot be written is better retried
    than run unrecorded.
    """

    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        job_id: str,
        signer: ChainSigner,
        *,
        head: str | None = None,
    ) -> None:
        """``head``: the chain's tip as the caller just read it with the record (saves reading it
        before the first append). Only a guess: each append is a compare-and-set on the tip Redis
        holds, so a stale or planted one costs one retry, linked to the real tip."""
        self.job_id = job_id
        self._redis = client
        self._keys = FleetKeys(settings.key_prefix)
        self._signer = signer
        self._ttl_s = settings.retention_s
        self._append = client.register_script(AUDIT_APPEND)
        self._head: str | None = head

    @property
    def head(self) -> str | None:
        """The tip after this sink's last append (or its ``head`` guess; None before either)."""
        return self._head

    def emit(self, kind: AuditKind, data: dict[str, Any], attempt: int = 0) -> None:
        event = AuditEvent(ts=time.time(), job_id=self.job_id, attempt=attempt, kind=kind, data=data)
        event_json = readable_event_json(event)
        keys = [
            self._keys.job(self.job_id),
            self._keys.audit(self.job_id),
            self._keys.final_guard(self.job_id),
            self._keys.signing_keys,
        ]
        head = self._head
        if head is None:
            head = text_or_none(self._redis.hget(keys[0], "audit_head")) or GENESIS_HASH
        for _ in range(MAX_APPEND_TRIES):
            entry = signed_entry(self._signer, self.job_id, head, event_json)
            info = key_info_json(self._signer, entry)
            args: list[str | int] = [head, entry.event, entry.hash, entry.sig, entry.key, self._ttl_s, info]
            appended, tip = self._append(keys=keys, args=args)
            if appended == 1:
                self._head = entry.hash
                return
            if appended == -1:
                log.warning("job %s has no record: audit event %r dropped", self.job_id, kind)
                return
            if appended == -2:
                log.warning(
                    "job %s has ended (its chain is sealed): late audit event %r dropped", self.job_id, kind
                )
                return
            head = tip  # another writer appended first: chain onto its event
        raise RuntimeError(f"audit stream of job {self.job_id} kept moving; event {kind!r} not written")
