"""The optional webhook: one signed POST when a request starts waiting, so an outside system (a chat
bot, a ticket queue) can ask a person. Sent on a thread of its own; a failure is logged, never fatal
(the request waits in Redis whether or not anyone was told).

Signature: ``X-Sandfleet-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>`` with
``X-Sandfleet-Timestamp: <epoch seconds>``; a receiver recomputes it over the raw body and refuses
old timestamps (replays). The scheme is the completion webhooks' (sandfleet/core/webhook_signing.py),
so one receiver checks both.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from typing import Any

from sandfleet.core.webhook_signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from sandfleet.worker.webhooks.sender import open_without_redirects

log = logging.getLogger("sandfleet.approval")

WEBHOOK_TIMEOUT_S = 5.0
__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "notify", "post", "signature"]


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: the HMAC-SHA256 of ``timestamp.body`` under ``secret`` (core's scheme)."""
    return sign(secret, int(timestamp), body)


def post(url: str, secret: str | None, payload: dict[str, Any]) -> int:
    """POST ``payload`` as JSON, signed when there is a secret; the HTTP status (raises on failure)."""
    body = json.dumps(payload, sort_keys=True, default=str).encode()
    timestamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", TIMESTAMP_HEADER: timestamp}
    if secret:
        headers[SIGNATURE_HEADER] = signature(secret, timestamp, body)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with open_without_redirects(request, WEBHOOK_TIMEOUT_S) as reply:
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
