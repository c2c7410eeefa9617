"""The optional webhook: one signed POST when a request starts waiting, so an outside system (a chat
bot, a ticket queue) can ask a person. Sent on a thread of its own; a failure is logged, never fatal
(the request waits in Redis whether or not anyone was told).

Signature: ``X-Sandfleet-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>`` with
``X-Sandfleet-Timestamp: <epoch seconds>``; a receiver recomputes it over the raw body and refuses
old timestamps (replays). :func:`signature` is the one definition of it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
import urllib.request
from typing import Any

log = logging.getLogger("sandfleet.approval")

WEBHOOK_TIMEOUT_S = 5.0
SIGNATURE_HEADER = "X-Sandfleet-Signature"
TIMESTAMP_HEADER = "X-Sandfleet-Timestamp"


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: the HMAC-SHA256 of ``timestamp.body`` under ``secret``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def post(url: str, secret: str | None, payload: dict[str, Any]) -> int:
    """POST ``payload`` as JSON, signed when there is a secret; the HTTP status (raises on failure)."""
    body = json.dumps(payload, sort_keys=True, default=str).encode()
    timestamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", TIMESTAMP_HEADER: timestamp}
    if secret:
        headers[SIGNATURE_HEADER] = signature(secret, timestamp, body)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=WEBHOOK_TIMEOUT_S) as reply:
        return int(reply.status)


def notify(url: str, secret: str | None, payload: dict[str, Any]) -> threading.Thread:
    """Send in the background; returns the thread (tests may join it)."""

    def send() -> None:
        try:
            post(url, secret, payload)
        except Exception as e:
            log.warning("approval webhook %s failed: %s", url, e)

    thread = threading.Thread(target=send, name="sandfleet-approval-webhook", daemon=True)
    thread.start()
    return thread
