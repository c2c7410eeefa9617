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
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import redis
from celery.exceptions import Ignore

from sandfleet.core.contracts import JobStatus
from sandfleet.core.records import JobRecord
from sandfleet.core.store import JobStore

log = logging.getLogger(__name__)

PREVIEW_CHARS = 200
EXCEPTION_CHARS = 1000
FAILED_EVENT = "task-failed"


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
    result = record.result
    summary: dict[str, Any] = {"job_id": job_id, "status": record.status.value}
    if result is not None and result.result is not None:
        summary["result"] = preview(result.result)
    if record.status == JobStatus.SUCCEEDED:
        return FlowerOutcome(False, summary)
    error = result.error if result is not None else None
    kind = error.kind.value if error is not None else "unknown"
    message = error.message if error is not None else "no error recorded"
    summary["error"] = f"{kind}: {preview(message, EXCEPTION_CHARS)}"
    exception = f"{record.status.value} ({kind}): {message}"
    return FlowerOutcome(True, summary, exception[:EXCEPTION_CHARS])


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


def report_delivery(task: Any, store: JobStore, job_id: str, status: JobStatus | None) -> dict[str, Any]:
    """After a delivery: read the job's record once and tell Flower its outcome (the task's return
    value, or ``Ignore`` raised after a task-failed event)."""
    try:
        record = store.record(job_id)
    except redis.RedisError as e:  # the final record is written; only Flower's view of it is missing
        log.warning("job %s: cannot read its record back for Flower (%s)", job_id, e)
        return {"job_id": job_id, "status": status.value if status else None}
    return report_outcome(task, flower_outcome(job_id, record))
