"""Verify before use: state a worker reads back from Redis is used only when the job's verified audit
chain commits to it.

Redis holds a suspended job's checkpoint (what a resumed run executes, with the calls it is served)
and each approved call's stored outcome (served instead of running the call twice), and whoever can
write Redis can change both. What they cannot do without a key of the worker's key set is sign an
entry. So before a worker resumes a checkpoint or serves an outcome, it reads the job's record and
chain in one snapshot, verifies them (links, Ed25519 signatures with the keys of
:func:`~sandfleet.core.key_registry.worker_ring`: the pinned key set or else the keys made on this
host, never a key added to the register in Redis; each signer's ``running`` event:
:func:`~sandfleet.core.verify.verify_job`) and looks for the signed event committing to the digest:

- a checkpoint: the chain's last ``awaiting_approval`` state event (``checkpoint_sha256``);
- an approved call's outcome: its ``approval`` ``executed`` event (``outcome_sha256``), which the
  worker that ran the call signs before it stores the outcome.

Anything else raises :class:`~sandfleet.core.errors.UntrustedStateError`: nothing of that state is
used, and the job ends ``untrusted_state``. The check costs one Ed25519 verification per entry
(~130 us on this host): a few milliseconds for a resumed job, paid only when state is read back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sandfleet.core.approvals import ApprovalRequest, outcome_sha256
from sandfleet.core.contracts import AuditEvent, AuditKind, JobStatus
from sandfleet.core.errors import UntrustedStateError
from sandfleet.core.records import RecordReader
from sandfleet.core.signing import KeyRing
from sandfleet.core.verify import verify_job
from sandfleet.worker.approval.checkpoint import Checkpoint, load_checkpoint

EXECUTED = "executed"  # the approval event that commits to an executed call's outcome
AWAITING = JobStatus.AWAITING_APPROVAL.value


class VerifiedState:
    """Reads a job's chain, verifies it with ``ring()`` (called per check: rotations and revocations
    apply at once), and hands out only state a signed event of it commits to."""

    def __init__(self, reader: RecordReader, ring: Callable[[], KeyRing]) -> None:
        self._reader = reader
        self._ring = ring

    def events(self, job_id: str, what: str) -> list[AuditEvent]:
        """The job's events, index = chain position, once its record and chain verify.

        Raises:
            UntrustedStateError: the chain does not hold (``what`` names the state refused).
        """
        evidence = self._reader.evidence(job_id)
        verdict = verify_job(evidence, self._ring())
        if not verdict.holds:
            raise UntrustedStateError(
                f"{what} is not used: the job's audit chain does not verify ({'; '.join(verdict.problems)})"
            )
        return [AuditEvent.model_validate_json(entry.event) for entry in evidence.entries]

    def was_suspended(self, job_id: str) -> bool:
        """Whether the job's chain holds an ``awaiting_approval`` state event after entry 0. Read without
        verifying: a yes only ever refuses (a job whose checkpoint is gone is not started afresh, which
        would make its calls again), so a planted event can deny, never grant."""
        for entry in self._reader.audit_entries(job_id)[1:]:
            if AWAITING not in entry.event:  # most events: no parse
                continue
            event = AuditEvent.model_validate_json(entry.event)
            if event.kind == AuditKind.STATE and event.data.get("status") == AWAITING:
                return True
        return False

    def checkpoint(self, job_id: str, raw: str) -> Checkpoint:
        """The suspended job's checkpoint ``raw``, if a signed event of its verified chain commits to it.

        Raises:
            UntrustedStateError: the chain does not verify, or commits to another checkpoint (or none).
        """
        return load_checkpoint(raw, self.events(job_id, "the suspended job's checkpoint"))

    def outcome(self, request: ApprovalRequest) -> dict[str, Any]:
        """The executed call's stored outcome, if the signed ``executed`` event of its request commits to it.

        Raises:
            UntrustedStateError: the chain does not verify, has no such event, or another digest.
        """
        what = f"the stored outcome of approval request {request.id} ({request.tool})"
        if request.outcome is None:
            raise UntrustedStateError(f"{what} is missing")
        committed = committed_outcome(self.events(request.job_id, what), request.id)
        if committed is None:
            raise UntrustedStateError(
                f"{what} is not served: the job's verified audit chain has no signed '{EXECUTED}' event for "
                "it, so no worker of this fleet ran the call and stored that outcome; the call is not run "
                "again either"
            )
        actual = outcome_sha256(request.outcome)
        if actual != committed:
            raise UntrustedStateError(
                f"{what} is not served: its SHA-256 is {actual[:16]}..., the signed '{EXECUTED}' event "
                f"commits to {committed[:16]}... (the stored outcome was changed); the call is not run again"
            )
        return request.outcome


def committed_outcome(events: list[AuditEvent], request_id: str) -> str | None:
    """The outcome digest the chain's signed ``executed`` event of ``request_id`` commits to (entry 0,
    the producer's unsigned event, never counts); None when there is none."""
    for event in reversed(events[1:]):
        if (
            event.kind == AuditKind.APPROVAL
            and event.data.get("event") == EXECUTED
            and event.data.get("id") == request_id
        ):
            digest = event.data.get("outcome_sha256")
            return digest if isinstance(digest, str) else None
    return None
