"""Is the approval request an approver is shown the one the worker signed?

``sandfleet approvals show`` reads the request from Redis (``{p}:approval:{id}``), which whoever can
write Redis can rewrite: other arguments shown than the call the program makes, so an approver signs
the genuine call hash believing it is another call. The worker that made the request signed an
``approval`` ``requested`` event committing to its tool, arguments (as shown, redacted), call hash
and occurrence. So the request is compared with that event of the job's verified chain (the reader's
key set: pinned, or the register), and the question with the verified record's spec. The verdict:

- ``verified``: every field matches the signed event;
- ``differs``: the chain holds, and the request in Redis says something else (the fields named);
- ``unverified``: the chain does not verify, or holds no such event yet.

``approvals show`` prints it first; ``Client.approve`` (and so ``approvals approve``) refuses anything
but ``verified``. The worker stores the request a moment before it appends the signed event, so an
approval that finds no event yet looks again for ``SIGNED_EVENT_WAIT_S`` before it refuses. The
program shown is not in the event (the chain's ``program`` events hold each run's): shown as read.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sandfleet.core.approvals import ApprovalRequest
from sandfleet.core.contracts import AuditEvent, AuditKind
from sandfleet.core.records import RecordReader
from sandfleet.core.signing import KeyRing
from sandfleet.core.verify import verify_job

SIGNED_FIELDS = ("tool", "arguments", "redacted", "call_sha256", "occurrence")
SIGNED_EVENT_WAIT_S = 5.0  # the event follows the stored request at once: a live worker is never this slow
NO_SIGNED_EVENT = "the job's verified chain holds no signed 'requested' event for it"
CheckState = Literal["verified", "differs", "unverified"]


@dataclass(frozen=True)
class RequestCheck:
    """The request compared with its signed ``requested`` event."""

    state: CheckState
    detail: str
    differing: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.state == "verified":
            return f"yes: {self.detail}"
        if self.state == "differs":
            return f"NO, REWRITTEN IN REDIS: {', '.join(self.differing)} differ from what the worker signed ({self.detail})"
        return f"UNVERIFIED: {self.detail}"


def check_request(reader: RecordReader, ring: KeyRing, request: ApprovalRequest) -> RequestCheck:
    """Compare ``request`` with the signed ``requested`` event of its job's verified chain."""
    evidence = reader.evidence(request.job_id)
    verdict = verify_job(evidence, ring)
    if not verdict.holds:
        return RequestCheck(
            "unverified", f"the job's audit chain does not verify: {'; '.join(verdict.problems)}"
        )
    signed = None
    for index, entry in enumerate(evidence.entries[1:], start=1):
        if '"requested"' not in entry.event:
            continue
        event = AuditEvent.model_validate_json(entry.event)
        if event.kind == AuditKind.APPROVAL and event.data.get("event") == "requested":
            if event.data.get("id") == request.id:
                signed = (index, event)
    if signed is None:
        return RequestCheck("unverified", NO_SIGNED_EVENT)
    index, event = signed
    differing = [name for name in SIGNED_FIELDS if event.data.get(name) != getattr(request, name)]
    if _spec_question(evidence.record.get("spec")) not in (None, request.question):
        differing.append("question")
    signer = verdict.signers.get(evidence.entries[index].key, "?")
    where = f"event {index} of the job's chain, signed by worker {signer} ({ring.source})"
    if differing:
        return RequestCheck("differs", where, differing)
    return RequestCheck("verified", f"tool, arguments, call hash and question match {where}")


def signed_request(
    read: Callable[[], ApprovalRequest], check: Callable[[ApprovalRequest], RequestCheck]
) -> tuple[ApprovalRequest, RequestCheck]:
    """``read()`` and ``check`` it, looking again while its signed event is not in the chain yet (at
    most ``SIGNED_EVENT_WAIT_S``): the request and its last check, whatever the verdict."""
    gives_up = time.monotonic() + SIGNED_EVENT_WAIT_S
    while True:
        request = read()
        verdict = check(request)
        if verdict.detail != NO_SIGNED_EVENT or time.monotonic() >= gives_up:
            return request, verdict
        time.sleep(0.05)


def _spec_question(spec: str | None) -> str | None:
    if not spec:
        return None
    try:
        question = json.loads(spec).get("question")
    except (ValueError, AttributeError):
        return None
    return question if isinstance(question, str) else None
