"""The producer: validate job specs, record them as queued, enqueue them by task name, read them back.

    client = Client()                                   # SANDFLEET_REDIS_URL, else localhost
    job = client.submit("Revenue per region in Q3 2026?", tools=["read_orders"])
    print(job.result(timeout=600).result)

Submitting writes the queued record (one Lua step: record, indexes, batch counts, the first audit
event), then publishes the Celery message with ``send_task``. If publishing fails the record is
withdrawn again, so a failed submit leaves neither a record without a message nor the reverse. (A
producer killed between the two steps leaves a queued record with no message; the worker, for its
part, discards a message whose record is missing.) Nothing here imports worker code.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from pydantic import ValidationError

from sandfleet.core.approvals import ApprovalRequest
from sandfleet.core.artifacts import ArtifactStore, open_artifact_store, with_artifact_digests
from sandfleet.core.bundle import write_bundle
from sandfleet.core.cancel import CancelRequests
from sandfleet.core.chain import spec_commitment
from sandfleet.core.contracts import (
    FINAL_STATUSES,
    ArtifactInfo,
    AuditEvent,
    JobResult,
    JobSpec,
    JobStatus,
    describe_validation_error,
)
from sandfleet.core.errors import (
    ApprovalUnverifiedError,
    InvalidSpecError,
    JobNotFoundError,
    QueueUnavailableError,
)
from sandfleet.core.key_registry import KeyRegistry, verification_ring
from sandfleet.core.priority import DEFAULT_BATCH_PRIORITY, DEFAULT_JOB_PRIORITY
from sandfleet.core.publish import JobPublisher, PublishError
from sandfleet.core.queue import check_time_limits, describe_redis_error, make_app, redis_errors
from sandfleet.core.records import JobRecord, RecordReader
from sandfleet.core.redis_connect import connect
from sandfleet.core.redis_keys import FleetKeys, check_id
from sandfleet.core.settings import Settings, get_settings
from sandfleet.core.signing import KeyRing, WorkerKey
from sandfleet.core.store import JobStore
from sandfleet.core.verify import BatchVerdict, JobEvidence, Verdict, VerdictState, verify_jobs
from sandfleet.producer.artifacts import fetch_artifact, write_artifacts
from sandfleet.producer.cancelling import BatchCancelReport, CancelReport, requester
from sandfleet.producer.checked import CheckedResult, checked_result, checked_verdict, unverified_error
from sandfleet.producer.defaults import apply_defaults, check_defaults, spec_fields
from sandfleet.producer.ledger import SubmissionLedger
from sandfleet.producer.request_check import RequestCheck
from sandfleet.producer.submitter import submitter_token as load_submitter_token

REDIS_CONNECT_TIMEOUT_S = 5.0
# Waiting for results: BLPOP in slices this long, re-reading the record between slices.
WAIT_SLICE_S = 2.0
# Batch progress polling: from the first interval, doubling up to the last.
POLL_FIRST_S = 0.05
POLL_MAX_S = 1.0
MAX_ERRORS_SHOWN = 20


def build_spec(spec_or_question: JobSpec | dict[str, Any] | str, **fields: Any) -> JobSpec:
    """A validated JobSpec from a spec, a dict or a question plus fields; InvalidSpecError if not."""
    if isinstance(spec_or_question, JobSpec):
        if not fields:
            return spec_or_question
        data = {**spec_or_question.model_dump(exclude_unset=True), **fields}
    elif isinstance(spec_or_question, dict):
        data = {**spec_or_question, **fields}
    else:
        data = {"question": spec_or_question, **fields}
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise InvalidSpecError(f"invalid job spec: {describe_validation_error(e)}") from None


@dataclass(frozen=True)
class BatchProgress:
    """How many of a batch's jobs are in each state."""

    total: int
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def done(self) -> int:
        """Jobs that ended, whatever the outcome."""
        return sum(self.counts.get(s.value, 0) for s in FINAL_STATUSES)

    @property
    def finished(self) -> bool:
        return self.done >= self.total

    def __str__(self) -> str:
        parts = [f"{k} {v}" for k, v in self.counts.items() if v and k != "total"]
        return f"{self.done}/{self.total} done ({', '.join(parts) or 'nothing yet'})"


class JobHandle:
    """One submitted job. Cheap to make; every method reads Redis.

    ``spec_sha256``: the digest of the spec submitted as this job (known to the handle that submitted
    it, and to ``Client.get`` from the ledger): a record answering another spec is refused
    (SpecMismatchError). None: the record is checked against its chain only.
    """

    def __init__(self, client: Client, job_id: str, spec_sha256: str | None = None) -> None:
        self.client = client
        self.job_id = job_id
        self.spec_sha256 = spec_sha256
        self._final: JobResult | None = None  # the verified final record, once read (it never changes)

    def __repr__(self) -> str:
        return f"JobHandle({self.job_id!r})"

    def status(self) -> JobStatus:
        with self.client.redis_errors():
            return self.client.reader.status(self.job_id)

    def record(self) -> JobRecord:
        """The whole record: state, timestamps by state, counts, spec, result."""
        with self.client.redis_errors():
            return self.client.reader.record(self.job_id)

    def result(self, timeout: float | None = None, *, verify: bool = True) -> JobResult:
        """Wait for the final record (at most ``timeout`` seconds; None: no limit) and return it.

        With ``verify`` (the default) the record is served only if its audit chain proves it: the
        seal's commitment matches the record, and every signature holds (keys: ``Client.key_ring``);
        and, when the submitted spec's digest is known, only if the chain commits to that spec.

        Raises:
            TimeoutError: the job had not ended in time; the message names the job and its state.
            UnverifiedResultError: the record and its chain disagree (the problems are named).
            SpecMismatchError: the record answers a different question than the one submitted.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        done_key = self.client.keys.done(self.job_id)
        with self.client.redis_errors():
            while True:
                if self.client.reader.ended(self.job_id):
                    if not verify:
                        found = self.client.reader.result(self.job_id)
                        assert found is not None
                        return found
                    checked = self.checked()
                    assert checked.result is not None  # a verified final record
                    return checked.result
                left = WAIT_SLICE_S if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    status = self.client.reader.status(self.job_id)
                    raise TimeoutError(
                        f"job {self.job_id} has not ended after {timeout:g} s (it is {status})"
                    )
                popped = self.client.redis.blpop([done_key], timeout=max(0.01, min(left, WAIT_SLICE_S)))
                if popped:  # put the signal back for any other waiter
                    self.client.redis.lpush(done_key, popped[1])

    def checked(self) -> CheckedResult:
        """The final result if its chain proves it (and it answers the spec submitted, when known);
        UnverifiedResultError if they disagree (SpecMismatchError for another spec)."""
        with self.client.redis_errors():
            evidence = self.client.reader.evidence(self.job_id)
        checked = checked_result(evidence, self.client.key_ring(), self.spec_sha256)
        if checked.verdict.state == VerdictState.MISSING:
            raise JobNotFoundError(f"no record for job {self.job_id!r} (never submitted, or past retention)")
        if checked.verdict.state == VerdictState.MISMATCHED:
            raise unverified_error([checked])
        self._final = checked.result or self._final
        return checked

    def _verified_final(self) -> JobResult:
        """The verified final record (read and verified once per handle); KeyError while not final."""
        result = self._final or self.checked().result
        if result is None:
            raise KeyError(f"job {self.job_id} has not ended: no artifacts yet")
        return result

    def audit(self) -> list[AuditEvent]:
        """The job's audit events, oldest first."""
        with self.client.redis_errors():
            return self.client.reader.audit(self.job_id)

    def verify(self) -> Verdict:
        """Check the job's record against its audit chain, the chain's signatures, and the stored bytes
        of its artifacts against the digests the chain commits to, and the spec the chain commits to
        against the one submitted (when its digest is known)."""
        with self.client.redis_errors():
            evidence = self.client.with_artifact_digests(self.client.reader.evidence(self.job_id))
        return checked_verdict(evidence, self.client.key_ring(), self.spec_sha256)

    # -- artifacts ------------------------------------------------------------------------------
    def artifacts(self) -> list[ArtifactInfo]:
        """The files the job's program handed back (name, size, media type, SHA-256), from its
        verified record; empty while the job has not ended.

        Raises:
            UnverifiedResultError: the record and its chain disagree.
        """
        result = self.checked().result
        return list(result.artifacts) if result is not None else []

    def artifact(self, name: str) -> bytes:
        """The bytes of one artifact, checked against the SHA-256 its verified record lists.

        Raises:
            KeyError: no artifact of that name (or the job has not ended).
            ArtifactIntegrityError: its bytes are gone or changed at rest.
        """
        result = self._verified_final()
        with self.client.redis_errors():
            return fetch_artifact(self.client.artifact_store, result, name)

    def download_artifacts(self, folder: Path) -> list[Path]:
        """Write every artifact of the finished job under ``folder``; the paths written (each file
        checked against its digest first: a changed one raises ArtifactIntegrityError, nothing written)."""
        result = self._verified_final()
        with self.client.redis_errors():
            return write_artifacts(self.client.artifact_store, result, folder)

    def verify_audit(self) -> tuple[bool, int | None]:
        """``(True, None)`` if nothing disagrees (so far, for a running job), else ``(False, first bad
        entry or None)``. :meth:`verify` says why."""
        verdict = self.verify()
        return verdict.holds, verdict.bad_index

    def export(self, path: Path) -> Verdict:
        """Write an audit bundle of this job to ``path``; returns its verdict at export time."""
        return self.client.export_bundle([self.job_id], path).verdicts[0]

    def cancel(self) -> CancelReport:
        """Ask for this job to stop: a queued job never starts, a running one has its sandbox killed and
        ends ``cancelled``; a job that had ended is left as it was (the report says so)."""
        [report] = self.client.cancel([self.job_id])
        return report


class BatchHandle:
    """Jobs submitted together; progress is one read of the batch's counts.

    ``spec_digests``: job id -> the digest of the spec submitted as that job, where known (see
    JobHandle); results answering another spec are refused.
    """

    def __init__(
        self, client: Client, batch_id: str, job_ids: list[str], spec_digests: dict[str, str] | None = None
    ) -> None:
        self.client = client
        self.batch_id = batch_id
        self.job_ids = job_ids
        self.spec_digests = spec_digests or {}

    def __repr__(self) -> str:
        return f"BatchHandle({self.batch_id!r}, {len(self.job_ids)} jobs)"

    def __len__(self) -> int:
        return len(self.job_ids)

    def jobs(self) -> list[JobHandle]:
        return [JobHandle(self.client, j, self.spec_digests.get(j)) for j in self.job_ids]

    def progress(self) -> BatchProgress:
        with self.client.redis_errors():
            counts = self.client.reader.batch_counts(self.batch_id)
        return BatchProgress(total=counts.pop("total") or len(self.job_ids), counts=counts)

    def results(self) -> list[JobResult | None]:
        """Results in submission order (``job_ids`` order); None for a job still running.

        Raises:
            UnverifiedResultError: a finished job's record is not proven by its audit chain.
            SpecMismatchError: a job's record answers a different question than the one submitted.
        """
        checked = self.checked_results()
        if any(c.verdict.state == VerdictState.MISMATCHED for c in checked):
            raise unverified_error(checked)
        return [c.result for c in checked]

    def checked_results(self) -> list[CheckedResult]:
        """Every job's verdict and, when verified, its result, in submission order."""
        with self.client.redis_errors():
            evidences = self.client.reader.evidence_many(self.job_ids)
        ring = self.client.key_ring()
        return [checked_result(e, ring, self.spec_digests.get(e.job_id)) for e in evidences]

    def verify(self) -> BatchVerdict:
        """Check every job of the batch (records against chains, signatures, artifacts' stored bytes):
        verdicts and counts."""
        return self.client.verify_jobs(self.job_ids, submitted=self.spec_digests)

    def download_artifacts(self, folder: Path) -> dict[str, list[Path]]:
        """Write the artifacts of every verified, finished job under ``folder/JOB_ID/``; job id -> the
        paths written (jobs with none are left out). A record its chain does not prove raises
        UnverifiedResultError before anything is written; a changed file ArtifactIntegrityError."""
        results = [r for r in self.results() if r is not None and r.artifacts]
        with self.client.redis_errors():
            return {
                r.job_id: write_artifacts(self.client.artifact_store, r, folder / r.job_id) for r in results
            }

    def export(self, path: Path) -> BatchVerdict:
        """Write an audit bundle of the batch's jobs to ``path``; returns their verdicts."""
        return self.client.export_bundle(self.job_ids, path)

    def cancel(self) -> BatchCancelReport:
        """Ask for every job of the batch that has not ended to stop (see :meth:`JobHandle.cancel`)."""
        return BatchCancelReport(self.batch_id, self.client.cancel(self.job_ids))

    def wait(
        self, timeout: float | None = None, on_progress: Callable[[BatchProgress], None] | None = None
    ) -> list[JobResult]:
        """Wait until every job ended; calls ``on_progress`` whenever the counts change.

        Raises:
            TimeoutError: not all jobs ended in ``timeout`` seconds (the message has the counts).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        interval, last = POLL_FIRST_S, None
        while True:
            progress = self.progress()
            if progress != last:
                interval, last = POLL_FIRST_S, progress
                if on_progress is not None:
                    on_progress(progress)
            if progress.finished:
                return [r for r in self.results() if r is not None]
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"batch {self.batch_id} has not ended after {timeout:g} s: {progress}")
            sleep = interval if deadline is None else min(interval, max(0.0, deadline - time.monotonic()))
            time.sleep(sleep)
            interval = min(interval * 2, POLL_MAX_S)


class Client:
    """Submits jobs to the fleet and reads their records. Thread-safe (redis-py's connection pool)."""

    def __init__(self, redis_url: str | None = None, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.redis_url = redis_url or self.settings.redis_url
        self.keys = FleetKeys(self.settings.key_prefix)
        # Records apart from the broker when SANDFLEET_RESULTS_REDIS_URL says so (core/redis_connect.py).
        self.records_url = self.settings.results_redis_url or self.redis_url
        self.redis = connect(self.records_url, self.settings, socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S)
        self.reader = RecordReader(self.redis, self.keys)
        self.registry = KeyRegistry(self.redis, self.keys)
        self.store = JobStore(self.redis, self.settings)
        self.artifact_store: ArtifactStore = open_artifact_store(self.settings, self.redis)
        self.ledger = SubmissionLedger.from_settings(self.settings)
        self._submitter_token: str | None = None
        self._app: Any = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._app is not None:
            self._app.close()
        close_store = getattr(self.artifact_store, "close", None)
        if close_store is not None:
            close_store()
        if self.ledger is not None:
            self.ledger.close()
        self.redis.close()

    @property
    def app(self) -> Any:
        """The Celery app used to publish (made on first use; it registers no tasks)."""
        if self._app is None:
            app_settings = self.settings.model_copy(update={"redis_url": self.redis_url})
            self._app = make_app(app_settings)
        return self._app

    @property
    def publisher(self) -> JobPublisher:
        return JobPublisher(self.app, self.settings)

    # -- submitting ---------------------------------------------------------------------------
    def submit(self, spec_or_question: JobSpec | dict[str, Any] | str, **fields: Any) -> JobHandle:
        """Validate one job, record it as queued and enqueue it.

        Raises:
            InvalidSpecError: the spec is invalid (field and reason named); nothing was enqueued.
            BatchOwnerError: its ``batch_id`` names a batch another submitter created; nothing enqueued.
            QueueUnavailableError: Redis is unreachable or full; nothing was enqueued.
            ClientStateError: the ledger or the submitter token cannot be written; nothing enqueued.
        """
        spec = with_priority(build_spec(spec_or_question, **fields), DEFAULT_JOB_PRIORITY)
        check_time_limits(self.settings, spec)
        job_id = new_job_id()
        digests = self._remember([(job_id, spec)])
        self._record_queued([(job_id, spec)])
        self._publish([(job_id, spec)])
        return JobHandle(self, job_id, digests[job_id])

    def submit_batch(
        self, specs: Iterable[JobSpec | dict[str, Any] | str], batch_id: str | None = None, **defaults: Any
    ) -> BatchHandle:
        """Validate every spec, then record and enqueue them all as one batch.

        ``defaults`` are JobSpec fields for every spec that does not set them itself (``tools``,
        ``model``, ``mode``, ``sandbox``, ``code_action``, ``priority``, ``metadata`` ...; mappings
        merged key by key: sandfleet/producer/defaults.py). A job of a batch has priority 3 unless set.

        Raises:
            InvalidSpecError: a spec is invalid (its index, field and reason named); nothing enqueued.
            BatchOwnerError: ``batch_id`` names a batch another submitter created; nothing enqueued.
            QueueUnavailableError: Redis is unreachable or full (the message says what was enqueued).
            ClientStateError: the ledger or the submitter token cannot be written; nothing enqueued.
        """
        batch_id = check_id(batch_id, "batch id") if batch_id else new_batch_id()
        check_defaults(defaults)
        validated, errors = [], []
        for index, item in enumerate(specs):
            try:
                spec = with_priority(
                    build_spec(apply_defaults(spec_fields(item), defaults)), DEFAULT_BATCH_PRIORITY
                )
                if spec.batch_id not in (None, batch_id):
                    raise InvalidSpecError(
                        f"batch_id: {spec.batch_id!r} differs from the batch's {batch_id!r}"
                    )
                spec = spec.model_copy(update={"batch_id": batch_id})
                check_time_limits(self.settings, spec)
                validated.append((new_job_id(), spec))
            except InvalidSpecError as e:
                errors.append(f"spec {index}: {str(e).removeprefix('invalid job spec: ')}")
        if errors:
            shown = errors[:MAX_ERRORS_SHOWN] + [f"... and {len(errors) - MAX_ERRORS_SHOWN} more"] * (
                len(errors) > MAX_ERRORS_SHOWN
            )
            raise InvalidSpecError("invalid batch, nothing enqueued:\n" + "\n".join(shown))
        if not validated:
            raise InvalidSpecError("a batch needs at least one job spec")
        digests = self._remember(validated)
        self._record_queued(validated)
        self._publish(validated)
        return BatchHandle(self, batch_id, [job_id for job_id, _ in validated], digests)

    # -- reading ------------------------------------------------------------------------------
    def get(self, job_id: str) -> JobHandle:
        """A handle on an existing job (checked against the spec submitted, when the ledger holds it);
        JobNotFoundError if there is no record of it."""
        try:
            check_id(job_id)
        except ValueError as e:
            raise JobNotFoundError(str(e)) from None
        with self.redis_errors():
            if not self.redis.exists(self.keys.job(job_id)):
                raise JobNotFoundError(f"no record for job {job_id!r} (never submitted, or past retention)")
        return JobHandle(self, job_id, self.submitted_specs([job_id]).get(job_id))

    def batch(self, batch_id: str) -> BatchHandle:
        """A handle on an existing batch: its own jobs (the ones its creator submitted), each checked
        against the spec submitted where the ledger holds it."""
        with self.redis_errors():
            job_ids = self.reader.batch_job_ids(batch_id)
        if not job_ids:
            raise JobNotFoundError(f"no batch {batch_id!r} (never submitted, or past retention)")
        return BatchHandle(self, batch_id, job_ids, self.submitted_specs(job_ids))

    def submitted_specs(self, job_ids: list[str]) -> dict[str, str]:
        """Job id -> the SHA-256 of the spec submitted, for the ids this user's ledger holds."""
        return {} if self.ledger is None else self.ledger.spec_digests(job_ids)

    def submitter_token(self) -> str:
        """The secret that makes this client the creator of its batches (sandfleet/producer/submitter.py)."""
        if self._submitter_token is None:
            self._submitter_token = load_submitter_token(self.settings)
        return self._submitter_token

    def jobs(
        self, batch: str | None = None, status: JobStatus | str | None = None, limit: int = 1000
    ) -> list[JobRecord]:
        """Job records, newest first (a batch's in submission order), filtered by batch and status."""
        with self.redis_errors():
            return self.reader.records(self.reader.job_ids(batch, status, limit))

    # -- cancelling ---------------------------------------------------------------------------
    def cancel(self, job_ids: list[str], by: str | None = None) -> list[CancelReport]:
        """Ask for each job to stop (``by``: who asks, default ``user@host``); a report per job, in order.

        A worker ends each job ``cancelled`` (a queued one never starts; a running one has its sandboxes
        killed and its model call abandoned); jobs that had ended are left as they were.
        """
        requests = CancelRequests(self.redis, self.keys, self.settings.retention_s)
        who = by or requester()
        reports = []
        with self.redis_errors():
            for job_id in job_ids:
                outcome, status = requests.request(job_id, who)
                reports.append(CancelReport(job_id, outcome, status))
        return reports

    # -- approvals ----------------------------------------------------------------------------
    def approvals(
        self, *, pending_only: bool = True, job_id: str | None = None, limit: int = 100
    ) -> list[ApprovalRequest]:
        """Approval requests, oldest first: the pending ones (default), or all, or one job's."""
        from sandfleet.producer.approvals import approval_store

        with self.redis_errors():
            return approval_store(self).requests(pending_only=pending_only, job_id=job_id, limit=limit)

    def approval(self, request_id: str) -> ApprovalRequest:
        """One request (ApprovalNotFoundError if there is none)."""
        from sandfleet.producer.approvals import approval_store

        with self.redis_errors():
            return approval_store(self).get(request_id)

    def approve(
        self,
        request_id: str,
        *,
        by: str | None = None,
        call_sha256: str = "",
        key: str | Path | WorkerKey | None = None,
        unsigned: bool = False,
        trust_unverified_request: bool = False,
    ) -> ApprovalRequest:
        """Approve the request's call, once (``call_sha256``: refuse unless it is the call you saw),
        signed with the approver key ``key`` (default: ``SANDFLEET_APPROVER_KEY``'s file); ``unsigned``
        signs nothing (workers refuse that unless they allow unsigned decisions).

        Refused unless the request in Redis is the one its worker signed (``check_approval``), since
        whoever writes Redis could show other arguments than the call that would run;
        ``trust_unverified_request`` skips that check (the worker still runs only the call it signed).

        Raises:
            ApproverKeyError (no usable key: nothing decided), ApprovalNotFoundError,
            ApprovalUnverifiedError (rewritten in Redis, or never signed), ApprovalDecidedError
            (decided before, or timed out), ApprovalWithdrawnError (its job ended),
            ApprovalMismatchError.
        """
        from sandfleet.core.approvals import ApprovalStatus
        from sandfleet.producer.approvals import decide

        if not trust_unverified_request:
            _, check = self.check_approval(request_id)
            if check.state != "verified":
                raise ApprovalUnverifiedError(
                    f"not approved: the request is not the one its worker signed: {check.describe()}"
                )
        return decide(
            self,
            request_id,
            ApprovalStatus.APPROVED,
            by=by,
            call_sha256=call_sha256,
            key=key,
            unsigned=unsigned,
        )

    def check_approval(self, request_id: str) -> tuple[ApprovalRequest, RequestCheck]:
        """Request ``request_id`` as stored in Redis, and whether it is the one its worker signed:
        compared with the signed ``requested`` event of the job's verified chain (waiting a moment
        for a request that was just made). ApprovalNotFoundError if there is no such request."""
        from sandfleet.producer.request_check import check_request, signed_request

        ring = self.key_ring()
        with self.redis_errors():
            return signed_request(
                lambda: self.approval(request_id), lambda r: check_request(self.reader, ring, r)
            )

    def deny(
        self,
        request_id: str,
        reason: str,
        *,
        by: str | None = None,
        key: str | Path | WorkerKey | None = None,
        unsigned: bool = False,
    ) -> ApprovalRequest:
        """Deny the request's call: the program gets ToolDeniedError with ``reason``. Signed and
        refused as approve."""
        from sandfleet.core.approvals import ApprovalStatus
        from sandfleet.producer.approvals import decide

        if not reason.strip():
            raise InvalidSpecError("a denial needs a reason (the program and the audit show it)")
        return decide(
            self, request_id, ApprovalStatus.DENIED, by=by, reason=reason, key=key, unsigned=unsigned
        )

    # -- verifying ----------------------------------------------------------------------------
    def key_ring(self) -> KeyRing:
        """The public keys to verify with: the pinned key set (``SANDFLEET_TRUSTED_KEYS``) plus the
        revocations registered in Redis, or else the fleet's key register in Redis (not pinned)."""
        with self.redis_errors():
            return verification_ring(self.settings, self.registry)

    def verify_jobs(
        self, job_ids: list[str], ring: KeyRing | None = None, submitted: dict[str, str] | None = None
    ) -> BatchVerdict:
        """Verdicts of ``job_ids`` (read in one snapshot), in that order; each also checked against the
        spec submitted (``submitted``: job id -> spec SHA-256; default: what the ledger holds)."""
        with self.redis_errors():
            evidences = [self.with_artifact_digests(e) for e in self.reader.evidence_many(job_ids)]
        digests = self.submitted_specs(job_ids) if submitted is None else submitted
        ring = ring or self.key_ring()
        began = time.perf_counter()
        verdicts = [checked_verdict(e, ring, digests.get(e.job_id)) for e in evidences]
        return BatchVerdict(verdicts=verdicts, seconds=time.perf_counter() - began)

    def with_artifact_digests(self, evidence: JobEvidence) -> JobEvidence:
        """``evidence`` with the digests of its artifacts' stored bytes, so verifying checks them too."""
        return with_artifact_digests(evidence, self.artifact_store)

    def export_bundle(self, job_ids: list[str], path: Path) -> BatchVerdict:
        """Write the jobs' records, audit entries and the public keys to ``path`` (``sandfleet audit
        --verify-file`` checks it offline); returns their verdicts at export time."""
        with self.redis_errors():
            evidences = self.reader.evidence_many(job_ids)
        ring = self.key_ring()
        write_bundle(path, evidences, ring, self.settings.key_prefix)
        return verify_jobs(evidences, ring)

    # -- internals ----------------------------------------------------------------------------
    def redis_errors(self) -> AbstractContextManager[None]:
        """Redis failures become QueueUnavailableError with a message that says what to check."""
        return redis_errors(self.redis_url)

    def _remember(self, jobs: list[tuple[str, JobSpec]]) -> dict[str, str]:
        """Note the digest of each job's spec in the ledger (before anything is enqueued); job id -> it."""
        digests = {job_id: spec_commitment(spec)[1] for job_id, spec in jobs}
        if self.ledger is not None:
            self.ledger.remember(digests.items())
        return digests

    def _record_queued(self, jobs: list[tuple[str, JobSpec]]) -> None:
        """Write the queued records of ``jobs`` in one step: all or nothing (a batch another submitter
        created is refused with BatchOwnerError, nothing written)."""
        token = self.submitter_token() if any(spec.batch_id for _, spec in jobs) else None
        try:
            self.store.record_queued(jobs, token)
        except redis.RedisError as e:  # the script refuses its first write: nothing was applied
            raise QueueUnavailableError(
                f"{describe_redis_error(self.redis_url, e)}; nothing was enqueued"
            ) from e

    def _publish(self, jobs: list[tuple[str, JobSpec]]) -> None:
        """Publish one message per job; on failure withdraw the records of those not published."""
        try:
            self.publisher.send_all(jobs)
        except PublishError as e:
            self.store.withdraw(jobs[e.sent :])
            what = (
                "nothing was enqueued"
                if e.sent == 0
                else (
                    f"{e.sent} of {len(jobs)} jobs were enqueued and will run; the other {len(jobs) - e.sent} were withdrawn"
                )
            )
            cause = e.__cause__ or e
            raise QueueUnavailableError(f"{describe_redis_error(self.redis_url, cause)}; {what}") from cause


def with_priority(spec: JobSpec, default: int) -> JobSpec:
    """``spec`` with its priority set (``default`` when it has none), so its record shows it."""
    return spec if spec.priority is not None else spec.model_copy(update={"priority": default})


def new_job_id() -> str:
    return str(uuid.uuid4())


def new_batch_id() -> str:
    return f"batch-{uuid.uuid4().hex[:12]}"
