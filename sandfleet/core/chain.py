"""The audit hash chain: how an audit stream is made tamper-evident, as pure functions.

Each entry carries ``hash = HMAC-SHA256(audit_secret, previous hash + canonical JSON of the event)``,
starting from the empty string, and the job's record keeps the tip (``audit_head``, ``audit_count``),
so an edited, reordered, inserted or removed entry breaks the chain at its index.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from sandfleet.core.contracts import AuditEvent

GENESIS_HASH = ""


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, UTF-8 kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def encode_event(event: AuditEvent) -> str:
    """The canonical JSON of an audit event: what the stream stores and the chain hashes.

    Values JSON cannot hold (a set, a path, an exception) are written as their ``str``.
    """
    return canonical_json(event.model_dump(mode="json", fallback=str))


def chain_hash(secret: str, prev_hash: str, event_json: str) -> str:
    """Hex HMAC-SHA256, keyed with ``secret``, of the previous hash followed by the event's JSON."""
    return hmac.new(secret.encode(), (prev_hash + event_json).encode(), hashlib.sha256).hexdigest()


def verify_entries(secret: str, entries: list[tuple[str, str]], head: str | None) -> tuple[bool, int | None]:
    """``(True, None)`` if every ``(event_json, hash)`` chains and the last hash is ``head``.

    Otherwise ``(False, index)``: the first entry whose hash does not hold, or ``len(entries)`` when
    the stream is shorter than the record says (entries removed from the end).
    """
    prev = GENESIS_HASH
    for index, (event_json, stored) in enumerate(entries):
        if not hmac.compare_digest(chain_hash(secret, prev, event_json), stored):
            return False, index
        prev = stored
    if head is not None and not hmac.compare_digest(prev, head):
        return False, len(entries)
    return True, None
