"""A final result together with the verdict on it: what the producer serves, and the error it raises
for records their audit chains do not prove (``Client``, ``JobHandle``, ``BatchHandle`` use these)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from sandfleet.core.contracts import JobResult
from sandfleet.core.errors import UnverifiedResultError
from sandfleet.core.signing import KeyRing
from sandfleet.core.verify import JobEvidence, Verdict, VerdictState, verify_job

MAX_PROBLEMS_SHOWN = 20


@dataclass(frozen=True)
class CheckedResult:
    """A job's final result together with its verdict; ``result`` is None unless it is verified."""

    job_id: str
    verdict: Verdict
    result: JobResult | None

    @property
    def verified(self) -> bool:
        return self.verdict.verified


def checked_result(evidence: JobEvidence, ring: KeyRing) -> CheckedResult:
    """Verify one job's evidence; its result is parsed from the very bytes that were verified."""
    verdict = verify_job(evidence, ring)
    if not verdict.verified:
        return CheckedResult(evidence.job_id, verdict, None)
    try:
        result = JobResult.model_validate_json(evidence.record["result"])
    except ValidationError:  # proven, yet past what a reader parses (a worker before the record caps)
        problem = "the final record cannot be read back (nested or sized past what a reader parses)"
        return CheckedResult(
            evidence.job_id,
            verdict.model_copy(update={"state": VerdictState.MISMATCHED, "problems": [problem]}),
            None,
        )
    return CheckedResult(evidence.job_id, verdict, result)


def unverified_error(checked: list[CheckedResult]) -> UnverifiedResultError:
    """The error for final records that their chains do not prove (each job and why)."""
    bad = [c for c in checked if c.verdict.state == VerdictState.MISMATCHED]
    problems = [f"{c.job_id}: {p}" for c in bad for p in c.verdict.problems]
    what = f"job {bad[0].job_id}" if len(bad) == 1 else f"{len(bad)} jobs"
    return UnverifiedResultError(
        f"{what}: the final record is not proven by the audit chain, refusing to serve it: "
        + "; ".join(problems[:MAX_PROBLEMS_SHOWN]),
        problems,
    )
