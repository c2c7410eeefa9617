"""What a cancel request found, in words a person can act on (``JobHandle.cancel``, ``sandfleet cancel``).

The request itself is :class:`sandfleet.core.cancel.CancelRequests`: a worker ends the job, the
producer only asks (it has no signing key for final records).
"""

from __future__ import annotations

import getpass
import socket
from dataclasses import dataclass

from sandfleet.core.cancel import CancelOutcome


def requester() -> str:
    """``user@host`` of this process, recorded with the request."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (a container without /etc/passwd entry)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class CancelReport:
    """One job's cancel request: ``outcome`` and the job's ``status`` when it was asked."""

    job_id: str
    outcome: CancelOutcome
    status: str

    @property
    def requested(self) -> bool:
        """Whether a request is pending now (made by this call or an earlier one)."""
        return self.outcome in (CancelOutcome.REQUESTED, CancelOutcome.AGAIN)

    def __str__(self) -> str:
        if self.outcome == CancelOutcome.ENDED:
            return f"job {self.job_id} had already ended ({self.status}): nothing to cancel"
        if self.outcome == CancelOutcome.MISSING:
            return f"no record for job {self.job_id} (never submitted, or past retention)"
        again = " (already requested)" if self.outcome == CancelOutcome.AGAIN else ""
        if self.status == "queued":
            return f"job {self.job_id} was queued: cancel requested{again}, it will not start"
        return f"job {self.job_id} was {self.status}: cancel requested{again}, its sandbox is being stopped"


@dataclass(frozen=True)
class BatchCancelReport:
    """A batch's cancel requests, one per job in submission order."""

    batch_id: str
    jobs: list[CancelReport]

    @property
    def requested(self) -> int:
        return sum(r.requested for r in self.jobs)

    @property
    def ended(self) -> int:
        return sum(r.outcome == CancelOutcome.ENDED for r in self.jobs)

    def __str__(self) -> str:
        return (
            f"batch {self.batch_id}: cancel requested for {self.requested} of {len(self.jobs)} jobs "
            f"({self.ended} had already ended)"
        )
