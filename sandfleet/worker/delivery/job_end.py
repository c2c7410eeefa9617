"""The one path by which a worker ends a job, and the hooks that run when a job ends.

Every final record a worker writes (succeeded, failed, timed out, refused, cancelled, crash loop)
goes through :meth:`JobEnd.finish`: the store writes it with the chain's seal (the first final write
wins, :meth:`~sandfleet.core.store.JobStore.finish`), then each hook registered with
:meth:`JobEnd.on_job_end` is called with the job id and the status the job now has.

Hooks are for what must be undone when a job ends for any reason: the cancel machinery settles the
job's pending request; the approvals helper withdraws the job's pending approval requests. A hook
runs in the thread that ended the job, is called also when another writer ended it first (so it must
be idempotent), and must not raise: an exception is logged and the next hook still runs.

Two more kinds of hook, for what reports on ended jobs: ``before_seal`` hooks run just before the
final record is written (the completion webhooks commit their POSTs in the chain there), and
``on_recorded`` hooks only after a write that was the job's final record, with its result (metrics
and webhooks, so a late duplicate is never counted or sent twice).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sandfleet.core.contracts import ErrorInfo, JobResult, JobStatus
from sandfleet.core.store import JobStore, Transition

log = logging.getLogger("sandfleet.worker")

# hook(job_id, status): the job has ended with ``status`` (None when its record could not be read).
JobEndHook = Callable[[str, JobStatus | None], None]
# hook(store, job_id, result): the final record is about to be written (nothing of it yet): the
# completion webhooks commit what they will send in the chain the seal then closes.
BeforeSealHook = Callable[[JobStore, str, JobResult], None]
# hook(store, job_id, result): this process's write was the job's final record (never for a late
# duplicate): what counts ended jobs (metrics) and sends what before_seal committed (webhooks).
RecordedHook = Callable[[JobStore, str, JobResult], None]


class JobEnd:
    """Final records and the on-job-end hooks of one worker process. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: list[JobEndHook] = []
        self._before_seal: list[BeforeSealHook] = []
        self._recorded: list[RecordedHook] = []

    def on_job_end(self, hook: JobEndHook) -> JobEndHook:
        """Call ``hook(job_id, status)`` after each job this process ends (usable as a decorator)."""
        with self._lock:
            self._hooks.append(hook)
        return hook

    def before_seal(self, hook: BeforeSealHook) -> BeforeSealHook:
        """Call ``hook(store, job_id, result)`` just before each final record is written."""
        with self._lock:
            self._before_seal.append(hook)
        return hook

    def on_recorded(self, hook: RecordedHook) -> RecordedHook:
        """Call ``hook(store, job_id, result)`` after each final record this process wrote (not duplicates)."""
        with self._lock:
            self._recorded.append(hook)
        return hook

    def finish(self, store: JobStore, job_id: str, result: JobResult, *, worker: str = "") -> Transition:
        """Write the job's final record (unless it has one), then run the hooks."""
        self._run(self._before_seal, store, job_id, result)
        outcome = store.finish(job_id, result, worker=worker)
        if outcome == Transition.APPLIED:
            self._run(self._recorded, store, job_id, result)
            self.ended(job_id, result.status)
        elif outcome == Transition.ALREADY_FINAL:
            self.ended(job_id, _status_or_none(store, job_id))
        return outcome

    def finish_with_error(
        self, store: JobStore, job_id: str, status: JobStatus, kind: str, message: str, **kw: Any
    ) -> Transition:
        """A final record that carries only an error (refused, crash loop, retries exhausted, cancelled)."""
        result = JobResult(job_id=job_id, status=status, error=ErrorInfo(kind=kind, message=message))
        return self.finish(store, job_id, result, **kw)

    def _run(self, hooks: list[Any], store: JobStore, job_id: str, result: JobResult) -> None:
        with self._lock:
            hooks = list(hooks)
        for hook in hooks:
            try:
                hook(store, job_id, result)
            except Exception:
                log.exception("a job-end hook failed for job %s", job_id)

    def ended(self, job_id: str, status: JobStatus | None) -> None:
        """Run every hook for a job that has ended. Never raises."""
        with self._lock:
            hooks = list(self._hooks)
        for hook in hooks:
            try:
                hook(job_id, status)
            except Exception:
                log.exception("an on-job-end hook failed for job %s", job_id)


def _status_or_none(store: JobStore, job_id: str) -> JobStatus | None:
    try:
        return store.status(job_id)
    except Exception:  # the hooks still run: they only need the id
        return None
