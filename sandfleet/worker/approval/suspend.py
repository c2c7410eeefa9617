"""Suspending a job whose program waits for a person: the delivery's side.

The engine stopped the program and raised :class:`JobSuspended` with its checkpoint. Here the chain
gets the ``awaiting_approval`` state event (with the checkpoint's digest), then one Lua script moves
the job to ``awaiting_approval`` and stores the checkpoint, unless a request was decided meanwhile:
then the job goes straight back to queued and is published again. Either way the delivery ends and
its message is acknowledged, so a waiting job holds no container, no slot and no broker message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sandfleet.core.approvals import ApprovalStore
from sandfleet.core.audit_sink import AuditSink
from sandfleet.core.chain import sha256_hex
from sandfleet.core.contracts import AuditKind, JobStatus
from sandfleet.core.store import JobStore
from sandfleet.worker.approval.checkpoint import Checkpoint

log = logging.getLogger("sandfleet.approval")


def suspend_job(
    store: JobStore,
    job_id: str,
    checkpoint: Checkpoint,
    audit: AuditSink,
    republish: Callable[[str], Any] | None,
) -> JobStatus | None:
    """Suspend the job (or queue it again at once); the status recorded, None if it had ended."""
    checkpoint_json = checkpoint.model_dump_json()
    audit.emit(
        AuditKind.STATE,
        {
            "status": JobStatus.AWAITING_APPROVAL.value,
            "waiting_for": checkpoint.waiting_for,
            "checkpoint_sha256": sha256_hex(checkpoint_json),
        },
        checkpoint.number,
    )
    approvals = ApprovalStore(store.redis, store.keys, store.settings.retention_s)
    outcome = approvals.suspend(job_id, checkpoint_json, checkpoint.waiting_for)
    if outcome == "suspended":
        log.info("job %s suspended: waiting for %s", job_id, ", ".join(checkpoint.waiting_for))
        return JobStatus.AWAITING_APPROVAL
    if outcome == "decided":
        audit.emit(AuditKind.STATE, {"status": JobStatus.QUEUED.value, "reason": "decided while suspending"})
        if republish is not None:
            republish(job_id)
        return JobStatus.QUEUED
    log.info("job %s not suspended (%s)", job_id, outcome)
    return None
