"""What happens after a delivery, once the task knows how the job stands: the job's record is read
once and handed to whoever reports on ended jobs (metrics, webhooks: ``WorkerState.job_ended``), then
Flower is told the job's own outcome (worker/flower_report.py).
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from sandfleet.core.contracts import JobStatus
from sandfleet.worker.flower_report import flower_outcome, report_outcome
from sandfleet.worker.state import WorkerState

log = logging.getLogger(__name__)


def after_delivery(task: Any, state: WorkerState, job_id: str, status: JobStatus | None) -> dict[str, Any]:
    """The task's return value for Flower (or ``Ignore`` raised after a task-failed event).

    ``status`` is what this delivery recorded (None: it recorded nothing, e.g. a duplicate): only a
    delivery that ended the job reports it to the metrics and webhooks, so nothing is counted twice.
    """
    try:
        record = state.store.record(job_id)
    except redis.RedisError as e:  # the final record is written; only the report is missing
        log.warning("job %s: cannot read its record back for Flower (%s)", job_id, e)
        return {"job_id": job_id, "status": status.value if status else None}
    if status is not None and record is not None and record.status.is_final:
        state.job_ended(record)
    return report_outcome(task, flower_outcome(job_id, record))
