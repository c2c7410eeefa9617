"""The write side of job records: the queued records, deliveries, state transitions and the one
final record. Every record is written here, by producers and workers alike.

Submitting writes the queued records of a batch in one MULTI/EXEC (all or nothing). Every later
change is one Lua script (:mod:`sandfleet.core.lua`), so the record, the status indexes, the batch
counts and the retention move together, and the final-record guard makes the first final write win:
a redelivered or duplicated job ends exactly once.
"""

from __future__ import annotations

import json
import logging
import time
from enum import StrEnum
from typing import Any

import redis
from redis.typing import EncodableT, FieldT

from sandfleet.core.chain import GENESIS_HASH, chain_hash, encode_event
from sandfleet.core.contracts import (
    AuditEvent,
    AuditKind,
    ErrorInfo,
    JobResult,
    JobSpec,
    JobStatus,
)
from sandfleet.core.keys import REJECTED_STREAM_MAXLEN, FleetKeys
from sandfleet.core.lua import COUNT_DELIVERY, TRANSITION
from sandfleet.core.records import JobRecord, RecordReader
from sandfleet.core.replies import text, text_map, text_or_none
from sandfleet.core.settings import Settings

log = logging.getLogger(__name__)


def queued_fields(job_id: str, spec: JobSpec, now: float) -> dict[FieldT, EncodableT]:
    """The record's fields when the producer enqueues the job."""
    fields: dict[FieldT, EncodableT] = {
        "job_id": job_id,
        "status": JobStatus.QUEUED.value,
        "spec": spec.model_dump_json(),
        "queued_at": repr(now),
        "updated_at": repr(now),
        "attempts": "0",
        "deliveries": "0",
    }
    if spec.batch_id:
        fields["batch_id"] = spec.batch_id
    return fields


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

    def record_queued(self, jobs: list[tuple[str, JobSpec]]) -> None:
        """Write the queued records of ``jobs`` and their first audit event in one transaction.

        Raises:
            redis.RedisError: nothing of the transaction was applied (MULTI/EXEC).
        """
        now, ttl = time.time(), self.settings.retention_s
        pipe = self.redis.pipeline(transaction=True)
        for job_id, spec in jobs:
            record = self.keys.job(job_id)
            event = AuditEvent(
                ts=now, job_id=job_id, kind=AuditKind.STATE, data={"status": JobStatus.QUEUED.value}
            )
            event_json = encode_event(event)
            head = chain_hash(self.settings.audit_secret, GENESIS_HASH, event_json)
            fields: dict[FieldT, EncodableT] = {
                **queued_fields(job_id, spec, now),
                "audit_head": head,
                "audit_count": 1,
            }
            pipe.hset(record, mapping=fields)
            pipe.xadd(self.keys.audit(job_id), {"event": event_json, "hash": head})
            pipe.zadd(self.keys.all_jobs, {job_id: now})
            pipe.zadd(self.keys.status_index(JobStatus.QUEUED), {job_id: now})
            for key in (record, self.keys.audit(job_id)):
                pipe.expire(key, ttl)
            if spec.batch_id:
                pipe.rpush(self.keys.batch_jobs(spec.batch_id), job_id)
                pipe.hincrby(self.keys.batch_counts(spec.batch_id), JobStatus.QUEUED.value, 1)
                pipe.hincrby(self.keys.batch_counts(spec.batch_id), "total", 1)
        for batch_id in {spec.batch_id for _, spec in jobs if spec.batch_id}:
            pipe.expire(self.keys.batch_jobs(batch_id), ttl)
            pipe.expire(self.keys.batch_counts(batch_id), ttl)
        pipe.zremrangebyscore(self.keys.all_jobs, "-inf", now - ttl)
        pipe.execute()

    def withdraw(self, jobs: list[tuple[str, JobSpec]]) -> None:
        """Undo :meth:`record_queued` for jobs whose message was never published (best effort:
        if Redis is gone, the records expire with the retention and a worker ignores them)."""
        pipe = self.redis.pipeline(transaction=True)
        for job_id, spec in jobs:
            pipe.delete(*self.keys.job_keys(job_id))
            pipe.zrem(self.keys.all_jobs, job_id)
            pipe.zrem(self.keys.status_index(JobStatus.QUEUED), job_id)
            if spec.batch_id:
                pipe.lrem(self.keys.batch_jobs(spec.batch_id), 1, job_id)
                pipe.hincrby(self.keys.batch_counts(spec.batch_id), JobStatus.QUEUED.value, -1)
                pipe.hincrby(self.keys.batch_counts(spec.batch_id), "total", -1)
        try:
            pipe.execute()
        except redis.RedisError as e:
            log.warning("could not withdraw %d unpublished job record(s): %s", len(jobs), e)

    def count_delivery(self, job_id: str, retry: int = 0) -> int:
        """Count one delivery of the job's message for Celery retry number ``retry``.

        Returns how many times this retry's message has been delivered: 2 and more mean earlier
        deliveries died with their worker (a retry publishes a new message and starts again at 1).
        """
        keys = [self.keys.deliveries(job_id), self.keys.job(job_id)]
        return int(self._count_delivery(keys=keys, args=[retry, self.settings.retention_s]))

    def record(self, job_id: str) -> JobRecord | None:
        """The job's record, or None if there is none."""
        fields = text_map(self.redis.hgetall(self.keys.job(job_id)))
        return JobRecord.from_hash(fields) if fields and "status" in fields else None

    def status(self, job_id: str) -> JobStatus | None:
        """The job's status alone (one HGET, no record to parse), or None if there is no record."""
        value = self.redis.hget(self.keys.job(job_id), "status")
        return None if value is None else JobStatus(text(value))

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
        fields: dict[FieldT, EncodableT] = {
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
        batch_id = text_or_none(self.redis.hget(self.keys.job(job_id), "batch_id")) or "-"
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
