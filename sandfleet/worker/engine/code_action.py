"""The code-action loop: the model writes one program, the runtime runs it, failures get repaired.

    question -> model -> program -> sandbox run -> RESULT        (succeeded)
                  ^                      | no RESULT, crash, timeout, tool cap
                  +---- repair request --+   (at most max_repairs times)

Side effects across repairs: a tool marked ``@side_effects`` is not called again with the same
arguments by a repaired program. The recorded result of the earlier attempt is served instead (each
earlier call stands in for one repeat) and the call's record says ``replayed``; the audit shows both
attempts' calls. New calls (other arguments, or more repeats than before) run normally.

A failing program is a result (failed / timed_out), never an exception. Only infrastructure raises:
SandboxUnavailableError and ModelUnavailableError (transient: the job is retried later).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from sandfleet.core.chain import canonical_json, sha256_hex
from sandfleet.core.config import DATA_SCIENCE_IMAGE, SandboxConfig
from sandfleet.core.contracts import (
    ArtifactInfo,
    AttemptRecord,
    AuditKind,
    ErrorInfo,
    ErrorKind,
    JobResult,
    JobSpec,
    JobStatus,
    Limit,
    SkippedArtifact,
    TokenUsage,
    ToolCallRecord,
)
from sandfleet.core.errors import InvalidSpecError, ModelError, SandboxError, UntrustedStateError
from sandfleet.worker.approval.checkpoint import Checkpoint, JobSuspended
from sandfleet.worker.approval.policy import approval_patterns, is_gated
from sandfleet.worker.engine.extract import extract_program
from sandfleet.worker.engine.prompt import first_messages, repair_message, system_message
from sandfleet.worker.engine.services import EngineServices
from sandfleet.worker.llm.bounds import budget_outcome
from sandfleet.worker.llm.client import ModelClient
from sandfleet.worker.program.artifacts import ArtifactCaps, keep_artifacts
from sandfleet.worker.program.bridge import call_key
from sandfleet.worker.program.runtime import RunResult
from sandfleet.worker.sandbox.policy import check_sandbox_policy
from sandfleet.worker.tools.registry import ToolRegistry

log = logging.getLogger("sandfleet.engine")
TAIL_CHARS = 2000


class AuditSink(Protocol):
    """Where the engine reports what happens, event by event (a Redis stream in the fleet)."""

    def emit(self, kind: AuditKind, data: dict[str, Any], attempt: int = 0) -> None: ...


class NullAudit:
    """An audit sink that keeps nothing (``sandfleet ask`` without --audit)."""

    def emit(self, kind: AuditKind, data: dict[str, Any], attempt: int = 0) -> None:
        pass


class ListAudit:
    """An audit sink that keeps events in memory, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, dict[str, Any]]] = []

    def emit(self, kind: AuditKind, data: dict[str, Any], attempt: int = 0) -> None:
        self.events.append((kind, attempt, data))


def run_job(
    spec: JobSpec, job_id: str, *, services: EngineServices, audit: AuditSink, base_url: str | None = None
) -> JobResult:
    """Answer one job. Returns its result for every outcome of the job itself."""
    began = time.perf_counter()
    settings = services.settings
    model_name = spec.model or settings.model
    try:
        config = SandboxConfig.model_validate(spec.sandbox)
        check_sandbox_policy(config, settings)
        caps = ArtifactCaps.for_job(settings, spec.artifacts)
        allowed = services.registry.subset(spec.tools)
        _check_approvals_possible(spec, allowed, services)
        model = services.job_model(spec, job_id, base_url)
        services.pool.backend.preflight(config)
    except (InvalidSpecError, SandboxError, ValidationError) as e:
        message = _validation_text(e) if isinstance(e, ValidationError) else str(e)
        audit.emit(AuditKind.ERROR, {"kind": ErrorKind.REFUSED.value, "message": message})
        return JobResult(
            job_id=job_id,
            status=JobStatus.REFUSED,
            model=model_name,
            error=ErrorInfo(kind=ErrorKind.REFUSED, message=message),
            timings={"total_s": time.perf_counter() - began},
        )
    try:  # a suspended job's checkpoint, used only if its verified chain commits to it: before any sandbox
        resume = services.approvals.resume_point(job_id) if services.approvals is not None else None
    except UntrustedStateError as e:
        log.warning("job %s: %s", job_id, e)
        audit.emit(AuditKind.ERROR, {"kind": ErrorKind.UNTRUSTED_STATE.value, "message": str(e)})
        return JobResult(
            job_id=job_id,
            status=JobStatus.FAILED,
            model=model_name,
            error=ErrorInfo(kind=ErrorKind.UNTRUSTED_STATE, message=str(e)),
            timings={"total_s": time.perf_counter() - began},
        )
    with services.pool.expecting(config):  # this job will want a sandbox: the pool warms one ahead
        return _answer(spec, job_id, config, caps, allowed, model, model_name, services, audit, began, resume)


def _answer(
    spec: JobSpec,
    job_id: str,
    config: SandboxConfig,
    caps: ArtifactCaps,
    allowed: ToolRegistry,
    model: ModelClient,
    model_name: str,
    services: EngineServices,
    audit: AuditSink,
    began: float,
    resume: Checkpoint | None,
) -> JobResult:
    """The code-action attempts of an accepted job: model, program, run, repair (``resume``: the
    verified checkpoint of a suspended job, whose attempt goes on without a model call)."""
    system = system_message(
        allowed.describe(),
        max_tool_calls=spec.code_action.max_tool_calls,
        data_science=config.image == DATA_SCIENCE_IMAGE,
    )
    messages = first_messages(spec.question, spec.history, system)
    attempts: list[AttemptRecord] = []
    usage = TokenUsage()
    phase = {"model_s": 0.0, "acquire_s": 0.0, "run_s": 0.0, "tool_s": 0.0, "sandbox_s": 0.0}
    memo: dict[str, list[Any]] = {}  # side-effecting calls already made: call_key -> results
    last_failure = ""
    timed_out = agent_killed = False
    last_run: tuple[int, RunResult] | None = None  # the latest attempt that ran: its artifacts are kept
    kept = functools.partial(_keep, services, job_id, audit)

    def ended(status: JobStatus, error: ErrorInfo, limits_hit: list[Limit] | None = None) -> JobResult:
        """The job's result as it ends unanswered: what it did so far (read when called)."""
        return _finish(
            job_id, status, error, attempts, usage, phase, began, model_name, audit, kept(last_run),
            limits_hit=limits_hit,
        )  # fmt: skip

    first = 1
    if resume is not None:  # a suspended job resumes its attempt: no model call, the same program
        messages, attempts, memo = list(resume.messages), list(resume.attempts), dict(resume.memo)
        usage, phase, first = resume.usage, {**phase, **resume.phase}, resume.number
        audit.emit(
            AuditKind.APPROVAL,
            {"event": "resumed", "waiting_for": resume.waiting_for, "calls_served": len(resume.calls)},
            first,
        )
        assert services.approvals is not None  # a checkpoint comes only from the approval service
        services.approvals.audit_decisions(job_id, audit, first)
    program: str | None
    for number in range(first, spec.code_action.max_repairs + 2):
        resuming = resume is not None and number == resume.number
        if resuming:
            assert resume is not None
            reply_text, program = resume.reply, resume.program
        else:
            outcome = _ask_model(model, messages, number, usage, phase, audit)
            if isinstance(outcome, ModelFailure):
                return ended(JobStatus.FAILED, outcome.error, [outcome.limit] if outcome.limit else None)
            reply_text, usage = outcome
            messages.append({"role": "assistant", "content": reply_text})
            program = extract_program(reply_text)
        if program is None:
            last_failure, timed_out, agent_killed = "the reply contained no Python program", False, False
            log.debug("attempt %d: no program in the reply:\n%s", number, reply_text)
            attempts.append(
                AttemptRecord(number=number, program=None, reply=reply_text, failure=last_failure)
            )
            audit.emit(AuditKind.PROGRAM, {"program": None, "failure": last_failure}, number)
            messages.append(
                repair_message(
                    last_failure + " (reply with one ```python block)",
                    exit_code=None,
                    stderr="",
                    stdout="",
                    timed_out=False,
                    tool_cap_hit=False,
                )
            )
            continue
        if not resuming:
            log.debug("attempt %d program:\n%s", number, program)
            audit.emit(AuditKind.PROGRAM, {"program": program}, number)
        gate = (
            services.approvals.gate(job_id=job_id, spec=spec, attempt=number, program=program, audit=audit)
            if services.approvals is not None
            else None
        )
        try:
            run = services.runtime.run(
                program,
                config=config,
                settings=spec.code_action,
                tools=allowed.names(),
                job_id=job_id,
                side_effect_memo={key: list(results) for key, results in memo.items()},
                on_call=functools.partial(_emit_tool_call, audit, number),
                artifacts=caps,
                gate=gate,
                resume=resume.calls if resuming and resume is not None else None,
            )
        except SandboxError as e:  # the sandbox could not be made (not transient): the job fails, recorded
            error = ErrorInfo(kind=ErrorKind.SANDBOX, message=str(e))
            return ended(JobStatus.FAILED, error)
        last_run = (number, run)
        _account(phase, run)
        if run.untrusted_state is not None:  # stopped before being served state the chain lacks
            audit.emit(AuditKind.SANDBOX_RUN, _run_event(run), number)
            attempts.append(_attempt(number, program, reply_text, run, run.untrusted_state))
            return ended(
                JobStatus.FAILED, ErrorInfo(kind=ErrorKind.UNTRUSTED_STATE, message=run.untrusted_state)
            )
        # A call waits for a person: the program was stopped, and no container is kept while they decide.
        # (A program that answered, or ran out of time, on its own meanwhile is not suspended: its
        # waiting call is left undecided, never runs, and is withdrawn when the job ends.)
        if run.suspended_for and not run.timed_out and not run.ok:
            audit.emit(AuditKind.SANDBOX_RUN, _run_event(run), number)
            raise JobSuspended(
                Checkpoint(
                    number=number,
                    program=program,
                    reply=reply_text,
                    messages=messages,
                    attempts=attempts,
                    usage=usage,
                    phase=phase,
                    memo=memo,
                    calls=run.tool_calls,
                    waiting_for=list(dict.fromkeys(run.suspended_for)),
                    suspensions=(resume.suspensions + 1) if resume is not None else 1,
                )
            )
        log.debug(
            "attempt %d exit %s%s\nstdout:\n%s\nstderr:\n%s",
            number,
            run.exit_code,
            " (timed out)" if run.timed_out else "",
            run.stdout[-TAIL_CHARS:],
            run.stderr[-TAIL_CHARS:],
        )
        audit.emit(AuditKind.SANDBOX_RUN, _run_event(run), number)
        if run.limits_hit:
            audit.emit(AuditKind.LIMIT, {"limits": [str(limit) for limit in run.limits_hit]}, number)
        failure = run.failure()
        attempts.append(_attempt(number, program, reply_text, run, failure))
        if failure is None:
            artifacts, skipped, cap_hit = kept(last_run)
            result = JobResult(
                job_id=job_id,
                status=JobStatus.SUCCEEDED,
                result=run.result,
                final_program=program,
                attempts=attempts,
                repairs=number - 1,
                tool_calls=sum(len(a.tool_calls) for a in attempts),
                usage=usage,
                timings={**phase, "total_s": time.perf_counter() - began},
                model=model_name,
                artifacts=artifacts,
                artifacts_skipped=skipped,
                limits_hit=[Limit.ARTIFACTS] if cap_hit else [],
            )
            return result
        _remember_side_effects(memo, run.tool_calls, services)
        last_failure, timed_out, agent_killed = failure, run.timed_out, run.agent_killed
        messages.append(
            repair_message(
                failure,
                exit_code=run.exit_code,
                stderr=run.stderr,
                stdout=run.stdout,
                timed_out=run.timed_out,
                tool_cap_hit=Limit.TOOL_CALLS in run.limits_hit,
            )
        )
    tries = len(attempts)
    message = f"no answer after {tries} attempt{'s' if tries > 1 else ''}: {last_failure}"
    status = JobStatus.TIMED_OUT if timed_out else JobStatus.FAILED
    if timed_out:
        kind = ErrorKind.TIMEOUT
    elif agent_killed:
        kind = ErrorKind.AGENT_KILLED
    elif attempts and attempts[-1].program is None:
        kind = ErrorKind.NO_PROGRAM
    else:
        kind = ErrorKind.PROGRAM
    return ended(status, ErrorInfo(kind=kind, message=message))


def _ask_model(
    model: ModelClient,
    messages: list[dict[str, Any]],
    number: int,
    usage: TokenUsage,
    phase: dict[str, float],
    audit: AuditSink,
) -> tuple[str, TokenUsage] | ModelFailure:
    """One model call for attempt ``number``, audited: the reply's text and the usage so far, or the
    error that ends the job (a spent budget of ``model_limits`` names its limit)."""
    try:
        reply = model.complete(messages)
    except ModelError as e:
        kind, limit = budget_outcome(e)
        if limit is not None:
            audit.emit(AuditKind.LIMIT, {"limits": [str(limit)], "message": str(e)}, number)
        return ModelFailure(ErrorInfo(kind=kind, message=str(e)), limit)
    usage = usage + TokenUsage(
        prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens, model_calls=1
    )
    phase["model_s"] += reply.latency_s
    audit.emit(AuditKind.MODEL_CALL, reply.audit_data(messages[-1:] if number > 1 else messages), number)
    return reply.text, usage


@dataclass(frozen=True)
class ModelFailure:
    """A model call that ends the job: the error, and the limit of ``model_limits`` it hit (if any)."""

    error: ErrorInfo
    limit: Limit | None = None


def _check_approvals_possible(spec: JobSpec, allowed: ToolRegistry, services: EngineServices) -> None:
    """Fail closed: a job whose tools need approval runs only where approvals can be asked (a fleet)."""
    if services.approvals is not None:
        return
    patterns = approval_patterns(services.settings.approval_tools, spec.approval_tools)
    gated = [name for name in allowed.names() if is_gated(name, patterns)]
    if gated:
        raise InvalidSpecError(
            f"tool{'s' if len(gated) > 1 else ''} {', '.join(gated)} need a person's approval, which needs "
            "the fleet (Redis and a worker); this process has no approval service"
        )


def _finish(
    job_id: str,
    status: JobStatus,
    error: ErrorInfo,
    attempts: list[AttemptRecord],
    usage: TokenUsage,
    phase: dict[str, float],
    began: float,
    model: str,
    audit: AuditSink,
    artifacts: tuple[list[ArtifactInfo], list[SkippedArtifact], bool] = ([], [], False),
    *,
    limits_hit: list[Limit] | None = None,
) -> JobResult:
    audit.emit(AuditKind.ERROR, error.model_dump(mode="json"))
    kept, skipped, cap_hit = artifacts
    return JobResult(
        job_id=job_id,
        status=status,
        error=error,
        attempts=attempts,
        repairs=max(0, len(attempts) - 1),
        final_program=next((a.program for a in reversed(attempts) if a.program), None),
        tool_calls=sum(len(a.tool_calls) for a in attempts),
        usage=usage,
        timings={**phase, "total_s": time.perf_counter() - began},
        model=model,
        artifacts=kept,
        artifacts_skipped=skipped,
        limits_hit=(limits_hit or []) + ([Limit.ARTIFACTS] if cap_hit else []),
    )


def _keep(
    services: EngineServices, job_id: str, audit: AuditSink, last_run: tuple[int, RunResult] | None
) -> tuple[list[ArtifactInfo], list[SkippedArtifact], bool]:
    """Store the artifacts of the latest run (its number, its result) and audit their digests."""
    if last_run is None:
        return [], [], False
    number, run = last_run
    kept, skipped = keep_artifacts(services.artifacts, job_id, run.artifacts, audit, number)
    return kept, skipped, run.artifacts.cap_hit


def _account(phase: dict[str, float], run: RunResult) -> None:
    phase["acquire_s"] += run.timings.get("acquire_s", 0.0)
    phase["run_s"] += run.timings.get("run_s", 0.0)
    phase["tool_s"] += run.timings.get("tool_s", 0.0)
    phase["sandbox_s"] += run.timings.get("total_s", 0.0)


def _emit_tool_call(audit: AuditSink, attempt: int, record: ToolCallRecord) -> None:
    audit.emit(AuditKind.TOOL_CALL, record.model_dump(mode="json"), attempt)


def _attempt(number: int, program: str, reply: str, run: RunResult, failure: str | None) -> AttemptRecord:
    return AttemptRecord(
        number=number,
        program=program,
        reply=reply,
        exit_code=run.exit_code,
        timed_out=run.timed_out,
        result_found=run.result_found,
        result=run.result,
        result_text=run.result_text,
        stdout_tail=run.stdout[-TAIL_CHARS:],
        stderr_tail=run.stderr[-TAIL_CHARS:],
        tool_calls=run.tool_calls,
        limits_hit=run.limits_hit,
        network_denied=run.network_denied,
        failure=failure,
        container_id=run.container_id,
        runtime=run.runtime,
        timings=run.timings,
    )


def _run_event(run: RunResult) -> dict[str, Any]:
    return {
        "container_id": run.container_id,
        "runtime": run.runtime,
        "warm": run.warm,
        "forked": run.forked,
        "exit_code": run.exit_code,
        "timed_out": run.timed_out,
        "result_found": run.result_found,
        "result_sha256": sha256_hex(canonical_json(run.result)) if run.result_found else None,
        "stdout_tail": run.stdout[-TAIL_CHARS:],
        "stderr_tail": run.stderr[-TAIL_CHARS:],
        "stdout_truncated": run.stdout_truncated,
        "stderr_truncated": run.stderr_truncated,
        "limits_hit": run.limits_hit,
        "network_denied": run.network_denied,
        "oom_killed": run.oom_killed,
        "agent_killed": run.agent_killed,
        "error": run.error,
        "timings": run.timings,
        "tool_calls": len(run.tool_calls),
    }


def _remember_side_effects(
    memo: dict[str, list[Any]], calls: list[ToolCallRecord], services: EngineServices
) -> None:
    for call in calls:
        if call.ok and call.tool in services.registry and services.registry.get(call.tool).side_effects:
            if not call.replayed:  # a call served from the memo already has its entry
                memo.setdefault(call_key(call.tool, call.args, call.kwargs), []).append(call.result)


def _validation_text(e: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in item['loc']) or 'sandbox'}: {item['msg'].removeprefix('Value error, ')}"
        for item in e.errors(include_url=False)
    )


__all__ = ["AuditSink", "ListAudit", "NullAudit", "SandboxError", "run_job"]
