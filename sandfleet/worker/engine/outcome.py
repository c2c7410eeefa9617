"""JobResults of the tool-loop modes (shell and chat): refused before any model call, or as the loop ended."""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from sandfleet.core.contracts import (
    AuditKind,
    ErrorInfo,
    ErrorKind,
    JobMode,
    JobResult,
    JobStatus,
    SessionRecord,
)
from sandfleet.core.errors import InvalidSpecError
from sandfleet.worker.engine.toolloop import AuditSink, LoopOutcome


def refusal_text(e: Exception) -> str:
    """What a refused job's record says: our message, or pydantic's problems one by one."""
    if isinstance(e, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in item['loc']) or 'sandbox'}: {item['msg'].removeprefix('Value error, ')}"
            for item in e.errors(include_url=False)
        )
    return str(e)


def refused(
    job_id: str, mode: JobMode, model: str, e: Exception, began: float, audit: AuditSink
) -> JobResult:
    """The record of a job refused before any model call (a bad option, a policy, an unknown tool)."""
    message = refusal_text(e) if isinstance(e, InvalidSpecError | ValidationError) else str(e)
    audit.emit(AuditKind.ERROR, {"kind": ErrorKind.REFUSED.value, "message": message})
    return JobResult(
        job_id=job_id,
        status=JobStatus.REFUSED,
        model=model,
        mode=mode,
        error=ErrorInfo(kind=ErrorKind.REFUSED, message=message),
        timings={"total_s": time.perf_counter() - began},
    )


def failed_before_loop(
    job_id: str, mode: JobMode, model: str, kind: ErrorKind, message: str, began: float, audit: AuditSink
) -> JobResult:
    """The record of a job that failed before its first model call (its session sandbox could not be made)."""
    error = ErrorInfo(kind=kind, message=message)
    audit.emit(AuditKind.ERROR, error.model_dump(mode="json"))
    return JobResult(
        job_id=job_id,
        status=JobStatus.FAILED,
        model=model,
        mode=mode,
        error=error,
        timings={"total_s": time.perf_counter() - began},
    )


def loop_result(
    job_id: str,
    mode: JobMode,
    model: str,
    outcome: LoopOutcome,
    began: float,
    audit: AuditSink,
    *,
    session: SessionRecord | None = None,
    timings: dict[str, float] | None = None,
) -> JobResult:
    """The final record of a job whose loop ran: its answer or its error, turns, usage, caps hit."""
    if outcome.error is not None:
        audit.emit(AuditKind.ERROR, outcome.error.model_dump(mode="json"))
    limits = list(outcome.limits_hit)
    for limit in session.limits_hit if session else []:
        if limit not in limits:
            limits.append(limit)
    extra: dict[str, Any] = dict(timings or {})
    return JobResult(
        job_id=job_id,
        status=outcome.status,
        result=outcome.result,
        error=outcome.error,
        tool_calls=outcome.tool_calls,
        usage=outcome.usage,
        timings={
            "model_s": outcome.model_s,
            "tool_s": outcome.tool_s,
            **extra,
            "total_s": time.perf_counter() - began,
        },
        model=model,
        mode=mode,
        turns=outcome.turns,
        session=session,
        limits_hit=limits,
    )
