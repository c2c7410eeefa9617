"""Suspending and resuming a shell or chat job at a gated call: the checkpoint of its tool loop.

A suspended loop's checkpoint (sandfleet/worker/approval/checkpoint.py ``LoopState``) holds the
conversation, every turn and call so far, the calls still to serve and, for shell, the digest of the
saved /workspace and the connections its sessions refused. It is used only when the job's verified chain commits to it (``resume_point``), and
only by a job of the mode that made it.
"""

from __future__ import annotations

import logging

from sandfleet.core.contracts import AuditKind, ErrorKind, JobResult, SessionRecord
from sandfleet.core.errors import UntrustedStateError
from sandfleet.worker.approval.checkpoint import Checkpoint, JobSuspended, WorkspaceArchive, carry_refusals
from sandfleet.worker.engine.job_start import JobStart
from sandfleet.worker.engine.loop_gate import LoopGate, LoopSuspended
from sandfleet.worker.engine.outcome import failed_before_loop
from sandfleet.worker.tools.registry import ToolRegistry

log = logging.getLogger("sandfleet.engine")


def untrusted(start: JobStart, message: str) -> JobResult:
    """The record of a job whose state read back is not what its chain commits to."""
    log.warning("job %s: %s", start.job_id, message)
    return failed_before_loop(start, ErrorKind.UNTRUSTED_STATE, message)


def resume_point(start: JobStart) -> Checkpoint | JobResult | None:
    """The suspended job's verified checkpoint (None: a fresh start), or its untrusted_state record."""
    approvals = start.services.approvals
    if approvals is None:
        return None
    try:
        checkpoint = approvals.resume_point(start.job_id)
    except UntrustedStateError as e:
        return untrusted(start, str(e))
    if checkpoint is None:
        return None
    mode = start.spec.mode.value
    if checkpoint.loop is None or checkpoint.loop.mode != mode:
        return untrusted(
            start, f"the suspended job's checkpoint is not one of a {mode} job's tool loop; not resumed"
        )
    return checkpoint


def note_resumed(start: JobStart, checkpoint: Checkpoint) -> None:
    """The chain's ``resumed`` event, then the decisions it does not hold yet (denials, timeouts)."""
    loop = checkpoint.loop
    assert loop is not None and start.services.approvals is not None
    start.audit.emit(
        AuditKind.APPROVAL,
        {
            "event": "resumed",
            "waiting_for": checkpoint.waiting_for,
            "calls_made": sum(len(t.calls) for t in loop.turns),
            "pending": len(loop.pending),
        },
        checkpoint.number,
    )
    start.services.approvals.audit_decisions(start.job_id, start.audit, checkpoint.number)


def loop_gate(start: JobStart, tools: ToolRegistry) -> LoopGate | None:
    """The job's approval gate (None without an approval service: admission refused gated tools)."""
    approvals = start.services.approvals
    if approvals is None:
        return None
    return LoopGate(approvals, start, tools)


def suspension(
    start: JobStart,
    suspended: LoopSuspended,
    resumed: Checkpoint | None,
    workspace: WorkspaceArchive | None = None,
    session: SessionRecord | None = None,
) -> JobSuspended:
    """The JobSuspended the delivery turns into a waiting job: the loop's state as a checkpoint, with
    (shell) what the destroyed ``session`` and the job's earlier ones refused."""
    update: dict[str, object] = {"mode": start.spec.mode.value, "workspace": workspace}
    if session is not None:
        carried = carry_refusals(resumed.loop if resumed is not None else None, session)
        update |= {
            "network_denied": carried.network_denied,
            "refused_total": carried.refused_total,
            "refused_unlisted": carried.refused_unlisted,
        }
    state = suspended.state.model_copy(update=update)
    checkpoint = Checkpoint(
        number=state.turn,
        program="",
        reply="",
        messages=suspended.messages,
        usage=state.usage,
        waiting_for=[suspended.request_id],
        suspensions=(resumed.suspensions + 1) if resumed is not None else 1,
        loop=state,
    )
    return JobSuspended(checkpoint)
