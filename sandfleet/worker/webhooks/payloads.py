"""The bodies of completion webhooks: pure functions of the job's final result (or batch counts)."""

from __future__ import annotations

import json
from typing import Any

from sandfleet.core.contracts import JobResult

JOB_EVENT = "job.ended"
BATCH_EVENT = "batch.ended"
MAX_RESULT_BYTES = 64 * 1024  # a larger RESULT is left out of the body (fetch the record instead)


def encode(body: dict[str, Any]) -> bytes:
    """The exact bytes signed and sent: compact JSON, keys sorted."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def job_body(result: JobResult, batch_id: str | None, finished_at: float) -> dict[str, Any]:
    """What a job's webhook says: its id, status, error, RESULT (when small), usage and time."""
    value: Any = result.result
    truncated = len(encode({"v": value})) > MAX_RESULT_BYTES
    return {
        "event": JOB_EVENT,
        "job_id": result.job_id,
        "batch_id": batch_id,
        "status": result.status.value,
        "error": result.error.model_dump(mode="json") if result.error is not None else None,
        "result": None if truncated else value,
        "result_truncated": truncated,
        "usage": result.usage.model_dump(mode="json"),
        "total_s": result.timings.get("total_s"),
        "finished_at": finished_at,
    }


def batch_body(batch_id: str, counts: dict[str, int], finished_at: float) -> dict[str, Any]:
    """What a batch's webhook says: its id and how many of its jobs ended in each status."""
    return {"event": BATCH_EVENT, "batch_id": batch_id, "counts": counts, "finished_at": finished_at}
