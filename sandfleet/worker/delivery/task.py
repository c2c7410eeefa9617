"""The Celery task ``sandfleet.run_job`` and what one delivery of it does.

The task is thin: :func:`register_task` adds it to the worker's app; it hands the message to
:func:`run_delivery` (plain Python, callable without Celery) with the process's
:class:`~sandfleet.worker.delivery.state.WorkerState`, and turns a transient failure into ``self.retry``
with exponential backoff. Every job is
assumed to run more than once: the job id is the idempotency key, and the store writes exactly one
final record however many deliveries race.

One delivery:
1. count it; a message delivered more than ``Settings.max_deliveries`` times killed its worker
   each time: record the job failed and stop;
2. skip it if the job already ended (a duplicate) or has no record (withdrawn, expired, forged);
3. validate the spec (an invalid one is recorded refused), mark the job running;
4. run the engine; write its JobResult as the final record, sealing the job's audit chain with the
   worker's signature in the same step (:meth:`JobStore.finish`).

Cancel: a job with a cancel request (sandfleet/core/cancel.py) is ended ``cancelled`` before it
starts; while it runs, its cancel token (sandfleet/worker/cancel/) kills its sandboxes and makes the engine
unwind, and it ends ``cancelled`` with what it had done. Every final record goes through one path,
:class:`~sandfleet.worker.delivery.job_end.JobEnd`, whose on-job-end hooks run after it.

Every audit event and final record is signed with the worker's key (``store.signer``), so a store
without one refuses to run a delivery.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery
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
from sandfleet.core.queue import TASK_NAME
from sandfleet.core.redis_keys import check_id
from sandfleet.core.settings import (
    DEFAULT_TRANSIENT_BACKOFF_MAX_S,
    DEFAULT_TRANSIENT_BACKOFF_S,
    DEFAULT_TRANSIENT_RETRIES,
)
from sandfleet.core.store import JobStore, Transition
from sandfleet.worker.approval.checkpoint import JobSuspended
from sandfleet.worker.approval.suspend import suspend_job
from sandfleet.worker.cancel.scope import CancelToken, RunningScopes
from sandfleet.worker.delivery.flower_report import report_delivery
from sandfleet.worker.delivery.job_end import JobEnd
from sandfleet.worker.delivery.state import JobRunner, WorkerState

log = logging.getLogger(__name__)


def compute_backoff(
    retries: int, base_s: float = DEFAULT_TRANSIENT_BACKOFF_S, max_s: float = DEFAULT_TRANSIENT_BACKOFF_MAX_S
) -> float:
    """Seconds to wait before retry number ``retries + 1``: base, 2 x base, 4 x base ... capped."""
    return min(max_s, base_s * 2 ** max(0, retries))


def run_delivery(
    store: JobStore,
    job_id: str,
    spec_data: Any,
    *,
    run: JobRunner,
    retries: int = 0,
    last_try: bool = True,
    worker: str = "",
    running_elsewhere: Callable[[str, str], bool] = lambda job_id, worker: False,
    job_end: JobEnd | None = None,
    scopes: RunningScopes | None = None,
    republish: Callable[[str], Any] | None = None,
    running_here: bool = False,
) -> JobStatus | None:
    """Handle one delivery of a job's message; returns the status it recorded (None: nothing to do).

    ``job_end`` writes every final record and runs the on-job-end hooks; ``scopes`` holds the cancel
    token of the delivery while the engine runs, for the process's cancel watcher (both fresh when
    not given).

    ``running_elsewhere(job_id, worker)`` says whether the job is running right now on that (live)
    worker: a duplicate delivered meanwhile is then dropped instead of running the job twice. A job
    whose worker died is run again. ``running_here``: another delivery of the job runs in this process
    (both may have read it queued before either marked it running): this one is dropped. A job suspended waiting for an approval is not run (its decision
    publishes it again); a run that stops to wait suspends the job, and ``republish`` publishes it at
    once if a decision came meanwhile.

    Raises:
        TransientError: infrastructure failed and ``last_try`` is false; the record is back to
            queued and the caller should retry later. On the last try the job is recorded failed.
        redis.RedisError: the records cannot be written; the caller should retry the delivery.
    """
    settings = store.settings
    worker = worker or (store.signer.worker if store.signer else "")
    job_end = job_end or JobEnd()
    scopes = scopes or RunningScopes()
    cancels = CancelRequests(store.redis, store.keys, settings.retention_s)
    try:
        check_id(job_id)
    except ValueError as e:
        store.record_rejected("bad job id", job_id=job_id, error=str(e))
        return None
    deliveries = store.count_delivery(job_id, retries)
    record = store.record(job_id)
    if record is None:
        store.record_rejected("no job record", job_id=job_id, retries=retries)
        log.warning("job %s: no record (withdrawn, expired or never submitted): message discarded", job_id)
        return None
    if record.status.is_final:
        log.info("job %s: duplicate delivery, it already ended %s", job_id, record.status)
        return None
    if record.status == JobStatus.AWAITING_APPROVAL:
        store.record_rejected("delivery while the job awaits approval", job_id=job_id)
        log.info("job %s: delivered while it awaits an approval: dropped (its decision resumes it)", job_id)
        return None
    if running_here:
        store.record_rejected("duplicate delivery while the job runs", job_id=job_id, worker=worker)
        log.info("job %s: duplicate delivery while it runs in this process: dropped", job_id)
        return None
    if record.status == JobStatus.RUNNING and record.worker and running_elsewhere(job_id, record.worker):
        store.record_rejected("duplicate delivery while the job runs", job_id=job_id, worker=record.worker)
        log.info("job %s: duplicate delivery while it runs on %s: dropped", job_id, record.worker)
        return None
    audit = store.audit_sink(job_id)

    def finish(status: JobStatus, kind: ErrorKind, message: str) -> JobStatus:
        job_end.finish_with_error(
            store, job_id, status, kind, message, worker=worker
        )  # a late duplicate writes nothing
        return status

    request = cancels.requested(job_id)
    if request is not None:  # cancelled while queued, or while a worker that died ran it
        return finish(JobStatus.CANCELLED, ErrorKind.CANCELLED, f"{request.describe()} before it started")
    if deliveries > settings.max_deliveries:
        message = f"stopped after {settings.max_deliveries} deliveries: the job killed its worker each time"
        return finish(JobStatus.FAILED, ErrorKind.CRASH_LOOP, message)
    try:
        spec = JobSpec.model_validate(spec_data)
    except ValidationError as e:
        return finish(
            JobStatus.REFUSED, ErrorKind.INVALID_SPEC, f"invalid job spec: {describe_validation_error(e)}"
        )
    if store.mark_running(job_id, worker) != Transition.APPLIED:
        return None
    audit.emit(
        AuditKind.STATE,
        {
            "status": "running",
            "worker": worker,
            "delivery": deliveries,
            "retries": retries,
            "spec_sha256": sha256_hex(spec.model_dump_json()),
        },
    )
    result: JobResult | None = None
    with scopes.open(job_id) as token:
        request = cancels.requested(job_id)  # asked for between the first look and the scope opening
        if request is not None:
            return finish(JobStatus.CANCELLED, ErrorKind.CANCELLED, f"{request.describe()} before it started")
        try:
            result = run(spec, job_id, audit)
        except JobCancelledError:
            pass  # the engine unwound on the cancel: ended below
        except JobSuspended as e:  # a call waits for a person: the job waits in Redis, not here
            if not token.cancelled:
                return suspend_job(store, job_id, e.checkpoint, audit, republish)
        except TransientError as e:
            if not token.cancelled:
                what, kind = _unavailable(e)
                if last_try:
                    return finish(JobStatus.FAILED, kind, f"{what}: {e} (after {retries} retries)")
                audit.emit(
                    AuditKind.STATE, {"status": "queued", "retry": retries + 1, "error": f"{what}: {e}"}
                )
                store.mark_queued(job_id)
                raise
        except SoftTimeLimitExceeded:
            if not token.cancelled:
                return finish(JobStatus.TIMED_OUT, ErrorKind.TIME_LIMIT, "the job passed its soft time limit")
        except redis.RedisError:
            raise  # the records cannot be written: the task retries the delivery (not a job failure)
        except Exception as e:
            if not token.cancelled:  # a sandbox killed under a cancel may raise anything
                log.exception("job %s: the engine raised", job_id)
                return finish(JobStatus.FAILED, ErrorKind.INTERNAL, f"{type(e).__name__}: {e}")
    if token.cancelled:
        result = _cancelled(job_id, spec.model or settings.model, token, result, audit, spec)
    assert result is not None
    job_end.finish(store, job_id, result, worker=worker)  # the seal: one per job, whoever finishes first
    return result.status


def _cancelled(
    job_id: str,
    model: str,
    token: CancelToken,
    result: JobResult | None,
    audit: RedisAuditSink,
    spec: JobSpec,
) -> JobResult:
    """The final result of a job stopped while it ran: what the engine returned, if it did (its
    attempts and token usage), with status and error saying it was cancelled. Emits the CANCEL event."""
    request = token.request
    by = request.by if request else ""
    stopped_s = time.monotonic() - token.cancelled_at if token.cancelled_at is not None else 0.0
    audit.emit(
        AuditKind.CANCEL,
        {
            "requested_at": request.requested_at if request else None,
            "by": by,
            "sandboxes_destroyed": list(token.killed),
            "model_calls_abandoned": token.abandoned_model_calls,
            "unwound_s": round(stopped_s, 4),
        },
    )
    message = f"{request.describe() if request else 'cancelled'} while it ran"
    error = ErrorInfo(kind=ErrorKind.CANCELLED, message=message)
    if result is not None:
        return result.model_copy(update={"status": JobStatus.CANCELLED, "error": error})
    return JobResult(job_id=job_id, status=JobStatus.CANCELLED, error=error, model=model, mode=spec.mode)


def _unavailable(error: TransientError) -> tuple[str, ErrorKind]:
    """What was unavailable, in words and as the error kind recorded when retries run out."""
    if isinstance(error, ModelUnavailableError):
        return "model unavailable", ErrorKind.MODEL_UNAVAILABLE
    if isinstance(error, ToolServerUnavailableError):
        return "tool server unavailable", ErrorKind.TOOL_SERVER_UNAVAILABLE
    return "sandbox unavailable", ErrorKind.SANDBOX_UNAVAILABLE


def register_task(app: Celery, state: WorkerState) -> None:
    """Add ``sandfleet.run_job`` to the worker's app; it runs each delivery with ``state``."""

    # shared=False: the task belongs to this app (and its state) only, not to every app made later.
    @app.task(name=TASK_NAME, bind=True, max_retries=DEFAULT_TRANSIENT_RETRIES, shared=False)
    def run_job_task(self: Any, job_id: str, spec: Any) -> dict[str, Any]:
        """Run one job; returns ``{"job_id", "status", "result"}`` for Flower, or tells Flower the job
        did not succeed and raises Ignore (sandfleet/worker/delivery/flower_report.py). The record has the rest."""
        settings = state.settings
        retries = self.request.retries
        backoff = compute_backoff(retries, settings.transient_backoff_s, settings.transient_backoff_max_s)
        try:
            with state.running.running(job_id) as first_here:
                status = run_delivery(
                    state.store,
                    job_id,
                    spec,
                    run=lambda s, j, a: state.engine()(s, j, a),
                    retries=retries,
                    last_try=retries >= settings.transient_retries,
                    worker=self.request.hostname or "",
                    running_elsewhere=state.running_elsewhere,
                    job_end=state.job_end,
                    scopes=state.scopes,
                    republish=state.republish,
                    running_here=not first_here,
                )
        except TransientError as e:
            raise self.retry(exc=e, countdown=backoff, max_retries=settings.transient_retries) from e
        except redis.RedisError as e:
            # The records cannot be written (Redis restarting, full): run the job again later rather than
            # acknowledge a message whose job has no final record. Not counted against the engine's retries.
            log.warning("job %s: Redis failed (%s); retrying the delivery later", job_id, e)
            raise self.retry(exc=e, countdown=backoff, max_retries=retries + 1) from e
        return report_delivery(self, state.store, job_id, status)
