"""Deciding approval requests from the producer side: the Python API behind ``sandfleet approvals``.

    client = Client()
    for request in client.approvals():          # pending, oldest first
        print(request.id, request.tool, request.arguments)
    client.approve(request.id)                  # or client.deny(request.id, "not this customer")

A decision is signed with the approver's key (``SANDFLEET_APPROVER_KEY``; ``key=`` names another,
``unsigned=True`` signs nothing, for fleets whose workers allow that): job, request, the call's
SHA-256, the decision, the reason, the name and the time (sandfleet/core/decisions.py). The worker
that acts on it checks the signature against its approvers file first. Recording it is one Lua
script (sandfleet/core/approvals.py): it counts once, it is refused for a request decided before,
past its deadline (then it is recorded as timed out, a denial) or whose job ended (withdrawn), or
whose call hash is not the one signed. When the job was suspended waiting, the same script queues
it again and its message is published here: the job resumes in a fresh sandbox on any worker.
"""

from __future__ import annotations

import getpass
import logging
import socket
from pathlib import Path
from typing import Any

from sandfleet.core.approvals import ApprovalRequest, ApprovalStatus, ApprovalStore
from sandfleet.core.approvers import load_approver_key
from sandfleet.core.decisions import sign_decision
from sandfleet.core.errors import ApprovalDecidedError
from sandfleet.core.signing import WorkerKey

log = logging.getLogger("sandfleet.producer")


def approver_name() -> str:
    """Who decides, by default: ``user@host`` of this process."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (a container without /etc/passwd entry)
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def approval_store(client: Any) -> ApprovalStore:
    """The store on ``client``'s connection (a ``Client``; typed loosely: the client imports this module)."""
    return ApprovalStore(client.redis, client.keys, client.settings.retention_s)


def signing_key(client: Any, key: str | Path | WorkerKey | None, unsigned: bool) -> WorkerKey | None:
    """The approver key a decision is signed with: ``key`` (a loaded key or a path), else the one of
    ``SANDFLEET_APPROVER_KEY``; None with ``unsigned``.

    Raises:
        ApproverKeyError: no key there, unreadable, or readable by others.
    """
    if unsigned:
        return None
    if isinstance(key, WorkerKey):
        return key
    return load_approver_key(key if key is not None else client.settings.approver_key)


def decide(
    client: Any,
    request_id: str,
    decision: ApprovalStatus,
    *,
    by: str | None = None,
    reason: str = "",
    call_sha256: str = "",
    key: str | Path | WorkerKey | None = None,
    unsigned: bool = False,
) -> ApprovalRequest:
    """Sign one decision and record it; resume the job if it waited suspended.

    Raises:
        ApproverKeyError (before anything is written), ApprovalNotFoundError, ApprovalDecidedError,
        ApprovalWithdrawnError, ApprovalMismatchError; QueueUnavailableError when Redis cannot be
        reached.
    """
    approver = signing_key(client, key, unsigned)
    name = by or approver_name()
    with client.redis_errors():
        store = approval_store(client)
        signed = ""
        if approver is not None:  # sign the call the approver names, or else the one the request holds
            current = store.get(request_id)
            signed = sign_decision(
                approver,
                job_id=current.job_id,
                request_id=current.id,
                call_sha256=call_sha256 or current.call_sha256,
                decision="approved" if decision == ApprovalStatus.APPROVED else "denied",
                by=name,
                reason=reason,
            ).text()
            call_sha256 = call_sha256 or current.call_sha256  # recorded only for the call signed
        request, republish = store.decide(
            request_id, decision, by=name, reason=reason, expect_sha256=call_sha256, signed=signed
        )
        if republish:
            try:
                client.publisher.republish(client.reader, request.job_id)
            except Exception as e:  # the job is queued: the workers' reconciliation publishes it
                log.warning("job %s is queued again but its message was not published: %s", request.job_id, e)
    if request.status != decision:  # past its deadline: recorded as timed out (the job resumes denied)
        raise ApprovalDecidedError(
            f"request {request_id} timed out before this decision (its deadline passed): it was denied"
        )
    return request
