"""What one delivery of ``sandfleet.run_job`` does, as an object: :class:`Delivery`.

Plain Python, callable without Celery: the task (task.py) builds a :class:`Message` from what the
broker delivered and a :class:`DeliveryServices` from the process's
:class:`~sandfleet.worker.delivery.state.WorkerState`, and runs ``Delivery(services, message).run()``.
Every job is assumed to run more than once: the job id is the idempotency key, and the store writes
exactly one final record however many deliveries race.

One delivery:
1. count it, and read the job's record, once (every later step, and the hooks, use that copy);
2. drop it if the job already ended (a duplicate), has no record (withdrawn, expired, forged),
   awaits an approval, or runs right now here or on another live worker;
3. end the job unrun if it has a cancel request, was delivered more than ``Settings.max_deliveries``
   times (it killed its worker each time), or its spec is invalid (refused);
4. mark it running and run the engine; write its JobResult as the final record, sealing the job's
   audit chain with the worker's signature in the same step.

Cancel: a job with a cancel request (sandfleet/core/cancel.py) is ended ``cancelled`` before it
starts; while it runs, its cancel token (sandfleet/worker/cancel/) kills its sandboxes and makes the
engine unwind, and it ends ``cancelled`` with what it had done. Every final record goes through one
path, :class:`~sandfleet.worker.delivery.job_end.JobEnd`, whose hooks run around it.

Every audit event and final record is signed with the worker's key (``store.signer``), so a store
without one refuses to run a delivery.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from celery.exceptions import SoftTimeLimitExceeded
from pydantic import ValidationError

from sandfleet.core.audit import RedisAuditSink
from sandfleet.core.cancel import CancelRequests
from sandfleet.core.chain import sha256_hex
from sandfleet.core.contracts import (
    AuditKind,
    ErrorInfo,
    ErrorKind,
    JobResult,
    JobSpec,
    JobStatus,
    describe_validation_error,
)
from sandfleet.core.errors import (
    JobCancelledError,
    ModelUnavailableError,
    ToolServerUnavailableError,
    TransientError,
)
from sandfleet.core.records import JobRecord
from sandfleet.core.redis_keys import check_id
from sandfleet.core.store import JobStore, Transition
from sandfleet.worker.approval.checkpoint import JobSuspended
from sandfleet.worker.approval.suspend import suspend_job
from sandfleet.worker.cancel.scope import CancelToken, RunningScopes
from sandfleet.worker.delivery.job_end import JobEnd, JobEnding, error_result

log = logging.getLogger(__name__)

# run(spec, job_id, audit) -> JobResult: the engine, bound to the worker process's services.
JobRunner = Callable[[JobSpec, str, RedisAuditSink], JobResult]


def _nowhere_else(job_id: str, worker: str) -> bool:
    return False


@dataclass(frozen=True)
class Message:
    """One delivery of a job's message, as the task received it.

    ``retries``: the engine's transient retries spent before this delivery (Redis retries not
    counted); on the ``last_try`` a transient failure ends the job failed instead of retrying.
    ``message_retries``: Celery's count of retries behind this message, Redis's included (each
    retry is a new message, whose delivery count starts again); ``retries`` when not given.
    ``running_here``: another delivery of the job runs in this process (both may have read it
    queued before either marked it running): this one is dropped.
    """

    job_id: str
    spec_data: Any
    retries: int = 0
    last_try: bool = True
    running_here: bool = False
    message_retries: int | None = None


@dataclass(frozen=True)
class DeliveryServices:
    """What every delivery in one worker process shares.

    ``run`` is the engine; ``job_end`` writes every final record and runs the job-end hooks;
    ``scopes`` holds each running delivery's cancel token for the process's cancel watcher.
    ``running_elsewhere(job_id, worker)`` says whether the job runs right now on that (live) worker:
    a duplicate delivered meanwhile is then dropped, and a job whose worker died is run again.
    ``republish`` publishes a suspended job at once if its approval was decided meanwhile.
    ``worker`` is this worker's name (the store's signer's when empty).
    """

    store: JobStore
    run: JobRunner
    job_end: JobEnd = field(default_factory=JobEnd)
    scopes: RunningScopes = field(default_factory=RunningScopes)
    running_elsewhere: Callable[[str, str], bool] = _nowhere_else
    republish: Callable[[str], Any] | None = None
    worker: str = ""


class Delivery:
    """The state of one delivery: its message, the job's record (read once), its count and chain."""

    def __init__(self, services: DeliveryServices, message: Message) -> None:
        store = services.store
        self.services = services
        self.message = message
        self.store = store
        self.job_id = message.job_id
        self.worker = services.worker or (store.signer.worker if store.signer else "")
        self.cancels = CancelRequests(store.redis, store.keys, store.settings.retention_s)
        self.record: JobRecord | None = None  # read once, by _admit
        self.deliveries = 0
        self.ending: JobEnding | None = None  # once this delivery ended the job

    def run(self) -> JobStatus | None:
        """Handle the delivery; returns the status it recorded (None: nothing to do).

        Raises:
            TransientError: infrastructure failed and this is not the last try; the record is back
                to queued and the caller should retry later. On the last try the job is recorded failed.
            redis.RedisError: the records cannot be written; the caller should retry the delivery.
        """
        if not self._admit():
            return None
        # The cancel token is open before the one look at the cancel key: a request made before the
        # look is seen by it, one made after is heard by the cancel watcher, which cancels the token
        # (so the model call and the program's run refuse to start).
        with self.services.scopes.open(self.job_id) as token:
            started = self._start()
            if not isinstance(started, tuple):
                return started
            spec, audit = started
            outcome = self._call_engine(spec, audit, token)
        return self._settle(spec, audit, token, outcome)

    def _start(self) -> tuple[JobSpec, RedisAuditSink] | JobStatus | None:
        """End the job unrun (cancelled, crash loop, invalid spec: its status) or mark it running
        (its spec and audit sink; None when another delivery ended or took it meanwhile)."""
        request = self.cancels.requested(self.job_id)
        if request is not None:  # cancelled while queued, or while a worker that died ran it
            return self._end_with_error(
                JobStatus.CANCELLED, ErrorKind.CANCELLED, f"{request.describe()} before it started"
            )
        max_deliveries = self.store.settings.max_deliveries
        if self.deliveries > max_deliveries:
            message = f"stopped after {max_deliveries} deliveries: the job killed its worker each time"
            return self._end_with_error(JobStatus.FAILED, ErrorKind.CRASH_LOOP, message)
        try:
            spec = JobSpec.model_validate(self.message.spec_data)
        except ValidationError as e:
            message = f"invalid job spec: {describe_validation_error(e)}"
            return self._end_with_error(JobStatus.REFUSED, ErrorKind.INVALID_SPEC, message)
        record = self.record  # read by _admit just now: its batch never changes, its tip is a guess
        batch_id = record.batch_id or "" if record else None
        if self.store.mark_running(self.job_id, self.worker, batch_id=batch_id) != Transition.APPLIED:
            return None
        audit = self.store.audit_sink(self.job_id, head=record.audit_head if record else None)
        audit.emit(AuditKind.STATE, self._running_event(spec))
        return spec, audit

    # -- 1-2: admit or drop -----------------------------------------------------------------------

    def _admit(self) -> bool:
        """Count the delivery and read the record; False (noted, logged) when it is to be dropped."""
        store, job_id, message = self.store, self.job_id, self.message
        retries = message.retries if message.message_retries is None else message.message_retries
        try:
            check_id(job_id)
        except ValueError as e:
            store.record_rejected("bad job id", job_id=job_id, error=str(e))
            return False
        self.deliveries = store.count_delivery(job_id, retries)
        record = self.record = store.record(job_id)
        if record is None:
            store.record_rejected("no job record", job_id=job_id, retries=retries)
            log.warning(
                "job %s: no record (withdrawn, expired or never submitted): message discarded", job_id
            )
            return False
        if record.status.is_final:
            log.info("job %s: duplicate delivery, it already ended %s", job_id, record.status)
            return False
        if record.status == JobStatus.AWAITING_APPROVAL:
            store.record_rejected("delivery while the job awaits approval", job_id=job_id)
            log.info(
                "job %s: delivered while it awaits an approval: dropped (its decision resumes it)", job_id
            )
            return False
        return not self._running_already(record)

    def _running_already(self, record: JobRecord) -> bool:
        """Whether the job runs right now in this process or on another live worker (noted if so)."""
        job_id = self.job_id
        if self.message.running_here:
            self.store.record_rejected(
                "duplicate delivery while the job runs", job_id=job_id, worker=self.worker
            )
            log.info("job %s: duplicate delivery while it runs in this process: dropped", job_id)
            return True
        elsewhere = self.services.running_elsewhere
        if record.status == JobStatus.RUNNING and record.worker and elsewhere(job_id, record.worker):
            self.store.record_rejected(
                "duplicate delivery while the job runs", job_id=job_id, worker=record.worker
            )
            log.info("job %s: duplicate delivery while it runs on %s: dropped", job_id, record.worker)
            return True
        return False

    def _running_event(self, spec: JobSpec) -> dict[str, Any]:
        return {
            "status": "running",
            "worker": self.worker,
            "delivery": self.deliveries,
            "retries": self.message.retries,
            "spec_sha256": sha256_hex(spec.model_dump_json()),
        }

    # -- 4: run the engine ------------------------------------------------------------------------

    def _settle(
        self,
        spec: JobSpec,
        audit: RedisAuditSink,
        token: CancelToken,
        outcome: JobResult | JobStatus | None,
    ) -> JobStatus | None:
        """End the job with what the engine returned (cancelled if its token was)."""
        if token.cancelled and not isinstance(outcome, JobStatus):
            outcome = self._cancelled(spec, token, outcome, audit)
        if outcome is None:  # the engine unwound as if cancelled, yet no cancel reached this job
            message = "the engine stopped without a result and the job was not cancelled"
            return self._end_with_error(JobStatus.FAILED, ErrorKind.INTERNAL, message)
        if isinstance(outcome, JobResult):
            return self._end(outcome, audit)  # the seal: one per job, whoever finishes first
        return outcome

    def _call_engine(
        self, spec: JobSpec, audit: RedisAuditSink, token: CancelToken
    ) -> JobResult | JobStatus | None:
        """The engine's result; or the status the job was ended or suspended with here; or None when
        it unwound on a cancel (a sandbox killed under a cancel may raise anything)."""
        try:
            return self.services.run(spec, self.job_id, audit)
        except JobCancelledError:
            return None  # the engine unwound on the cancel: ended by the caller
        except JobSuspended as e:  # a call waits for a person: the job waits in Redis, not here
            if token.cancelled:
                return None
            return suspend_job(self.store, self.job_id, e.checkpoint, audit, self.services.republish)
        except TransientError as e:
            return None if token.cancelled else self._retry_or_fail(e, audit)
        except SoftTimeLimitExceeded:
            if token.cancelled:
                return None
            return self._end_with_error(
                JobStatus.TIMED_OUT, ErrorKind.TIME_LIMIT, "the job passed its soft time limit"
            )
        except redis.RedisError:
            raise  # the records cannot be written: the task retries the delivery (not a job failure)
        except Exception as e:
            if token.cancelled:
                return None
            log.exception("job %s: the engine raised", self.job_id)
            return self._end_with_error(JobStatus.FAILED, ErrorKind.INTERNAL, f"{type(e).__name__}: {e}")

    def _retry_or_fail(self, error: TransientError, audit: RedisAuditSink) -> JobStatus:
        """On the last try, end the job failed naming what was unavailable; before it, put the job
        back to queued and raise ``error`` again for the task to retry."""
        what, kind = _unavailable(error)
        retries = self.message.retries
        if self.message.last_try:
            return self._end_with_error(JobStatus.FAILED, kind, f"{what}: {error} (after {retries} retries)")
        audit.emit(AuditKind.STATE, {"status": "queued", "retry": retries + 1, "error": f"{what}: {error}"})
        self.store.mark_queued(self.job_id)
        raise error

    # -- ending -----------------------------------------------------------------------------------

    def _end(self, result: JobResult, audit: RedisAuditSink | None = None) -> JobStatus:
        """Write the final record through the job-end path (a late duplicate writes nothing);
        ``audit``: the job's sink, whose last tip the seal links to first (one read fewer)."""
        self.ending = JobEnding(
            self.store,
            self.job_id,
            result,
            worker=self.worker,
            record=self.record,
            head=audit.head if audit is not None else None,
        )
        self.services.job_end.finish(self.ending)
        return result.status

    def _end_with_error(self, status: JobStatus, kind: ErrorKind, message: str) -> JobStatus:
        return self._end(error_result(self.job_id, status, kind, message))

    def _cancelled(
        self, spec: JobSpec, token: CancelToken, result: JobResult | None, audit: RedisAuditSink
    ) -> JobResult:
        """The final result of a job stopped while it ran: what the engine returned, if it did (its
        attempts and token usage), with status and error saying it was cancelled. Emits the CANCEL event."""
        request = token.request
        stopped_s = time.monotonic() - token.cancelled_at if token.cancelled_at is not None else 0.0
        audit.emit(
            AuditKind.CANCEL,
            {
                "requested_at": request.requested_at if request else None,
                "by": request.by if request else "",
                "sandboxes_destroyed": list(token.killed),
                "model_calls_abandoned": token.abandoned_model_calls,
                "unwound_s": round(stopped_s, 4),
            },
        )
        message = f"{request.describe() if request else 'cancelled'} while it ran"
        error = ErrorInfo(kind=ErrorKind.CANCELLED, message=message)
        if result is not None:
            return result.model_copy(update={"status": JobStatus.CANCELLED, "error": error})
        model = spec.model or self.store.settings.model
        return JobResult(
            job_id=self.job_id, status=JobStatus.CANCELLED, error=error, model=model, mode=spec.mode
        )


def _unavailable(error: TransientError) -> tuple[str, ErrorKind]:
    """What was unavailable, in words and as the error kind recorded when retries run out."""
    if isinstance(error, ModelUnavailableError):
        return "model unavailable", ErrorKind.MODEL_UNAVAILABLE
    if isinstance(error, ToolServerUnavailableError):
        return "tool server unavailable", ErrorKind.TOOL_SERVER_UNAVAILABLE
    return "sandbox unavailable", ErrorKind.SANDBOX_UNAVAILABLE
