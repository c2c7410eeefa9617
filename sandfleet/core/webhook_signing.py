"""How completion webhooks are signed, and how a receiver checks them. Pure; no I/O.

The same scheme as the approval webhook (sandfleet/worker/approval/webhook.py), so one receiver checks both. A
POST carries the JSON body and these headers:

``X-Sandfleet-Signature``  ``sha256=HEX``: HMAC-SHA256 with the worker's ``SANDFLEET_WEBHOOK_SECRET``
                           over ``f"{TIMESTAMP}.".encode() + body``.
``X-Sandfleet-Timestamp``  TIMESTAMP, whole epoch seconds (a receiver refuses old ones: no replays).
``X-Sandfleet-Event``      ``job.ended`` or ``batch.ended``.
``X-Sandfleet-Delivery``   the job id (or ``batch:ID``): the same on every retry, so a receiver can
                           drop duplicates.

A receiver calls :func:`verify_signature` with the raw body bytes, before parsing them.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Sandfleet-Signature"
TIMESTAMP_HEADER = "X-Sandfleet-Timestamp"
EVENT_HEADER = "X-Sandfleet-Event"
DELIVERY_HEADER = "X-Sandfleet-Delivery"
DEFAULT_TOLERANCE_S = 300.0


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
