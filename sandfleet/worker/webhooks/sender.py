"""Sends committed webhook POSTs from background threads, retrying with exponential backoff.

One POST counts as delivered on any 2xx; anything else (refused connection, timeout, 3xx/4xx/5xx)
is tried again ``settings.webhook_retries`` times, waiting ``webhook_backoff_s`` then twice as long
each time (capped at ``MAX_BACKOFF_S``). The outcome goes to ``on_done``. The outbox's sweep sends
one try at a time (``retries=0``): its own schedule spaces them.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sandfleet.core.settings import Settings
from sandfleet.core.webhook_signing import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    idempotency_key,
)

log = logging.getLogger("sandfleet.worker.webhooks")

SENDERS = 4  # POSTs in flight at once per worker
MAX_BACKOFF_S = 60.0
USER_AGENT = "Sandfleet-Webhook/1"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is the receiver's answer, never followed: urllib would turn the POST into a GET to the
    Location, with the signature headers, to a host the operator's list never named."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def retry_schedule_s(settings: Settings) -> float:
    """The longest a sender spends on one webhook before it gives up (s): every try's timeout and
    every backoff between them. 91 s with the defaults (6 tries of 10 s, 1+2+4+8+16 s between)."""
    waits = sum(
        min(MAX_BACKOFF_S, settings.webhook_backoff_s * 2**k) for k in range(settings.webhook_retries)
    )
    return waits + (settings.webhook_retries + 1) * settings.webhook_timeout_s


def open_without_redirects(request: urllib.request.Request, timeout: float) -> Any:
    """``urlopen`` that answers a redirect with its HTTPError instead of following it."""
    return _OPENER.open(request, timeout=timeout)


@dataclass(frozen=True)
class Delivery:
    """One committed POST: where, which event, the delivery id, the exact body, its signature and time."""

    url: str
    event: str
    delivery_id: str
    body: bytes
    signature: str
    timestamp: int

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.event, self.delivery_id)


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    tries: int
    status: int | None = None
    error: str | None = None


class WebhookSender:
    """Background POSTs; :meth:`send` returns at once. ``sleep`` is injectable for the backoff."""

    def __init__(self, settings: Settings, *, sleep: Callable[[float], None] | None = None) -> None:
        self.settings = settings
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait
        self._pool = ThreadPoolExecutor(SENDERS, thread_name_prefix="sandfleet-webhook")

    def send(
        self, delivery: Delivery, on_done: Callable[[Outcome], None], retries: int | None = None
    ) -> None:
        """POST ``delivery`` in the background: ``retries`` more tries after a failure (default
        ``settings.webhook_retries``), then ``on_done(outcome)``."""
        self._pool.submit(self._run, delivery, on_done, retries)

    def close(self, wait_s: float = 5.0) -> None:
        """Stop retrying (a POST in flight may finish) and let the threads go."""
        self._stopping.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + wait_s
        for thread in list(getattr(self._pool, "_threads", ())):
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _run(self, delivery: Delivery, on_done: Callable[[Outcome], None], retries: int | None) -> None:
        outcome = self._deliver(delivery, retries)
        try:
            on_done(outcome)
        except Exception:
            log.exception("webhook %s: recording its outcome failed", delivery.delivery_id)

    def _deliver(self, delivery: Delivery, retries: int | None = None) -> Outcome:
        retries = self.settings.webhook_retries if retries is None else retries
        tries = 0
        status: int | None = None
        error = ""
        delay_s = self.settings.webhook_backoff_s
        while True:
            tries += 1
            status, error = self._post(delivery)
            if status is not None and 200 <= status < 300:
                return Outcome(True, tries, status)
            log.warning(
                "webhook %s to %s: try %d failed: %s", delivery.delivery_id, delivery.url, tries, error
            )
            if tries > retries or self._stopping.is_set():
                return Outcome(False, tries, status, error)
            self._sleep(delay_s)
            delay_s = min(MAX_BACKOFF_S, delay_s * 2)

    def _post(self, delivery: Delivery) -> tuple[int | None, str]:
        request = urllib.request.Request(
            delivery.url,
            data=delivery.body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": USER_AGENT,
                SIGNATURE_HEADER: delivery.signature,
                TIMESTAMP_HEADER: str(delivery.timestamp),
                EVENT_HEADER: delivery.event,
                DELIVERY_HEADER: delivery.delivery_id,
                IDEMPOTENCY_HEADER: delivery.idempotency_key,
            },
        )
        try:
            with open_without_redirects(request, self.settings.webhook_timeout_s) as response:
                return response.status, ""
        except urllib.error.HTTPError as e:
            return e.code, f"HTTP {e.code}"
        except (OSError, ValueError) as e:  # refused, unreachable, timed out, bad URL
            return None, f"{type(e).__name__}: {e}"
