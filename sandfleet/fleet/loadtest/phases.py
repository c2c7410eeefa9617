"""The phases of one job, derived from its record: timestamps by state plus the engine's timings.

Where each figure comes from (seconds):

``queue_wait``    ``running_at - queued_at``: from the producer's queued record to the worker marking
                  the job running (broker wait, prefetch, delivery counting).
``model``         ``JobResult.timings.model_s``: time spent in model calls (all attempts).
``acquire``       ``timings.acquire_s``: waiting for a sandbox from the pool (warm: ~0; cold: a start).
``run``           ``timings.run_s``: the program running inside the sandbox, as its agent measured it.
``tool``          ``timings.tool_s``: host-side tool calls (part of ``run``).
``files``         sum over attempts of ``attempts[i].timings.files_s``: writing the program and the tool
                  stub into the sandbox.
``exec_start``    sum over attempts of ``attempts[i].timings.start_s``: the agent starting the program
                  (the exec's duration minus the program's own run).
``engine``        ``timings.total_s``: the engine's whole run of the job.
``engine_other``  ``engine - model - acquire - files - exec_start - run``: the rest of the engine —
                  audit events written to Redis (one script call each), prompt building, release.
``result_write``  ``{final}_at - running_at - total_s``: the worker's bookkeeping around the engine —
                  the "running" audit event before it, and after it the final audit event and the
                  final-record script. The engine's own start and end are not stamped in the record,
                  so this is derived: both timestamps come from the worker's clock, ``total_s`` from
                  its monotonic clock; clamped at 0.
``end_to_end``    ``{final}_at - queued_at``: submit to final record.
``end_to_end_excl_model``  ``end_to_end - model``: what the fleet adds on top of the model.

A job that has not ended, or ended without a result (refused before the engine ran), has only the
phases its record supports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PHASES = (
    "queue_wait",
    "model",
    "acquire",
    "run",
    "tool",
    "files",
    "exec_start",
    "engine",
    "engine_other",
    "result_write",
    "end_to_end",
    "end_to_end_excl_model",
)
TIMING_KEYS = {
    "model": "model_s",
    "acquire": "acquire_s",
    "run": "run_s",
    "tool": "tool_s",
    "engine": "total_s",
}
FINAL_STATES = ("succeeded", "failed", "refused", "timed_out", "cancelled")


def final_state(timestamps: Mapping[str, float]) -> str | None:
    """The final state stamped in ``timestamps`` (the latest if several), or None."""
    stamped = [(timestamps[s], s) for s in FINAL_STATES if s in timestamps]
    return max(stamped)[1] if stamped else None


def job_phases(
    timestamps: Mapping[str, float],
    timings: Mapping[str, float] | None,
    attempt_timings: Sequence[Mapping[str, float]] = (),
) -> dict[str, float]:
    """Seconds per phase for one job (see the module docstring); phases it cannot support are left out."""
    out: dict[str, float] = {}
    queued, running = timestamps.get("queued"), timestamps.get("running")
    final = final_state(timestamps)
    ended = timestamps.get(final) if final else None
    if queued is not None and running is not None:
        out["queue_wait"] = max(0.0, running - queued)
    for phase, key in TIMING_KEYS.items():
        if timings and key in timings:
            out[phase] = float(timings[key])
    if attempt_timings:
        out["files"] = sum(float(t.get("files_s", 0.0)) for t in attempt_timings)
        out["exec_start"] = sum(float(t.get("start_s", 0.0)) for t in attempt_timings)
        if "engine" in out:
            parts = ("model", "acquire", "files", "exec_start", "run")
            out["engine_other"] = max(0.0, out["engine"] - sum(out.get(p, 0.0) for p in parts))
    if running is not None and ended is not None and timings and "total_s" in timings:
        out["result_write"] = max(0.0, ended - running - float(timings["total_s"]))
    if queued is not None and ended is not None:
        out["end_to_end"] = max(0.0, ended - queued)
        out["end_to_end_excl_model"] = max(0.0, out["end_to_end"] - out.get("model", 0.0))
    return out


def record_summary(record: Mapping[str, Any]) -> dict[str, Any]:
    """The few fields of a job record the report needs, from ``JobRecord.model_dump(mode="json")``.

    Returns ``{"job_id", "status", "ended_at", "queued_at", "running_at", "error_kind", "attempts", "deliveries", "worker",
    "phases"}``; ``ended_at`` is None for a job that has not ended.
    """
    timestamps = record.get("timestamps") or {}
    result = record.get("result") or {}
    final = final_state(timestamps)
    error = result.get("error") or {}
    status = record.get("status", "unknown")
    return {
        "job_id": record.get("job_id"),
        "status": status,
        "ended_at": timestamps.get(final) if final else None,
        "queued_at": timestamps.get("queued"),
        "running_at": timestamps.get("running"),
        "error_kind": error.get("kind") if status != "succeeded" else None,
        "attempts": record.get("attempts", 0),
        "deliveries": record.get("deliveries", 0),
        "worker": record.get("worker"),
        "phases": job_phases(
            timestamps,
            result.get("timings"),
            [a.get("timings") or {} for a in result.get("attempts") or [] if a.get("program")],
        ),
    }
