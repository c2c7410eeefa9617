"""Re-running a finished job's final program with its recorded tool results: no tool, no model.

A job is replayed only once its record is proven by its audit chain (:mod:`sandfleet.core.verify`).
The final attempt's tool calls come from the chain (``tool_call`` events); the bridge serves each call
from them (same order, same tool, same arguments, else the call fails), so the program sees exactly
what it saw the first time. A deterministic program must print the same RESULT, and the replay
compares it three ways: with the result the record serves (what ``sandfleet result`` prints), with the
seal's commitment to that result, and with the RESULT digest the chain recorded for the run. The files
it writes under /workspace/out/ must be the artifacts the record lists, byte for byte (SHA-256); and
when the evidence carries the digests of the stored artifacts, bytes changed at rest make the record
unverified before anything runs.

Shell and chat jobs have no final program: a chat job's answer is its model's reply, a shell job's
commands ran in a session sandbox destroyed with it. They are verified and skipped, saying so, as are
jobs that did not succeed; neither is a failure of the replay (exit 0 when nothing else failed).

A replay runs under the policy of the machine running it (sandfleet/worker/sandbox/policy.py ``replay_sandbox``),
never under the one the record says its worker had: always with network ``none`` (the answers come
from the record), and a recorded sandbox beyond the local policy (sudo, a writable root, a runtime,
env, limits ...) is refused, named, before any container starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sandfleet.core.chain import canonical_json, sha256_hex
from sandfleet.core.contracts import (
    ArtifactInfo,
    AuditEvent,
    AuditKind,
    JobMode,
    JobResult,
    JobStatus,
    ToolCallRecord,
)
from sandfleet.core.errors import InvalidSpecError
from sandfleet.core.records import JobRecord
from sandfleet.core.settings import Settings
from sandfleet.core.signing import KeyRing
from sandfleet.core.verify import JobEvidence, Verdict, VerdictState, verify_job
from sandfleet.worker.program.artifacts import ArtifactCaps
from sandfleet.worker.program.recorded import RecordedAnswers
from sandfleet.worker.program.runtime import ProgramRuntime, RunResult
from sandfleet.worker.sandbox.policy import replay_sandbox
from sandfleet.worker.sandbox.pool import SandboxPool
from sandfleet.worker.tools.registry import ToolRegistry
from sandfleet.worker.tools.tool import is_tool_name


class ReplayState(StrEnum):
    MATCH = "match"  # the replay printed the served, sealed RESULT
    DIFFERENT = "different"  # it printed something else (or nothing)
    UNVERIFIED = "unverified"  # record and chain disagree: not replayed
    SKIPPED = "skipped"  # nothing to reproduce: the job did not succeed, or has no program (shell, chat)
    MISSING = "missing"  # no record, or the job has not ended
    FAILED = "failed"  # the replay itself could not run (no engine, no image): nothing was compared
    REFUSED = "refused"  # the recorded sandbox is beyond this machine's policy: not replayed


@dataclass(frozen=True)
class ReplayOutcome:
    """What replaying one job found. ``served`` is the record's result, ``replayed`` the replay's."""

    job_id: str
    state: ReplayState
    verdict: Verdict
    served: Any = None
    replayed: Any = None
    sealed_sha256: str | None = None  # the seal's digest of the result field
    run_sha256: str | None = None  # the chain's digest of the final run's RESULT
    reason: str = ""
    run: RunResult | None = None

    @property
    def matches(self) -> bool:
        return self.state == ReplayState.MATCH

    def describe(self) -> str:
        if self.state == ReplayState.MATCH:
            return "match: the replayed program printed the RESULT the record serves and the chain seals"
        if self.state == ReplayState.DIFFERENT:
            return f"DIFFERENT: {self.reason}"
        return f"{self.state.value}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": self.state.value,
            "match": self.matches,
            "verified": self.verdict.verified,
            "served": self.served,
            "replayed": self.replayed,
            "reason": self.reason,
        }


def recorded_calls(events: list[AuditEvent], attempt: int) -> list[ToolCallRecord]:
    """The tool calls of one attempt, in order, from the audit events."""
    return [
        ToolCallRecord.model_validate(e.data)
        for e in events
        if e.kind == AuditKind.TOOL_CALL and e.attempt == attempt
    ]


def placeholder_registry(names: list[str]) -> ToolRegistry:
    """Tools that exist by name only: in a replay, calls are answered from the record."""

    def make(name: str) -> Any:
        def tool(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"replay never calls {name}")

        tool.__name__ = name
        tool.__doc__ = f"{name} (replayed from the audit record)"
        return tool

    return ToolRegistry.from_functions([make(n) for n in names])


def replay_job(
    evidence: JobEvidence,
    ring: KeyRing,
    pool: SandboxPool,
    settings: Settings,
    verdict: Verdict | None = None,
) -> ReplayOutcome:
    """Verify one job, then re-run its final program in a fresh sandbox from ``pool``, under the
    policy of ``settings`` (this machine's). ``verdict`` is ``verify_job(evidence, ring)`` when the
    caller has it already (a batch verifies every chain in one pass first); it is not re-checked.

    Raises only for infrastructure (SandboxError, SandboxUnavailableError), like ProgramRuntime.run.
    """
    if verdict is None:
        verdict = verify_job(evidence, ring)
    if verdict.state == VerdictState.MISMATCHED:
        return ReplayOutcome(
            evidence.job_id, ReplayState.UNVERIFIED, verdict, reason="; ".join(verdict.problems)
        )
    if verdict.state != VerdictState.VERIFIED:
        why = (
            "no record"
            if verdict.state == VerdictState.MISSING
            else f"the job has not ended ({verdict.status})"
        )
        return ReplayOutcome(evidence.job_id, ReplayState.MISSING, verdict, reason=why)
    record = JobRecord.from_hash(evidence.record)
    result, spec = record.result, record.spec
    if result is None or spec is None:  # verified, yet not readable (written before the record caps)
        why = f"the record cannot be read: {record.unreadable or 'no spec or result'}"
        return ReplayOutcome(evidence.job_id, ReplayState.SKIPPED, verdict, reason=why)
    if result.status != JobStatus.SUCCEEDED or not result.final_program:
        why = _nothing_to_rerun(result, spec.mode)
        return ReplayOutcome(evidence.job_id, ReplayState.SKIPPED, verdict, served=result.result, reason=why)
    try:
        config = replay_sandbox(spec.sandbox, settings)
    except InvalidSpecError as e:
        return ReplayOutcome(
            evidence.job_id, ReplayState.REFUSED, verdict, served=result.result, reason=str(e)
        )
    events = [AuditEvent.model_validate_json(entry.event) for entry in evidence.entries]
    final = next(a for a in reversed(result.attempts) if a.program == result.final_program)
    calls = recorded_calls(events, final.number)
    # A call refused before its tool was known (malformed, nested past the cap: recorded as "?") or
    # naming no identifier is refused again the same way; only identifiers can be placeholder tools.
    tools = sorted(name for name in {c.tool for c in calls} | set(spec.tools) if is_tool_name(name))
    run = ProgramRuntime(pool, placeholder_registry(tools)).run(
        result.final_program,
        config=config,
        settings=spec.code_action,
        tools=tools,
        job_id=result.job_id,
        recorded=RecordedAnswers(replay=calls),
        artifacts=_caps_for(result.artifacts),
    )
    sealed = events[-1].data["record"]["fields"].get("result")
    run_digest = next(
        (
            e.data.get("result_sha256")
            for e in reversed(events)
            if e.kind == AuditKind.SANDBOX_RUN and e.attempt == final.number
        ),
        None,
    )
    outcome = ReplayOutcome(
        evidence.job_id,
        ReplayState.MATCH,
        verdict,
        served=result.result,
        replayed=run.result if run.result_found else None,
        sealed_sha256=sealed,
        run_sha256=run_digest,
        run=run,
    )
    problem = _difference(outcome, run, result.artifacts)
    if problem:
        return ReplayOutcome(**{**outcome.__dict__, "state": ReplayState.DIFFERENT, "reason": problem})
    return outcome


# Why a succeeded job of a tool-calling mode is not re-run: it has no final program, and what it did
# cannot be done again without its model (chat) or its session sandbox (shell, destroyed with the job).
_NO_PROGRAM = {
    JobMode.CHAT: "its answer is the model's reply to the recorded tool results",
    JobMode.SHELL: "its commands ran in a session sandbox destroyed with the job",
}


def _nothing_to_rerun(result: JobResult, mode: JobMode) -> str:
    """Why a verified job is skipped: it did not succeed, or its mode runs no final program."""
    if result.status == JobStatus.SUCCEEDED and mode in _NO_PROGRAM:
        return f"a {mode.value} job has no program to re-run ({_NO_PROGRAM[mode]}): verified only"
    return f"the job {result.status.value} with no RESULT to reproduce"


def _caps_for(listed: list[ArtifactInfo]) -> ArtifactCaps:
    """Caps that let the replay hand back at least what the job did."""
    base = ArtifactCaps()
    return ArtifactCaps(
        max_file_bytes=max([base.max_file_bytes, *(a.size for a in listed)]),
        max_total_bytes=max(base.max_total_bytes, sum(a.size for a in listed)),
        max_files=max(base.max_files, len(listed)),
    )


def artifact_difference(listed: list[ArtifactInfo], run: RunResult) -> str:
    """Why the replay's files are not the record's artifacts, or ""."""
    recorded = {a.name: a.sha256 for a in listed}
    replayed = {a.info.name: a.info.sha256 for a in run.artifacts.kept}
    if recorded == replayed:
        return ""
    parts = [f"{n} was not written again" for n in sorted(set(recorded) - set(replayed))]
    parts += [f"{n} is new" for n in sorted(set(replayed) - set(recorded))]
    parts += [
        f"{n} has other bytes (sha256 {replayed[n][:12]}..., recorded {recorded[n][:12]}...)"
        for n in sorted(set(recorded) & set(replayed))
        if recorded[n] != replayed[n]
    ]
    return "the replay's files are not the recorded artifacts: " + "; ".join(parts)


def _difference(outcome: ReplayOutcome, run: RunResult, listed: list[ArtifactInfo] | None = None) -> str:
    """Why the replay does not reproduce the job, or "" when it does on all counts."""
    if not run.result_found:
        return f"the replay printed no RESULT ({run.failure() or 'no RESULT line'})"
    digest = sha256_hex(canonical_json(run.result))
    if run.result != outcome.served:
        return f"the record serves {outcome.served!r}, the replay printed {run.result!r}"
    if digest != outcome.sealed_sha256:
        return "the replayed RESULT is not the one the chain's seal commits to"
    if outcome.run_sha256 is not None and digest != outcome.run_sha256:
        return "the replayed RESULT is not the one the chain recorded for the final run"
    return artifact_difference(listed or [], run)
