"""The write side of job records: deliveries, state transitions and the one final record.

Every change is one Lua script (:mod:`worker.store.scripts`), so the record, the status indexes,
the batch counts and the retention move together, and the final-record guard makes the first
final write win: a redelivered or duplicated job ends exactly once.
"""

from __future__ import annotations

import json
import logging
import time
from enum import StrEnum
from typing import Any

import redis

from producer.contracts import ErrorInfo, JobResult, JobStatus
from producer.keys import REJECTED_STREAM_MAXLEN, FleetKeys
from producer.records import JobRecord, RecordReader
from producer.settings import Settings
from worker.store.scripts import COUNT_DELIVERY, TRANSITION

log = logging.getLogger(__name__)


class Transition(StrEnum):
    """What a state change did."""

    APPLIED = "ok"
    ALREADY_FINAL = "final"  # the job had already ended: nothing was written
    MISSING = "missing"  # no record (never submitted, withdrawn, expired): nothing was written


class JobStore:
    """Writes of one fleet's job records. Thread-safe; share one per worker process."""

    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.redis = client
        self.settings = settings
        self.keys = FleetKeys(settings.key_prefix)
        self.reader = RecordReader(client, self.keys, settings.audit_secret)
        self._transition = client.register_script(TRANSITION)
        self._count_delivery = client.register_script(COUNT_DELIVERY)

    @classmethod
    def from_settings(cls, settings: Settings) -> JobStore:
        return cls(redis.Redis.from_url(settings.redis_url, decode_responses=True), settings)

    def count_delivery(self, job_id: str, retry: int = 0) -> int:
        """Count one delivery of the job's message for Celery retry number ``retry``.

        Returns how many times this retry's message has been delivered: 2 and more mean earlier
        deliveries died with their worker (a retry publishes a new message and starts again at 1).
        """
        keys = [self.keys.deliveries(job_id), self.keys.job(job_id)]
        return int(self._count_delivery(keys=keys, args=[retry, self.settings.retention_s]))

    def record(self, job_id: str) -> JobRecord | None:
        """The job's record, or None if there is none."""
        fields = self.redis.hgetall(self.keys.job(job_id))
        return JobRecord.from_hash(fields) if fields and "status" in fields else None

    def status(self, job_id: str) -> JobStatus | None:
        """The job's status alone (one HGET, no record to parse), or None if there is no record."""
        value = self.redis.hget(self.keys.job(job_id), "status")
        return None if value is None else JobStatus(value)

    def mark_running(self, job_id: str, worker: str) -> Transition:
        """queued (or running, on a redelivery) -> running; counts one more attempt."""
        return self._apply(job_id, JobStatus.RUNNING, worker=worker)

    def mark_queued(self, job_id: str) -> Transition:
        """running -> queued: the job waits for a retry after a transient failure."""
        return self._apply(job_id, JobStatus.QUEUED)

    def finish(self, job_id: str, result: JobResult, *, worker: str = "", token: str = "") -> Transition:
        """Write the final record. Only the first call for a job writes; later ones get ALREADY_FINAL.

        Args:
            token: stored in the final-record guard, to tell which delivery wrote the record.
        """
        if not result.status.is_final:
            raise ValueError(f"a final record needs a final status, got {result.status}")
        if result.job_id != job_id:
            result = result.model_copy(update={"job_id": job_id})
        return self._apply(
            job_id, result.status, worker=worker, result_json=result.model_dump_json(), token=token or worker
        )

    def finish_with_error(
        self, job_id: str, status: JobStatus, kind: str, message: str, **kw: Any
    ) -> Transition:
        """Write a final record that carries only an error (refused, crash loop, retries exhausted)."""
        result = JobResult(job_id=job_id, status=status, error=ErrorInfo(kind=kind, message=message))
        return self.finish(job_id, result, **kw)

    def record_rejected(self, reason: str, **details: Any) -> None:
        """Note a discarded message in the fleet's capped ``rejected`` stream (never raises)."""
        fields = {
            "ts": repr(time.time()),
            "reason": reason,
            "details": json.dumps(details, default=str)[:4096],
        }
        try:
            self.redis.xadd(self.keys.rejected, fields, maxlen=REJECTED_STREAM_MAXLEN, approximate=True)
        except redis.RedisError:
            log.exception("could not record a rejected message (%s)", reason)

    def _apply(
        self, job_id: str, status: JobStatus, *, worker: str = "", result_json: str = "", token: str = ""
    ) -> Transition:
        batch_id = self.redis.hget(self.keys.job(job_id), "batch_id") or "-"
        keys = [
            self.keys.job(job_id),
            self.keys.final_guard(job_id),
            self.keys.done(job_id),
            self.keys.batch_counts(batch_id),
            self.keys.batch_jobs(batch_id),
            self.keys.audit(job_id),
            self.keys.deliveries(job_id),
            *self.keys.status_indexes(),
        ]
        args = [
            job_id,
            status.value,
            repr(time.time()),
            self.settings.retention_s,
            "1" if status.is_final else "0",
            token or "final",
            result_json,
            worker,
            *(s.value for s in JobStatus),
        ]
        outcome, previous = self._transition(keys=keys, args=args)
        if outcome == Transition.ALREADY_FINAL:
            log.info("job %s already ended (%s): %s not recorded", job_id, previous, status)
        elif outcome == Transition.MISSING:
            log.warning("job %s has no record: %s not recorded", job_id, status)
        return Transition(outcome)
