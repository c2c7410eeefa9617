"""The one path by which a worker ends a job, and the one interface of what runs when a job ends.

Every final record a worker writes (succeeded, failed, timed out, refused, cancelled, crash loop)
goes through :meth:`JobEnd.finish` with a :class:`JobEnding`: the store writes it with the chain's
seal (the first final write wins, :meth:`~sandfleet.core.store.JobStore.finish`), and each
:class:`JobEndHook` added with :meth:`JobEnd.add` is called at three points, like dramatiq's
middleware (``dramatiq/middleware/middleware.py``), every method a no-op unless overridden:

- ``before_seal``: the final record is about to be written (nothing of it yet); the completion
  webhooks commit their POSTs in the chain the seal then closes;
- ``on_recorded``: this process's write was the job's final record, never for a late duplicate
  (so the metrics never count, nor the webhooks send, one job twice);
- ``on_end``: the job has ended, whoever wrote its record (so a hook must be idempotent): the
  cancel machinery settles the job's request; the Flower report notes the outcome.

The implementations: :class:`~sandfleet.worker.delivery.state.CancelCleanup`,
:class:`~sandfleet.worker.delivery.reporting.MetricsHook` and ``WebhookHook``, and
:class:`~sandfleet.worker.delivery.flower_report.FlowerReport`. A hook runs in the thread that ended
the job and must not raise: an exception is logged and the next hook still runs.

The store has no final write of its own that skips the hooks: an error-only ending is a
:func:`error_result` finished here like any other.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TypeVar

from sandfleet.core.contracts import ErrorInfo, JobResult, JobStatus
from sandfleet.core.records import JobRecord
from sandfleet.core.store import JobStore, Transition

log = logging.getLogger("sandfleet.worker")


def error_result(job_id: str, status: JobStatus, kind: str, message: str) -> JobResult:
    """A final result that carries only an error (refused, crash loop, retries exhausted, cancelled)."""
    return JobResult(job_id=job_id, status=status, error=ErrorInfo(kind=kind, message=message))


@dataclass
class JobEnding:
    """One job's end as the hooks see it: the result to write and what the ender knew of the job.

    ``record`` is the job's record as its delivery read it, once, at its start (spec, batch, queued
    stamp); None when the ender had none (the cancel watcher ending a queued job): then
    :meth:`known_record` reads it on first use. ``head`` is the chain's tip as the ender last wrote
    it, if it did (a guess the seal's compare-and-set checks: saves reading it). :meth:`JobEnd.finish`
    sets ``outcome`` and ``status`` (the job's status now: this result's, or the earlier writer's).
    """

    store: JobStore
    job_id: str
    result: JobResult
    worker: str = ""
    record: JobRecord | None = None
    head: str | None = None
    outcome: Transition | None = None
    status: JobStatus | None = None
    _final: JobRecord | None = field(default=None, repr=False)

    def known_record(self) -> JobRecord | None:
        """The record as the ender knew it (read now, once, if it had none)."""
        if self.record is None:
            self.record = self.store.record(self.job_id)
        return self.record

    def final_record(self) -> JobRecord | None:
        """The job's record after its end, read back once and shared by every hook that needs its
        stamps (the metrics' queue wait) or another writer's result (a late duplicate)."""
        if self._final is None:
            self._final = self.store.record(self.job_id)
        return self._final


class JobEndHook:
    """What runs when a job ends; override any of the three (see the module docstring)."""

    def before_seal(self, ending: JobEnding) -> None:
        """The final record is about to be written."""

    def on_recorded(self, ending: JobEnding) -> None:
        """This process's write was the job's final record (``ending.result``)."""

    def on_end(self, ending: JobEnding) -> None:
        """The job has ended with ``ending.status`` (None when its record could not be read)."""


HookT = TypeVar("HookT", bound=JobEndHook)


class JobEnd:
    """Final records and the job-end hooks of one worker process. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hooks: list[JobEndHook] = []

    def add(self, hook: HookT) -> HookT:
        """Run ``hook`` at each job end from now on, after the hooks added before it."""
        with self._lock:
            self._hooks.append(hook)
        return hook

    def finish(self, ending: JobEnding) -> Transition:
        """Write the job's final record (unless it has one), then run the hooks."""
        hooks = self._snapshot()
        _call(hooks, "before_seal", ending)
        store, job_id, result = ending.store, ending.job_id, ending.result
        known = ending.record  # the delivery's copy: its batch, which never changes, saves a read
        batch_id = None if known is None else known.batch_id or ""
        ending.outcome = store.finish(
            job_id, result, worker=ending.worker, batch_id=batch_id, head=ending.head
        )
        if ending.outcome == Transition.APPLIED:
            ending.status = result.status
            _call(hooks, "on_recorded", ending)
            _call(hooks, "on_end", ending)
        elif ending.outcome == Transition.ALREADY_FINAL:
            ending.status = _status_or_none(ending)
            _call(hooks, "on_end", ending)
        return ending.outcome

    def _snapshot(self) -> list[JobEndHook]:
        with self._lock:
            return list(self._hooks)


def _call(hooks: list[JobEndHook], point: str, ending: JobEnding) -> None:
    """Call each hook's method ``point``; one that raises is logged and the next still runs."""
    for hook in hooks:
        try:
            getattr(hook, point)(ending)
        except Exception:
            log.exception("job-end hook %s.%s failed for job %s", type(hook).__name__, point, ending.job_id)


def _status_or_none(ending: JobEnding) -> JobStatus | None:
    try:
        record = ending.final_record()
    except Exception:  # the hooks still run: most only need the id
        return None
    return record.status if record is not None else None
