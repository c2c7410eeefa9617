"""The steps of completion webhooks (see the package docstring): commit (and keep in the outbox) before
the seal, send after, and sweep the outbox for what no live worker is sending."""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.typing import EncodableT, FieldT

from sandfleet.core.batch_creator import CREATOR_FIELD, RECORD_FIELD, is_own_job
from sandfleet.core.contracts import AuditKind, JobResult, JobStatus
from sandfleet.core.records import JobRecord
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.replies import text, text_map, text_or_none
from sandfleet.core.settings import Settings
from sandfleet.core.signing import KeyRing
from sandfleet.core.webhook_outbox import OUTBOX_GRACE_S, OutboxEntry, WebhookOutbox
from sandfleet.core.webhook_signing import sign
from sandfleet.core.webhook_url import webhook_host_allowed
from sandfleet.worker.webhooks.payloads import BATCH_EVENT, JOB_EVENT, batch_body, encode, job_body
from sandfleet.worker.webhooks.sender import Delivery, Outcome, WebhookSender
from sandfleet.worker.webhooks.sweep import OutboxReport, OutboxSweep

log = logging.getLogger("sandfleet.worker.webhooks")

NO_SECRET = "not sent: the worker has no SANDFLEET_WEBHOOK_SECRET"
NOT_ALLOWED = "not sent: its host is not in SANDFLEET_POLICY_WEBHOOK_HOSTS"


class Webhooks:
    """Commits and sends one worker's completion webhooks. ``on_sent(delivered)`` feeds the metrics.

    Args:
        worker: the worker's name, kept in each outbox entry (the sweep asks whether it still beats).
        ring: the key set the outbox's sweep verifies chains with (None: this process sweeps nothing).
    """

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        *,
        worker: str = "",
        ring: Callable[[], KeyRing] | None = None,
        sender: WebhookSender | None = None,
        on_sent: Any = None,
    ) -> None:
        self.settings = settings
        self.worker = worker
        self._redis = client
        self._keys = FleetKeys(settings.key_prefix)
        self._sender = sender or WebhookSender(settings)
        self._on_sent = on_sent
        self._lock = threading.Lock()
        self.outbox = WebhookOutbox(client, self._keys, settings.retention_s)
        self._sweep = OutboxSweep(settings, client, self.outbox, ring, self) if ring is not None else None
        # job id -> (its batch id, the POSTs committed in its chain and not sent yet, with their outbox members)
        self._pending: dict[str, tuple[str | None, list[tuple[Delivery, str]]]] = {}

    # -- step 1: before the seal ------------------------------------------------------------------

    def before_seal(self, record: JobRecord, result: JobResult, audit: Any) -> None:
        """Build and commit (audit event) the POSTs this job's end will send. Never raises."""
        spec = record.spec
        if spec is None or not (spec.webhook or spec.batch_webhook):
            return
        try:
            committed: list[tuple[Delivery, str] | None] = []
            now = time.time()
            job_id = result.job_id
            if spec.webhook:
                body = encode(job_body(result, record.batch_id, now))
                committed.append(self._commit(audit, job_id, spec.webhook, JOB_EVENT, job_id, body, now))
            if spec.batch_webhook and record.batch_id and self._ends_own_batch(record, result.status):
                counts = self._counts_after(record.batch_id, result.status)
                body = encode(batch_body(record.batch_id, counts, now))
                delivery_id = f"batch:{record.batch_id}"
                committed.append(
                    self._commit(audit, job_id, spec.batch_webhook, BATCH_EVENT, delivery_id, body, now)
                )
            deliveries = [d for d in committed if d is not None]
            if deliveries:
                with self._lock:
                    self._pending[result.job_id] = (record.batch_id, deliveries)
        except Exception:
            log.exception("job %s: preparing its webhook failed", result.job_id)

    def _commit(
        self, audit: Any, job_id: str, url: str, event: str, delivery_id: str, body: bytes, now: float
    ) -> tuple[Delivery, str] | None:
        """Commit one POST in the job's chain and keep it in the outbox; the delivery and its member."""
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
        entry = OutboxEntry(job_id, url, event, delivery_id, body, timestamp, self.worker, now)
        self.outbox.add(entry, due_at=now + OUTBOX_GRACE_S)  # before the seal: a kill after it loses nothing
        return Delivery(url, event, delivery_id, body, sign(secret, timestamp, body), timestamp), entry.member

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
        for delivery, member in deliveries:
            if delivery.event == BATCH_EVENT and not self._claim_batch(delivery.url, job_id, str(batch_id)):
                self.outbox.remove(member)  # another job of the batch claimed its webhook
                continue
            self._sender.send(delivery, functools.partial(self._record, delivery, job_id, member, None))

    def discard(self, job_id: str) -> None:
        """Forget what this process committed for a job whose final record another delivery wrote, and
        its outbox entries (the sweep would refuse them: the sealing worker did not commit them)."""
        with self._lock:
            _batch_id, deliveries = self._pending.pop(job_id, (None, []))
        for _delivery, member in deliveries:
            self.outbox.remove(member)

    def _claim_batch(self, url: str, job_id: str, batch_id: str) -> bool:
        key = self._keys.batch_webhook(batch_id)
        claimed = self._redis.hsetnx(key, "url", url)
        if claimed:
            self._redis.hset(key, mapping={"job_id": job_id, "status": "sending"})
            self._redis.expire(key, self.settings.retention_s)
        return bool(claimed)

    def _record(
        self, delivery: Delivery, job_id: str, member: str, outbox_try: int | None, outcome: Outcome
    ) -> None:
        """Write a send's outcome (the record's ``webhook_*`` fields, or the batch's webhook hash); a
        delivered POST leaves the outbox in the same MULTI."""
        fields: dict[FieldT, EncodableT] = {
            "status": "delivered" if outcome.delivered else "failed",
            "http_status": outcome.status if outcome.status is not None else "",
            "error": outcome.error or "",
        }
        if outbox_try is None:
            fields["tries"] = outcome.tries  # the committing worker's tries
        else:
            fields["outbox_tries"] = outbox_try  # the outbox's, by any worker
        key, fields = self._outcome_fields(delivery.event, job_id, delivery.delivery_id, fields)
        if outcome.delivered:
            self.outbox.remove(member, key, fields)
        else:
            self._redis.hset(key, mapping=fields)
        if self._on_sent is not None and (outcome.delivered or outbox_try is None):
            self._on_sent(outcome.delivered)  # the outbox's failed tries count once, when it gives up

    def _outcome_fields(
        self, event: str, job_id: str, delivery_id: str, fields: dict[FieldT, EncodableT]
    ) -> tuple[str, dict[FieldT, EncodableT]]:
        """Where a webhook's outcome goes: the batch's webhook hash, or the job's record (``webhook_*``)."""
        if event == BATCH_EVENT:
            return self._keys.batch_webhook(delivery_id.removeprefix("batch:")), fields
        return self._keys.job(job_id), {f"webhook_{k!s}": v for k, v in fields.items()}

    # -- the outbox: what no live worker is sending (sandfleet/worker/webhooks/sweep.py) -----------

    def sweep(self, now: float | None = None) -> OutboxReport | None:
        """One sweep of the fleet's outbox as of ``now`` (epoch s; default: now); None when this
        process has no key set to check chains with."""
        return self._sweep.run(now) if self._sweep is not None else None

    def delivered_already(self, entry: OutboxEntry) -> bool:
        """Whether the entry's POST was delivered, or is another job's to send (a batch's webhook
        claimed by another of its jobs); an unclaimed batch webhook is claimed for the entry's job."""
        if entry.event != BATCH_EVENT:
            return (
                text_or_none(self._redis.hget(self._keys.job(entry.job_id), "webhook_status")) == "delivered"
            )
        batch_id = entry.delivery_id.removeprefix("batch:")
        claim = text_map(self._redis.hgetall(self._keys.batch_webhook(batch_id)))
        if not claim:
            return not self._claim_batch(entry.url, entry.job_id, batch_id)
        return claim.get("status") == "delivered" or claim.get("job_id", entry.job_id) != entry.job_id

    def send_from_outbox(self, entry: OutboxEntry, tries: int) -> None:
        """One try of a committed entry: its body and timestamp, so the signature of the first try."""
        signature = sign(str(self.settings.webhook_secret), entry.timestamp, entry.body)
        delivery = Delivery(entry.url, entry.event, entry.delivery_id, entry.body, signature, entry.timestamp)
        done = functools.partial(self._record, delivery, entry.job_id, entry.member, tries)
        self._sender.send(delivery, done, retries=0)

    def give_up(self, entry: OutboxEntry, tries: int) -> None:
        """Record that the outbox stopped trying (past ``webhook_outbox_max_age_s``) and drop the entry."""
        error = (
            f"the outbox gave up after {tries - 1} tries: committed more than "
            f"{self.settings.webhook_outbox_max_age_s:g} s ago (SANDFLEET_WEBHOOK_OUTBOX_MAX_AGE_S)"
        )
        fields: dict[FieldT, EncodableT] = {"status": "failed", "outbox_tries": tries - 1, "error": error}
        key, fields = self._outcome_fields(entry.event, entry.job_id, entry.delivery_id, fields)
        self.outbox.remove(entry.member, key, fields)
        log.warning("webhook %s of job %s: %s", entry.delivery_id, entry.job_id, error)
        if self._on_sent is not None:
            self._on_sent(False)

    def close(self) -> None:
        self._sender.close()
