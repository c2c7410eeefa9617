"""The webhook outbox's sweep: every live worker sends the committed webhooks nobody delivered.

Run after each recovery sweep (``WorkerState.after_sweep``, every ``SWEEP_INTERVAL_S`` = 5 s on every
worker). Each due member of ``{p}:webhooks:outbox`` (sandfleet/core/webhook_outbox.py), at most
``SWEEP_BATCH`` a sweep:

1. the committing worker still beats and the entry is inside its retry schedule
   (:func:`~sandfleet.worker.webhooks.sender.retry_schedule_s` plus ``OUTBOX_GRACE_S``): it is still
   sending; looked at again ``OUTBOX_RECHECK_S`` later;
2. otherwise it is claimed (:meth:`~sandfleet.core.webhook_outbox.WebhookOutbox.claim`: one try,
   leased for its backoff plus the POST's timeout; another worker's claim skips it);
3. the job's record and chain are read in one snapshot and verified with the worker's key set; a
   chain not sealed yet is looked at after the lease; an entry the chain does not commit
   (sandfleet/worker/webhooks/committed.py) is refused: removed, logged and noted in ``{p}:rejected``;
4. an entry already delivered (the record says so), past ``SANDFLEET_WEBHOOK_OUTBOX_MAX_AGE_S``, or
   whose host this worker's ``SANDFLEET_POLICY_WEBHOOK_HOSTS`` does not list is not sent; else one try
   is POSTed in the background, with the committed body, timestamp and so signature, and the same
   ``Idempotency-Key`` as every other try.

Killed after the seal, a worker's webhook is sent once its heartbeat lapses (``HEARTBEAT_TTL_S`` =
10 s) and the next sweep runs: about 10-15 s (benchmarks/webhook_outbox.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import redis

from sandfleet.core.records import RecordReader
from sandfleet.core.redis_keys import REJECTED_STREAM_MAXLEN, FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.core.signing import KeyRing
from sandfleet.core.verify import VerdictState, verify_job
from sandfleet.core.webhook_outbox import (
    OUTBOX_GRACE_S,
    SWEEP_BATCH,
    OutboxEntry,
    OutboxEntryError,
    WebhookOutbox,
)
from sandfleet.core.webhook_url import check_webhook_url, webhook_host_allowed
from sandfleet.worker.webhooks.committed import committed_problem
from sandfleet.worker.webhooks.sender import MAX_BACKOFF_S, retry_schedule_s

log = logging.getLogger("sandfleet.worker.webhooks")

OUTBOX_RECHECK_S = 1.0  # a live sender's entry is looked at again this soon (the next sweep does)


class OutboxSender(Protocol):
    """What the sweep asks of the worker's ``Webhooks``: whether an entry's POST was delivered, send one
    try of it, and record that the outbox gave up on it."""

    def delivered_already(self, entry: OutboxEntry) -> bool: ...

    def send_from_outbox(self, entry: OutboxEntry, tries: int) -> None: ...

    def give_up(self, entry: OutboxEntry, tries: int) -> None: ...


@dataclass
class OutboxReport:
    """What one sweep did with each member it looked at."""

    sent: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # its worker is still sending, or not sealed yet
    refused: list[tuple[str, str]] = field(default_factory=list)  # (member, why)
    dropped: list[str] = field(default_factory=list)  # gone, delivered already, given up, not allowed here


class OutboxSweep:
    """One worker's sweep of the fleet's webhook outbox. ``ring()`` is called per check."""

    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        outbox: WebhookOutbox,
        ring: Callable[[], KeyRing],
        sender: OutboxSender,
    ) -> None:
        self.settings = settings
        self._redis = client
        self._keys = FleetKeys(settings.key_prefix)
        self._outbox = outbox
        self._reader = RecordReader(client, self._keys)
        self._ring = ring
        self._sender = sender

    def run(self, now: float | None = None) -> OutboxReport:
        """Look at every due member once (at most ``SWEEP_BATCH``)."""
        report = OutboxReport()
        now = time.time() if now is None else now
        for member in self._outbox.due(now, SWEEP_BATCH):
            try:
                self._consider(member, now, report)
            except OutboxEntryError as e:
                self._refuse(member, str(e), report)
            except redis.RedisError:
                raise
            except Exception as e:  # a chain or spec that does not parse: never sent
                self._refuse(member, f"it cannot be checked ({type(e).__name__}: {e})", report)
        return report

    def _consider(self, member: str, now: float, report: OutboxReport) -> None:
        entry = self._outbox.read(member)
        if entry is None:  # delivered meanwhile, or expired with its job
            self._outbox.drop_member(member)
            report.dropped.append(member)
            return
        if self._still_sending(entry, now):
            self._outbox.postpone(member, now + OUTBOX_RECHECK_S)
            report.waiting.append(member)
            return
        tries = self._outbox.claim(
            member,
            now,
            backoff_s=self.settings.webhook_backoff_s,
            max_backoff_s=MAX_BACKOFF_S,
            timeout_s=self.settings.webhook_timeout_s,
        )
        if tries == 0:  # another worker claimed it first
            return
        evidence = self._reader.evidence(entry.job_id)
        verdict = verify_job(evidence, self._ring())
        if verdict.state == VerdictState.UNFINISHED:  # committed, not sealed yet: after the lease
            report.waiting.append(member)
            return
        problem = committed_problem(entry, evidence, verdict)
        if problem is not None:
            self._refuse(member, problem, report)
            return
        self._deliver(entry, tries, now, report)

    def _deliver(self, entry: OutboxEntry, tries: int, now: float, report: OutboxReport) -> None:
        """Send one try of a committed entry, unless it was delivered, is too old or not allowed here."""
        if self._sender.delivered_already(entry):
            self._outbox.remove(entry.member)
            report.dropped.append(entry.member)
            return
        if now - entry.committed_at > self.settings.webhook_outbox_max_age_s:
            self._sender.give_up(entry, tries)
            report.dropped.append(entry.member)
            return
        if not self._allowed(entry.url):  # left for a worker whose policy lists the host
            log.warning(
                "webhook %s of job %s: not sent from this worker (no SANDFLEET_WEBHOOK_SECRET, or its "
                "host is not in SANDFLEET_POLICY_WEBHOOK_HOSTS)",
                entry.delivery_id,
                entry.job_id,
            )
            report.waiting.append(entry.member)
            return
        log.warning(
            "webhook %s of job %s (committed by %s %.0f s ago): sending from the outbox, try %d",
            entry.delivery_id, entry.job_id, entry.worker, now - entry.committed_at, tries,
        )  # fmt: skip
        try:
            self._sender.send_from_outbox(entry, tries)
        except RuntimeError as e:  # the sender is closing (the worker stops): another worker, later
            log.warning("webhook %s of job %s: not sent now: %s", entry.delivery_id, entry.job_id, e)
            report.waiting.append(entry.member)
            return
        report.sent.append(entry.member)

    def _allowed(self, url: str) -> bool:
        """Whether this worker signs webhooks and its policy lists the URL's host (as for a first try)."""
        try:
            check_webhook_url(url)
        except ValueError:
            return False
        return bool(self.settings.webhook_secret) and webhook_host_allowed(
            url, self.settings.policy_webhook_hosts
        )

    def _still_sending(self, entry: OutboxEntry, now: float) -> bool:
        """Whether the committing worker beats and may still be inside its own retries."""
        schedule_end = entry.committed_at + retry_schedule_s(self.settings) + OUTBOX_GRACE_S
        return now < schedule_end and bool(self._redis.exists(self._keys.heartbeat(entry.worker)))

    def _refuse(self, member: str, why: str, report: OutboxReport) -> None:
        """Remove an entry the chain does not commit, say why in the log and in ``{p}:rejected``."""
        log.warning("webhook outbox entry %s refused, not sent: %s", member[:300], why)
        try:
            self._outbox.remove(member)
        except OutboxEntryError:  # a member that names no job: only the member itself is there
            self._outbox.drop_member(member)
        report.refused.append((member, why))
        details = json.dumps({"member": member[:300], "why": why})[:4096]
        self._redis.xadd(
            self._keys.rejected,
            {"ts": repr(time.time()), "reason": "webhook outbox entry refused", "details": details},
            maxlen=REJECTED_STREAM_MAXLEN,
            approximate=True,
        )
