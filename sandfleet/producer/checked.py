"""A final result together with the verdict on it: what the producer serves, and the error it raises
for records their audit chains do not prove (``Client``, ``JobHandle``, ``BatchHandle`` use these).

A record can also be proven and still not be the answer the submitter asked for: whoever can write
Redis can rewrite a queued job's spec and its unsigned entry 0 before a worker takes it, and the
worker then signs an answer to that other question. So the client keeps the SHA-256 of the spec it
submitted (in memory, and in its ledger for later processes: sandfleet/producer/ledger.py) and compares it with
the digest entry 0 commits to (:func:`sandfleet.core.verify.committed_spec_sha256`); a difference
makes the verdict ``mismatched`` and the error :class:`SpecMismatchError`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from sandfleet.core.contracts import JobResult
from sandfleet.core.errors import SpecMismatchError, UnverifiedResultError
from sandfleet.core.signing import KeyRing
from sandfleet.core.verify import JobEvidence, Verdict, VerdictState, committed_spec_sha256, verify_job

MAX_PROBLEMS_SHOWN = 20
OTHER_QUESTION = "the record answers a different question than the one submitted"
DIGEST_SHOWN = 16  # hex digits of a digest in a message


@dataclass(frozen=True)
class CheckedResult:
    """A job's final result together with its verdict; ``result`` is None unless it is verified (and,
    when the submitted spec's digest is known, answers that spec)."""

    job_id: str
    verdict: Verdict
    result: JobResult | None
    other_question: bool = False  # the chain commits to a spec other than the one submitted

    @property
    def verified(self) -> bool:
        return self.verdict.verified


def spec_problem(evidence: JobEvidence, submitted_spec_sha256: str | None) -> str | None:
    """Why the job's chain does not commit to the spec this client submitted; None when it does, or
    when the submitted digest is unknown (``None``) or there is no record to compare."""
    if submitted_spec_sha256 is None or not evidence.entries:
        return None
    committed = committed_spec_sha256(evidence)
    if committed == submitted_spec_sha256:
        return None
    shown = "no spec" if committed is None else f"spec sha256 {committed[:DIGEST_SHOWN]}..."
    return (
        f"{OTHER_QUESTION}: its audit chain commits to {shown}, this client submitted spec sha256 "
        f"{submitted_spec_sha256[:DIGEST_SHOWN]}... (the queued job was rewritten in Redis)"
    )


def with_submitted_spec(verdict: Verdict, problem: str | None) -> Verdict:
    """``verdict``, made ``mismatched`` with ``problem`` when there is one."""
    if problem is None:
        return verdict
    return verdict.model_copy(
        update={"state": VerdictState.MISMATCHED, "problems": [*verdict.problems, problem]}
    )


def checked_verdict(evidence: JobEvidence, ring: KeyRing, submitted_spec_sha256: str | None) -> Verdict:
    """The verdict on one job, including whether it answers the spec submitted (when its digest is known)."""
    return with_submitted_spec(verify_job(evidence, ring), spec_problem(evidence, submitted_spec_sha256))


def checked_result(
    evidence: JobEvidence, ring: KeyRing, submitted_spec_sha256: str | None = None
) -> CheckedResult:
    """Verify one job's evidence, and that it answers the spec submitted (``submitted_spec_sha256``,
    when known); its result is parsed from the very bytes that were verified."""
    problem = spec_problem(evidence, submitted_spec_sha256)
    verdict = with_submitted_spec(verify_job(evidence, ring), problem)
    if not verdict.verified:
        return CheckedResult(evidence.job_id, verdict, None, other_question=problem is not None)
    try:
        result = JobResult.model_validate_json(evidence.record["result"])
    except ValidationError:  # proven, yet past what a reader parses (a worker before the record caps)
        unreadable = "the final record cannot be read back (nested or sized past what a reader parses)"
        return CheckedResult(
            evidence.job_id,
            verdict.model_copy(update={"state": VerdictState.MISMATCHED, "problems": [unreadable]}),
            None,
        )
    return CheckedResult(evidence.job_id, verdict, result)


def unverified_error(checked: list[CheckedResult]) -> UnverifiedResultError:
    """The error for final records that their chains do not prove (each job and why), or that answer
    another spec than the one submitted (SpecMismatchError)."""
    bad = [c for c in checked if c.verdict.state == VerdictState.MISMATCHED]
    problems = [f"{c.job_id}: {p}" for c in bad for p in c.verdict.problems]
    what = f"job {bad[0].job_id}" if len(bad) == 1 else f"{len(bad)} jobs"
    shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
    if any(c.other_question for c in bad):
        return SpecMismatchError(f"{what}: {OTHER_QUESTION}, refusing to serve it: {shown}", problems)
    return UnverifiedResultError(
        f"{what}: the final record is not proven by the audit chain, refusing to serve it: {shown}",
        problems,
    )
