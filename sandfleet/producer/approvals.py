"""Deciding approval requests from the producer side: the Python API behind ``sandfleet approvals``.

    client = Client()
    for request in client.approvals():          # pending, oldest first
        print(request.id, request.tool, request.arguments)
    client.approve(request.id)                  # or client.deny(request.id, "not this customer")

A decision is one Lua script (sandfleet/core/approvals.py): it counts once, it is refused for a
request decided before, past its deadline (then it is recorded as timed out, a denial) or whose job
ended (withdrawn). When the job was suspended waiting, the same script queues it again and its
message is published here: the job resumes in a fresh sandbox on any worker.
"""

from __future__ import annotations

import getpass
import logging
import socket
from typing import Any

from sandfleet.core.approvals import ApprovalRequest, ApprovalStatus, ApprovalStore
from sandfleet.core.errors import ApprovalDecidedError

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


def decide(
    client: Any,
    request_id: str,
    decision: ApprovalStatus,
    *,
    by: str | None = None,
    reason: str = "",
    call_sha256: str = "",
) -> ApprovalRequest:
    """Record one decision and resume the job if it waited suspended.

    Raises:
        ApprovalNotFoundError, ApprovalDecidedError, ApprovalWithdrawnError, ApprovalMismatchError;
        QueueUnavailableError when Redis cannot be reached.
    """
    with client.redis_errors():
        request, republish = approval_store(client).decide(
            request_id, decision, by=by or approver_name(), reason=reason, expect_sha256=call_sha256
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
