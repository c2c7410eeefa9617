"""The write side of job records: the queued records, deliveries, state transitions and the one
final record. Every record is written here, by producers and workers alike.

Submitting writes the queued records of a batch in one Lua script (all or nothing), each with its
audit chain's entry 0, unless a batch they name was created by another submitter (then nothing:
sandfleet/core/batch_creator.py). Every later change is one Lua script too (:mod:`sandfleet.core.lua`),
so the record, the status indexes, the batch counts and the retention move together, and the final-record
guard makes the first final write win: a redelivered or duplicated job ends exactly once. The final
write appends the chain's seal in the same script, signed by the finishing worker, so the record
served and the seal that proves it are written together or not at all.
"""

from __future__ import annotations

import json
import logging
import time
from enum import StrEnum
from typing import Any

import redis
from redis.typing import EncodableT, FieldT

from sandfleet.core import json_limits
from sandfleet.core.approvals import withdraw_job_approvals
from sandfleet.core.audit import MAX_APPEND_TRIES, RedisAuditSink, key_info_json, signed_entry
from sandfleet.core.batch_creator import RECORD_FIELD as BATCH_CREATOR_FIELD
from sandfleet.core.batch_creator import creator_digest
from sandfleet.core.chain import GENESIS_HASH, encode_event, link_hash, record_commitment, spec_commitment
from sandfleet.core.contracts import (
    AuditEvent,
    AuditKind,
    ErrorInfo,
    ErrorKind,
    JobResult,
    JobSpec,
    JobStatus,
)
from sandfleet.core.errors import BatchOwnerError, JsonLimitError
from sandfleet.core.lua import COUNT_DELIVERY, RECORD_QUEUED, TRANSITION
from sandfleet.core.records import JobRecord, RecordReader
from sandfleet.core.redis_keys import REJECTED_STREAM_MAXLEN, FleetKeys
from sandfleet.core.replies import text, text_list, text_map, text_or_none
from sandfleet.core.settings import Settings
from sandfleet.core.signing import ChainSigner

log = logging.getLogger(__name__)
WAIT_PROBE_TTL_S = 60


def queued_fields(job_id: str, spec_json: str, spec: JobSpec, now: float) -> dict[FieldT, EncodableT]:
    """The record's fields when the producer enqueues the job (``spec_json``: the spec as stored)."""
    fields: dict[FieldT, EncodableT] = {
        "job_id": job_id,
        "status": JobStatus.QUEUED.value,
        "spec": spec_json,
        "queued_at": repr(now),
        "updated_at": repr(now),
        "attempts": "0",
        "deliveries": "0",
    }
    if spec.batch_id:
        fields["batch_id"] = spec.batch_id
    return fields


def refusal(batch_id: str, outcome: str) -> str:
    """Why a job may not join ``batch_id`` (``outcome`` as RECORD_QUEUED returns it), and what to do."""
    if outcome == "refused":
        why = (
            f"batch {batch_id!r} was created by another submitter: a batch's jobs are the ones its "
            "creator submits"
        )
    else:
        why = f"batch {batch_id!r} records no creator (an older producer made it), so no job may join it"
    return (
        f"{why}; choose another batch id (or, to add to your own batch from another machine, set "
        "SANDFLEET_SUBMITTER_TOKEN to the token that created it)"
    )


def readable_result(result: JobResult) -> tuple[JobResult, str]:
    """``result`` and its JSON, or, when that JSON could not be read back (past ``MAX_RECORD_BYTES``
    or ``MAX_RECORD_DEPTH``, or not serialisable at all), a record of the same job that says so.

    A job must end whatever it produced: a final write that raised would leave it ``running``, and a
    record past what the readers parse would break every one of them for the retention period. The
    replacement keeps the job's counts, usage and timings; its error names the cap (the audit chain
    still has each step).
    """
    try:
        result_json = result.model_dump_json()
        json_limits.check_record(result_json, "the final record")
        return result, result_json
    except (ValueError, RecursionError) as e:  # JsonLimitError; pydantic's depth limit of 255
        problem = (
            str(e) if isinstance(e, JsonLimitError) else f"the final record cannot be written as JSON ({e})"
        )
    kept = JobResult(
        job_id=result.job_id,
        status=JobStatus.FAILED if result.status == JobStatus.SUCCEEDED else result.status,
        error=ErrorInfo(
            kind=ErrorKind.RECORD_LIMIT,
            message=f"{problem}; its answer and attempts are not kept (the audit chain has each step)",
        ),
        repairs=result.repairs,
        tool_calls=result.tool_calls,
        usage=result.usage,
        timings=result.timings,
        model=result.model,
        mode=result.mode,
        limits_hit=result.limits_hit,
    )
    return kept, kept.model_dump_json()


class Transition(StrEnum):
    """What a state change did."""

    APPLIED = "ok"
    ALREADY_FINAL = "final"  # the job had already ended: nothing was written
    MISSING = "missing"  # no record (never submitted, withdrawn, expired): nothing was written


class JobStore:
    """Writes of one fleet's job records. Thread-safe; share one per worker process.

    Args:
        signer: the worker's key (``None`` for a producer, which writes only queued records). Final
            records and audit events are written only with one.
    """

    def __init__(self, client: redis.Redis, settings: Settings, signer: ChainSigner | None = None) -> None:
        self.redis = client
        self.settings = settings
        self.signer = signer
        self.keys = FleetKeys(settings.key_prefix)
        self.reader = RecordReader(client, self.keys)
        self._transition = client.register_script(TRANSITION)
        self._count_delivery = client.register_script(COUNT_DELIVERY)
        self._record_queued = client.register_script(RECORD_QUEUED)

    @classmethod
    def from_settings(cls, settings: Settings, signer: ChainSigner | None = None) -> JobStore:
        """A store on the records' Redis (SANDFLEET_RESULTS_REDIS_URL, else the broker's)."""
        from sandfleet.core.redis_connect import connect, records_url

        return cls(connect(records_url(settings), settings), settings, signer)

    def audit_sink(self, job_id: str, *, head: str | None = None) -> RedisAuditSink:
        """The job's audit stream, written with this store's signer (``head``: the tip as just read,
        a guess that saves a read; see RedisAuditSink)."""
        return RedisAuditSink(self.redis, self.settings, job_id, self._require_signer(), head=head)

    def _require_signer(self) -> ChainSigner:
        if self.signer is None:
            raise RuntimeError(
                "this store has no signing key: only a worker writes audit events and final records"
            )
        return self.signer

    def record_queued(self, jobs: list[tuple[str, JobSpec]], submitter_token: str | None = None) -> None:
        """Write the queued records of ``jobs`` and their first audit event in one Lua step.

        Jobs of a batch need ``submitter_token``: a batch named for the first time is created by it
        (the batch record keeps only its digest, sandfleet/core/batch_creator.py); a batch another
        token created is refused, and then nothing of ``jobs`` is written.

        Raises:
            BatchOwnerError: a batch named was created by another submitter; nothing was written.
            redis.RedisError: nothing was written (Redis refuses the script's first write when full).
        """
        now, ttl = time.time(), self.settings.retention_s
        batch_ids = list(dict.fromkeys(spec.batch_id for _, spec in jobs if spec.batch_id))
        if batch_ids and not submitter_token:
            raise ValueError(
                "jobs of a batch are recorded with their submitter's token (the batch's creator)"
            )
        creators = [creator_digest(submitter_token or "", b) for b in batch_ids]
        number = {b: i for i, b in enumerate(batch_ids, start=1)}
        keys = [self.keys.all_jobs, self.keys.status_index(JobStatus.QUEUED)]
        for batch_id in batch_ids:
            keys += [self.keys.batch_counts(batch_id), self.keys.batch_jobs(batch_id)]
        args: list[EncodableT] = [repr(now), ttl, len(batch_ids), *creators]
        for job_id, spec in jobs:
            spec_json, spec_sha256 = spec_commitment(spec)
            data = {"status": JobStatus.QUEUED.value, "spec_sha256": spec_sha256}
            event_json = encode_event(AuditEvent(ts=now, job_id=job_id, kind=AuditKind.STATE, data=data))
            head = link_hash(GENESIS_HASH, event_json)
            fields = {**queued_fields(job_id, spec_json, spec, now), "audit_head": head, "audit_count": 1}
            if spec.batch_id:
                fields[BATCH_CREATOR_FIELD] = creators[number[spec.batch_id] - 1]
            keys += [self.keys.job(job_id), self.keys.audit(job_id)]
            args += [job_id, number.get(spec.batch_id or "", 0), event_json, head, 2 * len(fields)]
            args += [item for pair in fields.items() for item in pair]
        outcome, detail = text_list(self._record_queued(keys=keys, args=args))
        if outcome != "ok":
            raise BatchOwnerError(refusal(batch_ids[int(detail) - 1], outcome))

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

    def mark_running(self, job_id: str, worker: str, *, batch_id: str | None = None) -> Transition:
        """queued (or running, on a redelivery) -> running; counts one more attempt.

        ``batch_id``: the job's batch as its record names it ("" for none), when the caller has
        just read the record (a delivery has): saves the read of it here. A batch never changes.
        """
        outcome, _detail = self._apply(job_id, JobStatus.RUNNING, worker=worker, batch_id=batch_id)
        return Transition(outcome)

    def mark_queued(self, job_id: str) -> Transition:
        """running -> queued: the job waits for a retry after a transient failure."""
        return self._transition_to(job_id, JobStatus.QUEUED)

    def finish(
        self,
        job_id: str,
        result: JobResult,
        *,
        worker: str = "",
        token: str = "",
        batch_id: str | None = None,
        head: str | None = None,
    ) -> Transition:
        """Write the final record and the chain's seal. Only the first call for a job writes; later
        ones get ALREADY_FINAL and write nothing (no second seal).

        Args:
            worker: the finishing worker; must be the signer's (the default).
            token: stored in the final-record guard, to tell which delivery wrote the record.
            batch_id: the job's batch as its record names it ("" for none), if known (mark_running).
            head: the chain's tip as the caller last wrote it (its audit sink's), if known: saves
                reading it. A guess only: the seal is a compare-and-set on the tip Redis holds, so
                a stale one costs one retry, linked to the real tip.
        """
        if not result.status.is_final:
            raise ValueError(f"a final record needs a final status, got {result.status}")
        signer = self._require_signer()
        if worker and worker != signer.worker:
            raise ValueError(f"worker {worker!r} cannot write a final record signed by {signer.worker!r}")
        if result.job_id != job_id:
            result = result.model_copy(update={"job_id": job_id})
        result, result_json = readable_result(result)
        data: dict[str, Any] = {"status": result.status.value, "worker": signer.worker}
        if result.error is not None:
            data["error"] = result.error.model_dump(mode="json")
        # Nothing runs late: the job's approval requests are withdrawn before its final write, and the
        # seal names them (the final guard refuses any use of them after that).
        withdrawn = withdraw_job_approvals(self.redis, self.keys, job_id)
        if withdrawn:
            data["approvals_withdrawn"] = withdrawn
        data["record"] = record_commitment(result_json)
        seal_json = encode_event(AuditEvent(ts=time.time(), job_id=job_id, kind=AuditKind.STATE, data=data))
        if head is None:
            head = text_or_none(self.redis.hget(self.keys.job(job_id), "audit_head")) or GENESIS_HASH
        for _ in range(MAX_APPEND_TRIES):
            entry = signed_entry(signer, job_id, head, seal_json)
            seal = [head, entry.event, entry.hash, entry.sig, entry.key, key_info_json(signer, entry)]
            outcome, detail = self._apply(
                job_id,
                result.status,
                worker=signer.worker,
                result_json=result_json,
                token=token or signer.worker,
                seal=seal,
                batch_id=batch_id,
            )
            if outcome == Transition.APPLIED:
                self.await_replicas(job_id)
            if outcome != "moved":
                return Transition(outcome)
            head = detail  # another writer appended an event first: link the seal to it
        raise RuntimeError(f"audit stream of job {job_id} kept moving; its final record was not written")

    def await_replicas(self, job_id: str) -> int:
        """Block until ``redis_wait_replicas`` replicas hold every write so far (the final record and
        the audit events before it), at most ``redis_wait_timeout_ms``: only then is the job's message
        acknowledged, so a failover right after cannot lose a result that counts as done. A server
        without replicas is not waited on; a replica that does not answer in time is logged.

        Raises:
            redis.RedisError: the primary went away meanwhile: the message stays unacknowledged and
                the job is delivered again (its final record is then found, or written anew).
        """
        wanted = self.settings.redis_wait_replicas
        if wanted <= 0:
            return 0
        replicas = int(self.redis.info("replication").get("connected_slaves", 0))
        if replicas == 0:
            return 0
        wanted = min(wanted, replicas)
        # WAIT waits for the replication offset of its own connection's last write; a pooled client
        # may have sealed on another connection, so write a probe first on the one that waits.
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.replication_probe, job_id, ex=WAIT_PROBE_TTL_S)
        pipe.execute_command("WAIT", wanted, self.settings.redis_wait_timeout_ms)  # type: ignore[no-untyped-call]
        acked = int(pipe.execute()[-1])
        if acked < wanted:
            log.warning(
                "job %s: final record acknowledged by %d of %d replicas within %d ms",
                job_id,
                acked,
                wanted,
                self.settings.redis_wait_timeout_ms,
            )
        return acked

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
        self,
        job_id: str,
        status: JobStatus,
        *,
        worker: str = "",
        result_json: str = "",
        token: str = "",
        seal: list[str] | None = None,
        batch_id: str | None = None,
    ) -> tuple[str, str]:
        """Run the TRANSITION script; ``(outcome, detail)`` as it returns them. ``batch_id`` None:
        read from the record (one round trip)."""
        if batch_id is None:
            batch_id = text_or_none(self.redis.hget(self.keys.job(job_id), "batch_id"))
        batch_id = batch_id or "-"
        keys = [
            self.keys.job(job_id),
            self.keys.final_guard(job_id),
            self.keys.done(job_id),
            self.keys.batch_counts(batch_id),
            self.keys.batch_jobs(batch_id),
            self.keys.audit(job_id),
            self.keys.deliveries(job_id),
            self.keys.signing_keys,
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
            *(seal or ["", "", "", "", "", ""]),
            *(s.value for s in JobStatus),
        ]
        outcome, detail = text_list(self._transition(keys=keys, args=args))
        if outcome == Transition.ALREADY_FINAL:
            log.info("job %s already ended (%s): %s not recorded", job_id, detail, status)
        elif outcome == Transition.MISSING:
            log.warning("job %s has no record: %s not recorded", job_id, status)
        return outcome, detail

    def _transition_to(self, job_id: str, status: JobStatus, *, worker: str = "") -> Transition:
        outcome, _detail = self._apply(job_id, status, worker=worker)
        return Transition(outcome)
