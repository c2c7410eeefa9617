"""The two steps of completion webhooks (see the package docstring): commit before the seal, send after."""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from typing import Any

import redis
from redis.typing import EncodableT, FieldT

from sandfleet.core.batch_creator import CREATOR_FIELD, RECORD_FIELD, is_own_job
from sandfleet.core.contracts import AuditKind, JobResult, JobStatus
from sandfleet.core.records import JobRecord
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.replies import text, text_map
from sandfleet.core.settings import Settings
from sandfleet.core.webhook_signing import sign
from sandfleet.core.webhook_url import webhook_host_allowed
from sandfleet.worker.webhooks.payloads import BATCH_EVENT, JOB_EVENT, batch_body, encode, job_body
from sandfleet.worker.webhooks.sender import Delivery, Outcome, WebhookSender

log = logging.getLogger("sandfleet.worker.webhooks")

NO_SECRET = "not sent: the worker has no SANDFLEET_WEBHOOK_SECRET"
NOT_ALLOWED = "not sent: its host is not in SANDFLEET_POLICY_WEBHOOK_HOSTS"


class Webhooks:
    """Commits and sends one worker's completion webhooks. ``on_sent(delivered)`` feeds the metrics."""

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        *,
        sender: WebhookSender | None = None,
        on_sent: Any = None,
    ) -> None:
        self.settings = settings
        self._redis = client
        self._keys = FleetKeys(settings.key_prefix)
        self._sender = sender or WebhookSender(settings)
        self._on_sent = on_sent
        self._lock = threading.Lock()
        # job id -> (its batch id, the POSTs committed in its chain and not sent yet)
        self._pending: dict[str, tuple[str | None, list[Delivery]]] = {}

    # -- step 1: before the seal ------------------------------------------------------------------

    def before_seal(self, record: JobRecord, result: JobResult, audit: Any) -> None:
        """Build and commit (audit event) the POSTs this job's end will send. Never raises."""
        spec = record.spec
        if spec is None or not (spec.webhook or spec.batch_webhook):
            return
        try:
            committed: list[Delivery | None] = []
            now = time.time()
            if spec.webhook:
                body = encode(job_body(result, record.batch_id, now))
                committed.append(self._commit(audit, spec.webhook, JOB_EVENT, result.job_id, body, now))
            if spec.batch_webhook and record.batch_id and self._ends_own_batch(record, result.status):
                counts = self._counts_after(record.batch_id, result.status)
                body = encode(batch_body(record.batch_id, counts, now))
                delivery_id = f"batch:{record.batch_id}"
                committed.append(self._commit(audit, spec.batch_webhook, BATCH_EVENT, delivery_id, body, now))
            deliveries = [d for d in committed if d is not None]
            if deliveries:
                with self._lock:
                    self._pending[result.job_id] = (record.batch_id, deliveries)
        except Exception:
            log.exception("job %s: preparing its webhook failed", result.job_id)

    def _commit(
        self, audit: Any, url: str, event: str, delivery_id: str, body: bytes, now: float
    ) -> Delivery | None:
        secret = self.settings.webhook_secret
        data = {
            "url": url,
            "event": event,
            "delivery": delivery_id,
            "body_sha256": hashlib.sha256(body).hexdigest(),
        }
        reason = None
        if not secret:
            reason = NO_SECRET
        elif not webhook_host_allowed(url, self.settings.policy_webhook_hosts):
            reason = NOT_ALLOWED
        if reason is not None or not secret:
            audit.emit(AuditKind.WEBHOOK, {**data, "sent": False, "reason": reason})
            log.warning("webhook for %s to %s %s", delivery_id, url, reason)
            return None
        timestamp = int(now)
        audit.emit(AuditKind.WEBHOOK, {**data, "sent": True, "timestamp": timestamp})
        return Delivery(url, event, delivery_id, body, sign(secret, timestamp, body), timestamp)

    def _ends_own_batch(self, record: JobRecord, status: JobStatus) -> bool:
        """Whether the job is one of its batch's own (its record names the batch's creator:
        core/batch_creator.py) and every other job of the batch has ended, so this job's end ends the
        batch. A job that is not the batch's own never sends, nor claims, the batch's webhook."""
        batch_id = str(record.batch_id)
        creator = self._redis.hget(self._keys.batch_counts(batch_id), CREATOR_FIELD)
        fields = {"batch_id": batch_id, RECORD_FIELD: record.batch_creator or ""}
        if creator is None or not is_own_job(batch_id, text(creator), fields):
            log.warning("job %s is not one of batch %s's own jobs: no batch webhook", record.job_id, batch_id)
            return False
        counts = self._counts(batch_id)
        ended = sum(n for s, n in counts.items() if s != "total" and JobStatus(s).is_final)
        return status.is_final and counts.get("total", 0) > 0 and ended == counts["total"] - 1

    def _counts(self, batch_id: str) -> dict[str, int]:
        raw = text_map(self._redis.hgetall(self._keys.batch_counts(batch_id)))
        names = {"total", *(s.value for s in JobStatus)}  # not the hash's ``creator`` field
        return {k: int(v) for k, v in raw.items() if k in names}

    def _counts_after(self, batch_id: str, status: JobStatus) -> dict[str, int]:
        """The batch's counts of final statuses once this job's record is written."""
        counts = self._counts(batch_id)
        final = {s: n for s, n in counts.items() if s != "total" and JobStatus(s).is_final and n}
        final[status.value] = final.get(status.value, 0) + 1
        return {"total": counts.get("total", 0), **dict(sorted(final.items()))}

    # -- step 2: after the final record -----------------------------------------------------------

    def job_ended(self, job_id: str) -> None:
        """Send what :meth:`before_seal` committed for this job (its final record is written)."""
        with self._lock:
            batch_id, deliveries = self._pending.pop(job_id, (None, []))
        for delivery in deliveries:
            if delivery.event == BATCH_EVENT and not self._claim_batch(delivery, job_id, str(batch_id)):
                continue
            self._sender.send(delivery, functools.partial(self._record, delivery, job_id, batch_id))

    def _claim_batch(self, delivery: Delivery, job_id: str, batch_id: str) -> bool:
        key = self._keys.batch_webhook(batch_id)
        claimed = self._redis.hsetnx(key, "url", delivery.url)
        if claimed:
            self._redis.hset(key, mapping={"job_id": job_id, "status": "sending"})
            self._redis.expire(key, self.settings.retention_s)
        return bool(claimed)

    def _record(self, delivery: Delivery, job_id: str, batch_id: str | None, outcome: Outcome) -> None:
        fields: dict[FieldT, EncodableT] = {
            "status": "delivered" if outcome.delivered else "failed",
            "tries": outcome.tries,
            "http_status": outcome.status if outcome.status is not None else "",
            "error": outcome.error or "",
        }
        if delivery.event == BATCH_EVENT:
            self._redis.hset(self._keys.batch_webhook(str(batch_id)), mapping=fields)
        else:
            self._redis.hset(self._keys.job(job_id), mapping={f"webhook_{k!s}": v for k, v in fields.items()})
        if self._on_sent is not None:
            self._on_sent(outcome.delivered)

    def close(self) -> None:
        self._sender.close()
