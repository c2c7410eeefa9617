"""What Flower shows for a job: its own outcome, not whether the Celery task returned.

Flower learns a task's state from Celery events only (the fleet keeps no result backend). A job that
ended ``failed``, ``timed_out`` or ``refused`` used to return normally, so Flower showed SUCCESS and
its "Failed" filter found nothing. Now :func:`report_outcome` tells it the truth:

- a job that succeeded returns its summary (status, RESULT preview): a ``task-succeeded`` event;
- any other final status sends a ``task-failed`` event ourselves (``exception``: status, error kind
  and message; ``result``: the same summary) and raises Celery's ``Ignore``. ``Ignore`` acknowledges
  the message exactly as a normal return does (``Request.on_failure`` -> ``acknowledge``) and sends
  no event of its own, so nothing changes for delivery: late acks, one final record, redelivery
  after a lost worker all work as before. A duplicate delivery reports the job's recorded outcome
  again, so Flower's state for the job id never flips.

Retries (transient failures) still go through ``self.retry`` and show as RETRY.

:class:`FlowerReport` is the job-end hook (sandfleet/worker/delivery/job_end.py) that works the outcome
out when the job ends, from the result just written (no read; the store's caps applied) or, when another writer ended the job
first, from the record the job end read back; the task takes it after the delivery. A delivery that
ended nothing (a duplicate) reads the record once instead.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import redis
from celery.exceptions import Ignore

from sandfleet.core.contracts import JobResult, JobStatus
from sandfleet.core.records import JobRecord
from sandfleet.core.store import JobStore, Transition, readable_result
from sandfleet.worker.delivery.job_end import JobEndHook, JobEnding

log = logging.getLogger(__name__)

PREVIEW_CHARS = 200
EXCEPTION_CHARS = 1000
FAILED_EVENT = "task-failed"
# Outcomes kept for the task to take: one per job that ended here and whose delivery has not taken
# it yet (a job the cancel watcher ended while queued is taken when its message arrives, if it does).
KEPT_OUTCOMES = 1024


@dataclass(frozen=True)
class FlowerOutcome:
    """How one job appears in Flower: failed or not, the result column's summary, the exception text."""

    failed: bool
    summary: dict[str, Any]
    exception: str = ""


def preview(value: Any, limit: int = PREVIEW_CHARS) -> str:
    """A short one-line text of a RESULT value (JSON where it serialises), ``…`` when cut."""
    try:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def flower_outcome(job_id: str, record: JobRecord | None) -> FlowerOutcome:
    """The outcome to show for ``job_id`` given its record (None or unfinished: nothing ended here)."""
    if record is None or not record.status.is_final:
        status = record.status.value if record is not None else None
        return FlowerOutcome(False, {"job_id": job_id, "status": status})
    return final_outcome(job_id, record.status, record.result)


def final_outcome(job_id: str, status: JobStatus, result: JobResult | None) -> FlowerOutcome:
    """The outcome to show for a job that ended with ``status`` and ``result``."""
    summary: dict[str, Any] = {"job_id": job_id, "status": status.value}
    if result is not None and result.result is not None:
        summary["result"] = preview(result.result)
    if status == JobStatus.SUCCEEDED:
        return FlowerOutcome(False, summary)
    error = result.error if result is not None else None
    kind = error.kind.value if error is not None else "unknown"
    message = error.message if error is not None else "no error recorded"
    summary["error"] = f"{kind}: {preview(message, EXCEPTION_CHARS)}"
    exception = f"{status.value} ({kind}): {message}"
    return FlowerOutcome(True, summary, exception[:EXCEPTION_CHARS])


class FlowerReport(JobEndHook):
    """The job-end hook that notes what Flower is to show for each job ended in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outcomes: OrderedDict[str, FlowerOutcome] = OrderedDict()

    def on_end(self, ending: JobEnding) -> None:
        if ending.outcome == Transition.APPLIED:  # the result as the store wrote it (caps applied)
            written, _json = readable_result(ending.result)
            outcome = final_outcome(ending.job_id, written.status, written)
        else:  # another writer ended it first: its record, as the job end read it back
            outcome = flower_outcome(ending.job_id, ending.final_record())
        with self._lock:
            self._outcomes[ending.job_id] = outcome
            self._outcomes.move_to_end(ending.job_id)
            while len(self._outcomes) > KEPT_OUTCOMES:
                self._outcomes.popitem(last=False)

    def take(self, job_id: str) -> FlowerOutcome | None:
        """The outcome noted for ``job_id``, forgotten once taken (None: it did not end here)."""
        with self._lock:
            return self._outcomes.pop(job_id, None)


def report_outcome(task: Any, outcome: FlowerOutcome) -> dict[str, Any]:
    """Return the summary (task-succeeded), or send task-failed and raise ``Ignore`` (message acked).

    Raises:
        Ignore: the job did not succeed; Flower was told with a task-failed event.
    """
    if not outcome.failed:
        return outcome.summary
    task.send_event(
        FAILED_EVENT,
        exception=outcome.exception,
        traceback="",
        result=json.dumps(outcome.summary, ensure_ascii=False),
    )
    raise Ignore()


def report_delivery(
    task: Any, store: JobStore, job_id: str, status: JobStatus | None, outcome: FlowerOutcome | None
) -> dict[str, Any]:
    """After a delivery: tell Flower the job's outcome (the task's return value, or ``Ignore`` raised
    after a task-failed event): ``outcome`` as the job end noted it, else from the record read once."""
    if outcome is not None:
        return report_outcome(task, outcome)
    try:
        record = store.record(job_id)
    except redis.RedisError as e:  # the final record is written; only Flower's view of it is missing
        log.warning("job %s: cannot read its record back for Flower (%s)", job_id, e)
        return {"job_id": job_id, "status": status.value if status else None}
    return report_outcome(task, flower_outcome(job_id, record))
