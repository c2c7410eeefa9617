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
from typing import Any

from sandfleet.core.audit_sink import AuditSink, ListAudit, NullAudit
from sandfleet.core.chain import canonical_json, sha256_hex
from sandfleet.core.config import DATA_SCIENCE_IMAGE, SandboxConfig
from sandfleet.core.contracts import (
    ArtifactInfo,
    AttemptRecord,
    AuditKind,
    ErrorInfo,
    ErrorKind,
    JobMode,
    JobResult,
    JobSpec,
    JobStatus,
    Limit,
    SkippedArtifact,
    TokenUsage,
    ToolCallRecord,
)
from sandfleet.core.errors import ModelError, SandboxError, UntrustedStateError
from sandfleet.worker.approval.checkpoint import Checkpoint, JobSuspended
from sandfleet.worker.engine.admission import Admitted, JobStart, admit
from sandfleet.worker.engine.extract import extract_program
from sandfleet.worker.engine.prompt import AttemptFailure, first_messages, repair_message, system_message
from sandfleet.worker.engine.services import EngineServices
from sandfleet.worker.llm.bounds import budget_outcome
from sandfleet.worker.program.artifacts import ArtifactCaps, keep_artifacts
from sandfleet.worker.program.recorded import RecordedAnswers, call_digest
from sandfleet.worker.program.runtime import RunResult
from sandfleet.worker.tools.registry import ToolRegistry

log = logging.getLogger("sandfleet.engine")
TAIL_CHARS = 2000


def run_job(
    spec: JobSpec, job_id: str, *, services: EngineServices, audit: AuditSink, base_url: str | None = None
) -> JobResult:
    """Answer one job. Returns its result for every outcome of the job itself."""
    start = JobStart(spec, job_id, services, audit, base_url)
    admitted = admit(start, functools.partial(_code_action_checks, start))
    if isinstance(admitted, JobResult):
        return admitted
    try:  # a suspended job's checkpoint, used only if its verified chain commits to it: before any sandbox
        resume = services.approvals.resume_point(job_id) if services.approvals is not None else None
    except UntrustedStateError as e:
        log.warning("job %s: %s", job_id, e)
        audit.emit(AuditKind.ERROR, {"kind": ErrorKind.UNTRUSTED_STATE.value, "message": str(e)})
        return JobResult(
            job_id=job_id,
            status=JobStatus.FAILED,
            model=start.model_name,
            mode=JobMode.CODE_ACTION,
            error=ErrorInfo(kind=ErrorKind.UNTRUSTED_STATE, message=str(e)),
            timings={"total_s": time.perf_counter() - start.began},
        )
    with services.pool.expecting(admitted.config):  # this job will want a sandbox: the pool warms one ahead
        return CodeActionRun(start, admitted, resume).answer()


def _code_action_checks(start: JobStart, config: SandboxConfig, allowed: ToolRegistry) -> ArtifactCaps:
    """Code-action's own admission: the artifact caps within the operator's (whether approvals can be
    asked is checked for every mode, by ``admit``)."""
    return ArtifactCaps.for_job(start.services.settings, start.spec.artifacts)


class CodeActionRun:
    """The code-action attempts of one admitted job: model, program, run, repair.

    It holds what the attempts share: the conversation, the attempts so far, the usage, the time per
    phase and the memo of side-effecting calls already made; ``resume`` is the verified checkpoint of
    a suspended job, whose attempt goes on without a model call.
    """

    def __init__(self, start: JobStart, admitted: Admitted[ArtifactCaps], resume: Checkpoint | None) -> None:
        self.start, self.admitted, self.resume = start, admitted, resume
        spec = start.spec
        system = system_message(
            admitted.allowed.describe(),
            max_tool_calls=spec.code_action.max_tool_calls,
            data_science=admitted.config.image == DATA_SCIENCE_IMAGE,
        )
        self.messages = first_messages(spec.question, spec.history, system)
        self.attempts: list[AttemptRecord] = []
        self.usage = TokenUsage()
        self.phase = {"model_s": 0.0, "acquire_s": 0.0, "run_s": 0.0, "tool_s": 0.0, "sandbox_s": 0.0}
        self.memo: dict[str, list[Any]] = {}  # side-effecting calls already made: call digest -> results
        self.last_failure = ""
        self.timed_out = self.agent_killed = False
        self.last_run: tuple[int, RunResult] | None = (
            None  # the latest attempt that ran: its artifacts are kept
        )

    def answer(self) -> JobResult:
        """Every attempt until one answers, or the repairs run out."""
        first = self._resume_state() if self.resume is not None else 1
        for number in range(first, self.start.spec.code_action.max_repairs + 2):
            resuming = self.resume is not None and number == self.resume.number
            reply = self._reply(number, resuming)
            if isinstance(reply, JobResult):
                return reply
            reply_text, program = reply
            if program is None:
                self._no_program(number, reply_text)
                continue
            ended = self._attempt(number, program, reply_text, resuming)
            if ended is not None:
                return ended
        return self._gave_up()

    def _resume_state(self) -> int:
        """Take the suspended job's state back (no model call, the same program): its attempt number."""
        resume, audit = self.resume, self.start.audit
        assert resume is not None
        self.messages, self.attempts, self.memo = (
            list(resume.messages),
            list(resume.attempts),
            dict(resume.memo),
        )
        self.usage, self.phase = resume.usage, {**self.phase, **resume.phase}
        audit.emit(
            AuditKind.APPROVAL,
            {"event": "resumed", "waiting_for": resume.waiting_for, "calls_served": len(resume.calls)},
            resume.number,
        )
        approvals = self.start.services.approvals
        assert approvals is not None  # a checkpoint comes only from the approval service
        approvals.audit_decisions(self.start.job_id, audit, resume.number)
        return resume.number

    def _reply(self, number: int, resuming: bool) -> tuple[str, str | None] | JobResult:
        """The attempt's reply and the program in it (a resumed attempt's own), or the job's end."""
        if resuming:
            assert self.resume is not None
            return self.resume.reply, self.resume.program
        try:
            reply = self.admitted.model.complete(self.messages)
        except ModelError as e:  # it ends the job; a spent budget of ``model_limits`` names its limit
            kind, limit = budget_outcome(e)
            if limit is not None:
                self.start.audit.emit(AuditKind.LIMIT, {"limits": [str(limit)], "message": str(e)}, number)
            return self._ended(
                JobStatus.FAILED, ErrorInfo(kind=kind, message=str(e)), [limit] if limit else None
            )
        self.usage = self.usage + TokenUsage(
            prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens, model_calls=1
        )
        self.phase["model_s"] += reply.latency_s
        sent = self.messages[-1:] if number > 1 else self.messages
        self.start.audit.emit(AuditKind.MODEL_CALL, reply.audit_data(sent), number)
        self.messages.append({"role": "assistant", "content": reply.text})
        return reply.text, extract_program(reply.text)

    def _no_program(self, number: int, reply_text: str) -> None:
        self.last_failure, self.timed_out, self.agent_killed = (
            "the reply contained no Python program",
            False,
            False,
        )
        log.debug("attempt %d: no program in the reply:\n%s", number, reply_text)
        self.attempts.append(
            AttemptRecord(number=number, program=None, reply=reply_text, failure=self.last_failure)
        )
        self.start.audit.emit(AuditKind.PROGRAM, {"program": None, "failure": self.last_failure}, number)
        self.messages.append(
            repair_message(AttemptFailure(self.last_failure + " (reply with one ```python block)"))
        )

    def _attempt(self, number: int, program: str, reply_text: str, resuming: bool) -> JobResult | None:
        """Run the attempt's program: the job's result when it ends here, None when a repair follows."""
        audit = self.start.audit
        if not resuming:
            log.debug("attempt %d program:\n%s", number, program)
            audit.emit(AuditKind.PROGRAM, {"program": program}, number)
        try:
            run = self._run(number, program, resuming)
        except SandboxError as e:  # the sandbox could not be made (not transient): the job fails, recorded
            return self._ended(JobStatus.FAILED, ErrorInfo(kind=ErrorKind.SANDBOX, message=str(e)))
        self.last_run = (number, run)
        _account(self.phase, run)
        if run.untrusted_state is not None:  # stopped before being served state the chain lacks
            audit.emit(AuditKind.SANDBOX_RUN, _run_event(run), number)
            self.attempts.append(_attempt(number, program, reply_text, run, run.untrusted_state))
            error = ErrorInfo(kind=ErrorKind.UNTRUSTED_STATE, message=run.untrusted_state)
            return self._ended(JobStatus.FAILED, error)
        # A call waits for a person: the program was stopped, and no container is kept while they decide.
        # (A program that answered, or ran out of time, on its own meanwhile is not suspended: its
        # waiting call is left undecided, never runs, and is withdrawn when the job ends.)
        if run.suspended_for and not run.timed_out and not run.ok:
            audit.emit(AuditKind.SANDBOX_RUN, _run_event(run), number)
            raise JobSuspended(self._checkpoint(number, program, reply_text, run))
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
        self.attempts.append(_attempt(number, program, reply_text, run, failure))
        if failure is None:
            return self._succeeded(number, program, run)
        self._repair(run, failure)
        return None

    def _run(self, number: int, program: str, resuming: bool) -> RunResult:
        """One run of ``program`` in a fresh sandbox, its repeated side effects served from the memo."""
        start, services = self.start, self.start.services
        gate = (
            services.approvals.gate(
                job_id=start.job_id, spec=start.spec, attempt=number, program=program, audit=start.audit
            )
            if services.approvals is not None
            else None
        )
        return services.runtime.run(
            program,
            config=self.admitted.config,
            settings=start.spec.code_action,
            registry=self.admitted.allowed,  # the tools the job was admitted with, whatever changed since
            job_id=start.job_id,
            recorded=RecordedAnswers(
                memo=self.memo, resume=self.resume.calls if resuming and self.resume is not None else None
            ),
            on_call=functools.partial(_emit_tool_call, start.audit, number),
            artifacts=self.admitted.prepared,
            gate=gate,
            redact=tuple(services.settings.approval_redact),
        )

    def _checkpoint(self, number: int, program: str, reply_text: str, run: RunResult) -> Checkpoint:
        return Checkpoint(
            number=number,
            program=program,
            reply=reply_text,
            messages=self.messages,
            attempts=self.attempts,
            usage=self.usage,
            phase=self.phase,
            memo=self.memo,
            calls=run.tool_calls,
            waiting_for=list(dict.fromkeys(run.suspended_for)),
            suspensions=(self.resume.suspensions + 1) if self.resume is not None else 1,
        )

    def _succeeded(self, number: int, program: str, run: RunResult) -> JobResult:
        artifacts, skipped, cap_hit = self._kept()
        return JobResult(
            job_id=self.start.job_id,
            status=JobStatus.SUCCEEDED,
            result=run.result,
            final_program=program,
            attempts=self.attempts,
            repairs=number - 1,
            tool_calls=sum(len(a.tool_calls) for a in self.attempts),
            usage=self.usage,
            timings={**self.phase, "total_s": time.perf_counter() - self.start.began},
            model=self.start.model_name,
            mode=JobMode.CODE_ACTION,
            artifacts=artifacts,
            artifacts_skipped=skipped,
            limits_hit=[Limit.ARTIFACTS] if cap_hit else [],
        )

    def _repair(self, run: RunResult, failure: str) -> None:
        """Remember what the failed run did, and ask the model for a repaired program."""
        _remember_side_effects(self.memo, run.tool_calls, self.admitted.allowed)
        self.last_failure, self.timed_out, self.agent_killed = failure, run.timed_out, run.agent_killed
        self.messages.append(repair_message(_failure_of(run, failure)))

    def _gave_up(self) -> JobResult:
        """The result of a job whose repairs ran out, named by how its last attempt failed."""
        tries = len(self.attempts)
        message = f"no answer after {tries} attempt{'s' if tries > 1 else ''}: {self.last_failure}"
        status = JobStatus.TIMED_OUT if self.timed_out else JobStatus.FAILED
        if self.timed_out:
            kind = ErrorKind.TIMEOUT
        elif self.agent_killed:
            kind = ErrorKind.AGENT_KILLED
        elif self.attempts and self.attempts[-1].program is None:
            kind = ErrorKind.NO_PROGRAM
        else:
            kind = ErrorKind.PROGRAM
        return self._ended(status, ErrorInfo(kind=kind, message=message))

    def _kept(self) -> tuple[list[ArtifactInfo], list[SkippedArtifact], bool]:
        """Store the artifacts of the latest run and audit their digests."""
        if self.last_run is None:
            return [], [], False
        number, run = self.last_run
        kept, skipped = keep_artifacts(
            self.start.services.artifacts, self.start.job_id, run.artifacts, self.start.audit, number
        )
        return kept, skipped, run.artifacts.cap_hit

    def _ended(self, status: JobStatus, error: ErrorInfo, limits_hit: list[Limit] | None = None) -> JobResult:
        """The job's result as it ends unanswered: what it did so far."""
        self.start.audit.emit(AuditKind.ERROR, error.model_dump(mode="json"))
        kept, skipped, cap_hit = self._kept()
        attempts = self.attempts
        return JobResult(
            job_id=self.start.job_id,
            status=status,
            error=error,
            attempts=attempts,
            repairs=max(0, len(attempts) - 1),
            final_program=next((a.program for a in reversed(attempts) if a.program), None),
            tool_calls=sum(len(a.tool_calls) for a in attempts),
            usage=self.usage,
            timings={**self.phase, "total_s": time.perf_counter() - self.start.began},
            model=self.start.model_name,
            mode=JobMode.CODE_ACTION,
            artifacts=kept,
            artifacts_skipped=skipped,
            limits_hit=(limits_hit or []) + ([Limit.ARTIFACTS] if cap_hit else []),
        )


def _account(phase: dict[str, float], run: RunResult) -> None:
    phase["acquire_s"] += run.timings.get("acquire_s", 0.0)
    phase["run_s"] += run.timings.get("run_s", 0.0)
    phase["tool_s"] += run.timings.get("tool_s", 0.0)
    phase["sandbox_s"] += run.timings.get("total_s", 0.0)


def _failure_of(run: RunResult, failure: str) -> AttemptFailure:
    """The facts of a failed run that its repair request tells the model."""
    return AttemptFailure(
        failure,
        exit_code=run.exit_code,
        stderr=run.stderr,
        stdout=run.stdout,
        timed_out=run.timed_out,
        tool_cap_hit=Limit.TOOL_CALLS in run.limits_hit,
    )


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
        refused_total=run.refused_total,
        refused_unlisted=run.refused_unlisted,
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
        "refused_total": run.refused_total,
        "refused_unlisted": run.refused_unlisted,
        "oom_killed": run.oom_killed,
        "agent_killed": run.agent_killed,
        "error": run.error,
        "timings": run.timings,
        "tool_calls": len(run.tool_calls),
    }


def _remember_side_effects(
    memo: dict[str, list[Any]], calls: list[ToolCallRecord], registry: ToolRegistry
) -> None:
    for call in calls:
        if call.ok and call.tool in registry and registry.get(call.tool).side_effects:
            if not call.replayed:  # a call served from the memo already has its entry
                digest = call.call_sha256 or call_digest(call.tool, call.args, call.kwargs)
                memo.setdefault(digest, []).append(call.result)


__all__ = ["AuditSink", "CodeActionRun", "ListAudit", "NullAudit", "SandboxError", "run_job"]
