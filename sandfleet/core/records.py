"""Job records as stored in Redis, read side: every read of records, audit streams and batches.

Writes are in :mod:`sandfleet.core.store` (records) and :mod:`sandfleet.core.audit` (the audit
stream); key names in :mod:`sandfleet.core.redis_keys`; the chain's hash in :mod:`sandfleet.core.chain`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandfleet.core.batch_creator import CREATOR_FIELD, is_own_job
from sandfleet.core.batch_creator import RECORD_FIELD as BATCH_CREATOR_FIELD
from sandfleet.core.chain import ChainEntry
from sandfleet.core.contracts import ID_PATTERN, AuditEvent, JobResult, JobSpec, JobStatus
from sandfleet.core.errors import JobNotFoundError
from sandfleet.core.priority import effective_priority
from sandfleet.core.redis_keys import FleetKeys, check_id
from sandfleet.core.replies import text, text_list, text_map, text_or_none
from sandfleet.core.settings import Settings
from sandfleet.core.verify import JobEvidence


class JobRecord(BaseModel):
    """A job's record as read back: state, timestamps by state, counts, spec and final result."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    status: JobStatus
    batch_id: str | None = None
    batch_creator: str | None = Field(None, description="the digest of the batch creator's token")
    timestamps: dict[str, float] = Field(default_factory=dict, description="state -> epoch seconds")
    updated_at: float | None = None
    attempts: int = 0
    deliveries: int = 0
    worker: str | None = None
    spec: JobSpec | None = None
    result: JobResult | None = None
    audit_count: int = 0
    audit_head: str = Field("", description="the link hash of the chain's last entry, as the record names it")
    unreadable: str | None = Field(
        None, description="why the stored spec or result could not be read (then left out, not raised)"
    )

    @property
    def priority(self) -> int | None:
        """The job's priority (0-9, 9 first; core/priority.py), None without a spec."""
        return None if self.spec is None else effective_priority(self.spec.priority, self.spec.batch_id)

    @classmethod
    def from_hash(cls, fields: dict[str, str]) -> JobRecord:
        """The record of ``fields`` (an HGETALL). A spec or result that does not parse (a record
        written by something other than a worker, or by one before the caps) is left out and said
        so in ``unreadable``, so one such record cannot break a listing of many."""
        stamps = {k.removesuffix("_at"): float(v) for k, v in fields.items() if k.endswith("_at")}
        updated = stamps.pop("updated", None)
        spec = result = None
        problems = []
        try:
            spec = JobSpec.model_validate_json(fields["spec"]) if fields.get("spec") else None
        except ValidationError as e:
            problems.append(f"its spec cannot be read ({_first_line(e)})")
        try:
            result = JobResult.model_validate_json(fields["result"]) if fields.get("result") else None
        except ValidationError as e:
            problems.append(f"its final result cannot be read ({_first_line(e)})")
        return cls(
            job_id=fields["job_id"],
            status=JobStatus(fields["status"]),
            batch_id=fields.get("batch_id") or None,
            batch_creator=fields.get(BATCH_CREATOR_FIELD) or None,
            timestamps=stamps,
            updated_at=updated,
            attempts=int(fields.get("attempts", 0)),
            deliveries=int(fields.get("deliveries", 0)),
            worker=fields.get("worker") or None,
            spec=spec,
            result=result,
            audit_count=int(fields.get("audit_count", 0)),
            audit_head=fields.get("audit_head", ""),
            unreadable="; ".join(problems) or None,
        )


def _first_line(error: ValidationError) -> str:
    """The first problem pydantic names, without the input it quotes."""
    first = error.errors(include_url=False, include_input=False)[0]
    return str(first.get("msg", "invalid"))[:200]


class RecordReader:
    """Reads of job records, audit streams and batch counts. Raises redis errors as they come."""

    def __init__(self, client: redis.Redis, keys: FleetKeys) -> None:
        self._redis = client
        self._keys = keys

    @property
    def redis(self) -> redis.Redis:
        """The connection it reads with."""
        return self._redis

    @classmethod
    @contextmanager
    def connect(cls, redis_url: str, settings: Settings) -> Iterator[RecordReader]:
        """A reader on its own connection to ``redis_url``, closed on exit."""
        from sandfleet.core.redis_connect import connect

        client = connect(redis_url, settings, socket_connect_timeout=5.0)
        try:
            yield cls(client, FleetKeys(settings.key_prefix))
        finally:
            client.close()

    def record(self, job_id: str) -> JobRecord:
        """The job's record, or JobNotFoundError (never submitted, or past retention)."""
        check_id(job_id)
        fields = text_map(self._redis.hgetall(self._keys.job(job_id)))
        if not fields or "status" not in fields:
            raise JobNotFoundError(f"no record for job {job_id!r} (never submitted, or past retention)")
        return JobRecord.from_hash(fields)

    def status(self, job_id: str) -> JobStatus:
        check_id(job_id)
        value = self._redis.hget(self._keys.job(job_id), "status")
        if value is None:
            raise JobNotFoundError(f"no record for job {job_id!r} (never submitted, or past retention)")
        return JobStatus(text(value))

    def result(self, job_id: str) -> JobResult | None:
        """The final result, or None while the job has not ended."""
        check_id(job_id)
        status, raw = self._redis.hmget(self._keys.job(job_id), ["status", "result"])
        if status is None:
            raise JobNotFoundError(f"no record for job {job_id!r} (never submitted, or past retention)")
        return JobResult.model_validate_json(raw) if raw else None

    def ended(self, job_id: str) -> bool:
        """Whether the record holds a final result (nothing is parsed: a damaged one still counts)."""
        check_id(job_id)
        status, raw = self._redis.hmget(self._keys.job(job_id), ["status", "result"])
        if status is None:
            raise JobNotFoundError(f"no record for job {job_id!r} (never submitted, or past retention)")
        return bool(raw)

    def audit_entries(self, job_id: str) -> list[ChainEntry]:
        """Every audit entry as stored, oldest first."""
        check_id(job_id)
        stream = self._redis.xrange(self._keys.audit(job_id)) or []
        return [ChainEntry.from_fields(text_map(fields or {})) for _entry_id, fields in stream]

    def audit(self, job_id: str) -> list[AuditEvent]:
        """The job's audit events, oldest first."""
        entries = self.audit_entries(job_id)
        if not entries and not self._redis.exists(self._keys.job(job_id)):
            raise JobNotFoundError(f"no record for job {job_id!r} (never submitted, or past retention)")
        return [AuditEvent.model_validate_json(entry.event) for entry in entries]

    def evidence(self, job_id: str) -> JobEvidence:
        """The job's record fields and audit entries, read in one round trip (for verification)."""
        [evidence] = self.evidence_many([job_id])
        return evidence

    def evidence_many(self, job_ids: list[str]) -> list[JobEvidence]:
        """Record fields and audit entries of many jobs in one MULTI/EXEC: a consistent snapshot, so
        a job that ends meanwhile is seen before or after its final write, never half-way."""
        pipe = self._redis.pipeline(transaction=True)
        for job_id in job_ids:
            check_id(job_id)
            pipe.hgetall(self._keys.job(job_id))
            pipe.xrange(self._keys.audit(job_id))
        replies = pipe.execute()
        return [
            JobEvidence(
                job_id,
                text_map(fields or {}),
                [ChainEntry.from_fields(text_map(f or {})) for _entry_id, f in stream or []],
            )
            for job_id, fields, stream in zip(job_ids, replies[::2], replies[1::2], strict=True)
        ]

    def batch_counts(self, batch_id: str) -> dict[str, int]:
        """``{"total": n, "queued": ..., "running": ..., ...}``: one HGETALL (the hash's ``creator``
        field is not a count and is left out)."""
        check_id(batch_id, "batch id")
        raw = text_map(self._redis.hgetall(self._keys.batch_counts(batch_id)))
        counts = {s.value: 0 for s in JobStatus}
        counts.update({k: int(v) for k, v in raw.items() if k != CREATOR_FIELD})
        counts.setdefault("total", 0)
        return counts

    def batch_creator(self, batch_id: str) -> str | None:
        """The digest of the token that created the batch (None: no such batch, or an older one)."""
        check_id(batch_id, "batch id")
        return text_or_none(self._redis.hget(self._keys.batch_counts(batch_id), CREATOR_FIELD))

    def batch_job_ids(self, batch_id: str) -> list[str]:
        """The batch's own job ids in submission order: listed jobs whose record names another batch
        or another creator are left out (core/batch_creator.py); a job whose record is gone (past
        retention) stays in, so that it shows as missing."""
        check_id(batch_id, "batch id")
        pipe = self._redis.pipeline(transaction=True)
        pipe.hget(self._keys.batch_counts(batch_id), CREATOR_FIELD)
        pipe.lrange(self._keys.batch_jobs(batch_id), 0, -1)
        creator, listed = pipe.execute()
        ids = [i for i in dict.fromkeys(text_list(listed or [])) if ID_PATTERN.match(i)]
        pipe = self._redis.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(self._keys.job(job_id), ["status", "batch_id", BATCH_CREATOR_FIELD])
        names = ("status", "batch_id", BATCH_CREATOR_FIELD)
        owners = [
            {name: text(v) for name, v in zip(names, values, strict=True) if v is not None}
            for values in pipe.execute()
        ]
        return [
            job_id
            for job_id, record in zip(ids, owners, strict=True)
            if "status" not in record or is_own_job(batch_id, text_or_none(creator), record)
        ]

    def job_ids(
        self, batch_id: str | None = None, status: JobStatus | str | None = None, limit: int = 1000
    ) -> list[str]:
        """Job ids, newest first (a batch in submission order), filtered by batch and/or status."""
        if batch_id is not None:
            ids = self.batch_job_ids(batch_id)
            if status is not None:
                statuses = self._statuses(ids)
                ids = [i for i, s in zip(ids, statuses, strict=True) if s == JobStatus(status).value]
            return ids[:limit]
        key = self._keys.status_index(status) if status is not None else self._keys.all_jobs
        return text_list(self._redis.zrevrange(key, 0, limit - 1))

    def records(self, job_ids: list[str]) -> list[JobRecord]:
        """Records of many jobs in one round trip; ids without a record are left out."""
        pipe = self._redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hgetall(self._keys.job(job_id))
        return [JobRecord.from_hash(text_map(f)) for f in pipe.execute() if f and "status" in f]

    def _statuses(self, job_ids: list[str]) -> list[str | None]:
        pipe = self._redis.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hget(self._keys.job(job_id), "status")
        return [text_or_none(status) for status in pipe.execute()]
