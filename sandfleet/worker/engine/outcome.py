"""JobResults of a job that ends before its mode's work (refused, in every mode; failed before the loop),
or as the tool-calling loop of shell and chat ended."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sandfleet.core.contracts import (
    AuditKind,
    ErrorInfo,
    ErrorKind,
    JobResult,
    JobStatus,
    Limit,
    SessionRecord,
)
from sandfleet.core.validation_text import describe_validation_error
from sandfleet.worker.engine.job_start import JobStart
from sandfleet.worker.engine.toolloop import LoopOutcome
from sandfleet.worker.program.artifacts import Collection, keep_artifacts


def refusal_text(e: Exception) -> str:
    """What a refused job's record says: our message, or pydantic's problems one by one."""
    return describe_validation_error(e, root="sandbox") if isinstance(e, ValidationError) else str(e)


def refused(start: JobStart, e: Exception) -> JobResult:
    """The record of a job refused before any model call (a bad option, a policy, an unknown tool)."""
    message = refusal_text(e)
    start.audit.emit(AuditKind.ERROR, {"kind": ErrorKind.REFUSED.value, "message": message})
    return JobResult(
        job_id=start.job_id,
        status=JobStatus.REFUSED,
        model=start.model_name,
        mode=start.spec.mode,
        error=ErrorInfo(kind=ErrorKind.REFUSED, message=message),
        timings={"total_s": start.total_s()},
    )


def failed_before_loop(start: JobStart, kind: ErrorKind, message: str) -> JobResult:
    """The record of a job that failed before its first model call (its session sandbox could not be made)."""
    error = ErrorInfo(kind=kind, message=message)
    start.audit.emit(AuditKind.ERROR, error.model_dump(mode="json"))
    return JobResult(
        job_id=start.job_id,
        status=JobStatus.FAILED,
        model=start.model_name,
        mode=start.spec.mode,
        error=error,
        timings={"total_s": start.total_s()},
    )


def loop_result(
    start: JobStart,
    outcome: LoopOutcome,
    *,
    session: SessionRecord | None = None,
    timings: dict[str, float] | None = None,
    collected: Collection | None = None,
) -> JobResult:
    """The final record of a job whose loop ran: its answer or its error, turns, usage, caps hit, and
    the files ``collected`` from its session sandbox, stored and audited as code-action's are (after
    the error event, before the seal).

    Raises what the artifact store raises (the job is retried rather than finished without its files).
    """
    if outcome.error is not None:
        start.audit.emit(AuditKind.ERROR, outcome.error.model_dump(mode="json"))
    kept, skipped = keep_artifacts(start.services.artifacts, start.job_id, collected, start.audit, 0)
    files_capped = [Limit.ARTIFACTS] if collected is not None and collected.cap_hit else []
    limits = list(
        dict.fromkeys([*outcome.limits_hit, *(session.limits_hit if session else []), *files_capped])
    )
    extra: dict[str, Any] = dict(timings or {})
    return JobResult(
        job_id=start.job_id,
        status=outcome.status,
        result=outcome.result,
        error=outcome.error,
        tool_calls=outcome.tool_calls,
        usage=outcome.usage,
        timings={
            "model_s": outcome.model_s,
            "tool_s": outcome.tool_s,
            **extra,
            "total_s": start.total_s(),
        },
        model=start.model_name,
        mode=start.spec.mode,
        turns=outcome.turns,
        session=session,
        limits_hit=limits,
        artifacts=kept,
        artifacts_skipped=skipped,
    )
