"""How completion webhooks are signed, and how a receiver checks them. Pure; no I/O.

The same scheme as the approval webhook (sandfleet/worker/approval/webhook.py), so one receiver checks both. A
POST carries the JSON body and these headers:

``X-Sandfleet-Signature``  ``sha256=HEX``: HMAC-SHA256 with the worker's ``SANDFLEET_WEBHOOK_SECRET``
                           over ``f"{TIMESTAMP}.".encode() + body``.
``X-Sandfleet-Timestamp``  TIMESTAMP, whole epoch seconds (a receiver refuses old ones: no replays).
``X-Sandfleet-Event``      ``job.ended`` or ``batch.ended``.
``X-Sandfleet-Delivery``   the job id (or ``batch:ID``).
``Idempotency-Key``        ``{event}:{delivery}`` (``job.ended:JOB`` or ``batch.ended:batch:ID``): the
                           same on every try of one webhook, the first included, by whichever worker
                           sends it (the outbox: sandfleet/core/webhook_outbox.py), so a receiver
                           drops duplicates by it. Delivery is at least once.

Every try of one webhook carries the same body, timestamp and so signature: the timestamp is the one
committed in the job's chain. A receiver that refuses timestamps older than ``tolerance_s`` refuses a
late redelivery too (after a worker was killed, or while the receiver was down); one that wants them
widens ``tolerance_s`` up to ``SANDFLEET_WEBHOOK_OUTBOX_MAX_AGE_S`` and keeps the keys it has seen.

A receiver calls :func:`verify_signature` with the raw body bytes, before parsing them.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Sandfleet-Signature"
TIMESTAMP_HEADER = "X-Sandfleet-Timestamp"
EVENT_HEADER = "X-Sandfleet-Event"
DELIVERY_HEADER = "X-Sandfleet-Delivery"
IDEMPOTENCY_HEADER = "Idempotency-Key"
DEFAULT_TOLERANCE_S = 300.0


def idempotency_key(event: str, delivery_id: str) -> str:
    """The ``Idempotency-Key`` of one webhook: stable per job (or batch) and event."""
    return f"{event}:{delivery_id}"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=HEX``: the HMAC-SHA256 of ``f"{timestamp}." + body`` under ``secret``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify_signature(
    secret: str,
    signature: str,
    timestamp: str,
    body: bytes,
    *,
    now: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> int:
    """The timestamp, when ``signature`` (the header's value) signs ``timestamp`` and ``body`` under
    ``secret`` and the timestamp is within ``tolerance_s`` of ``now``.

    Raises:
        ValueError: a malformed header, a signature that does not match, or a timestamp too far off.
    """
    try:
        when = int(timestamp)
    except (TypeError, ValueError):
        raise ValueError(f"malformed {TIMESTAMP_HEADER} header: expected epoch seconds") from None
    if not signature.startswith("sha256="):
        raise ValueError(f"malformed {SIGNATURE_HEADER} header: expected sha256=HEX")
    if not hmac.compare_digest(signature, sign(secret, when, body)):
        raise ValueError("the webhook signature does not match the body")
    if abs(now - when) > tolerance_s:
        raise ValueError(f"the webhook timestamp is {abs(now - when):.0f} s away from now")
    return when
