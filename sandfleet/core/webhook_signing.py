"""How completion webhooks are signed, and how a receiver checks them. Pure; no I/O.

A POST carries the JSON body and these headers:

``X-Sandfleet-Signature``  ``t=TIMESTAMP,v1=HEX``: HMAC-SHA256 with the worker's
                           ``SANDFLEET_WEBHOOK_SECRET`` over ``f"{TIMESTAMP}.".encode() + body``,
                           TIMESTAMP in whole epoch seconds (so a captured POST cannot be replayed
                           later than the receiver's tolerance).
``X-Sandfleet-Event``      ``job.ended`` or ``batch.ended``.
``X-Sandfleet-Delivery``   the job id (or ``batch:ID``): the same on every retry, so a receiver can
                           drop duplicates.

A receiver calls :func:`verify_signature` with the raw body bytes, before parsing them.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Sandfleet-Signature"
EVENT_HEADER = "X-Sandfleet-Event"
DELIVERY_HEADER = "X-Sandfleet-Delivery"
DEFAULT_TOLERANCE_S = 300.0


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``f"{timestamp}." + body`` under ``secret``."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def signature_header(secret: str, timestamp: int, body: bytes) -> str:
    """The ``X-Sandfleet-Signature`` value: ``t=TIMESTAMP,v1=HEX``."""
    return f"t={timestamp},v1={sign(secret, timestamp, body)}"


def verify_signature(
    secret: str, header: str, body: bytes, *, now: float, tolerance_s: float = DEFAULT_TOLERANCE_S
) -> int:
    """The header's timestamp when it signs ``body`` under ``secret`` within ``tolerance_s`` of ``now``.

    Raises:
        ValueError: the header is malformed, the signature does not match, or it is too old or new.
    """
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    try:
        timestamp = int(fields["t"])
        given = fields["v1"]
    except (KeyError, ValueError):
        raise ValueError(f"malformed {SIGNATURE_HEADER} header: expected t=TIMESTAMP,v1=HEX") from None
    if not hmac.compare_digest(given, sign(secret, timestamp, body)):
        raise ValueError("the webhook signature does not match the body")
    if abs(now - timestamp) > tolerance_s:
        raise ValueError(f"the webhook timestamp is {abs(now - timestamp):.0f} s away from now")
    return timestamp
