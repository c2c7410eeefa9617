"""The approval gate: what the bridge asks before it runs a gated call.

For each call of a gated tool the gate finds or makes the call's request (bound to the job, the
attempt, the call's hash and its occurrence in the run, so a re-run of the same program finds the same
request), then:

- approved: takes it for execution once (Lua), and the bridge runs the tool; the outcome is stored on
  the request, so a later re-run is served that outcome instead of running the tool twice. Whoever
  can write Redis can write an outcome too, so the executing worker first signs an ``executed`` event
  committing to the outcome's digest, and a stored outcome is served only when the job's verified
  chain holds that event (sandfleet/worker/approval/trust.py); otherwise the run is stopped and the job ends
  ``untrusted_state``, nothing served and the call not run again;
- denied or timed out: the program gets ``ToolDeniedError`` with the reason;
- undecided: it waits up to the grace (``approval_grace_s``), then tells the bridge to suspend: the
  program is stopped, its container destroyed, and the job waits in Redis with no slot held.

A decision is acted on only once it is checked (sandfleet/core/decisions.py): signed by an approver
the worker's approvers file lists (``SANDFLEET_APPROVERS_FILE``) and has not revoked, for this job,
this request and the call the program is making now; a decision that is not (unsigned, unknown or
revoked key, a signature that does not verify, signed for another call or request) is refused: the
call is not run, the program gets ``ToolDeniedError`` saying why, and the chain an ``approval``
``refused`` event. Decisions are written to the job's chain by the worker that acts on them, signed
with its key, the approver's signed decision inside: ``approval`` events ``requested``,
``approved``/``denied``/``timed_out`` (who, by the approvers file, the key id, the signed decision),
``refused``, ``executed`` (the outcome's digest), ``resumed``. An approval is written before its call
runs, whatever Redis says of earlier writes.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from sandfleet.core.approvals import (
    ApprovalRequest,
    ApprovalStatus,
    ApprovalStore,
    call_sha256,
    outcome_sha256,
    request_id,
)
from sandfleet.core.approvers import ApproversFile
from sandfleet.core.audit_sink import AuditSink
from sandfleet.core.contracts import AuditKind, JobSpec
from sandfleet.core.decisions import DecisionCheck, Expected, Verdict, check_decision
from sandfleet.core.errors import (
    ApprovalDecidedError,
    ApprovalWithdrawnError,
    ApproverKeyError,
    UntrustedStateError,
)
from sandfleet.core.records import RecordReader
from sandfleet.core.settings import Settings
from sandfleet.core.signing import KeyRing
from sandfleet.worker.approval import webhook
from sandfleet.worker.approval.checkpoint import Checkpoint, CheckpointMismatchError
from sandfleet.worker.approval.policy import approval_patterns, is_gated, named_arguments, redact
from sandfleet.worker.approval.trust import EXECUTED, VerifiedState

log = logging.getLogger("sandfleet.approval")

POLL_S = 0.1  # how often a call in its grace looks for a decision (seconds)
DENIED_ERROR = "ToolDeniedError"
REFUSED = "refused"  # the approval event of a decision that did not hold
_APPROVED = (ApprovalStatus.APPROVED, ApprovalStatus.EXECUTING, ApprovalStatus.EXECUTED)

AdmissionKind = Literal["run", "served", "denied", "suspend", "abandoned", "untrusted"]


@dataclass(frozen=True)
class Admission:
    """What the bridge does with a gated call."""

    kind: AdmissionKind
    request_id: str = ""
    outcome: dict[str, Any] | None = None  # served: the earlier execution's reply
    message: str = ""  # denied: the ToolDeniedError's message; untrusted: why the job ends


class ApprovalService:
    """The worker's approvals: one store, the operator's policy, the webhook. One per worker process.

    ``ring`` gives the keys a job's chain is verified with before its checkpoint or a stored outcome
    is used (``worker_ring``: the pinned set or else this host's keys, and the worker's own key; never
    a key someone added to the register in Redis).
    """

    def __init__(
        self, store: ApprovalStore, settings: Settings, worker: str, ring: Callable[[], KeyRing]
    ) -> None:
        self.store = store
        self.settings = settings
        self.worker = worker
        self.verified = VerifiedState(RecordReader(store.redis, store.keys), ring)
        self.approvers = ApproversFile(settings.approvers_file) if settings.approvers_file else None

    def decisions_problem(self) -> str | None:
        """Why no decision could be accepted here (so a job with gated tools is refused before it
        starts), or None."""
        if self.approvers is None:
            if self.settings.approval_allow_unsigned:
                return None
            return (
                "this worker accepts no decision: it has no approvers file (set SANDFLEET_APPROVERS_FILE "
                "and add approvers with `sandfleet approvers add`), and unsigned decisions are refused "
                "(SANDFLEET_APPROVAL_ALLOW_UNSIGNED)"
            )
        try:
            self.approvers.ring()
        except ApproverKeyError as e:
            return f"this worker cannot check decisions: {e}"
        return None

    def check(self, request: ApprovalRequest, call_sha256: str) -> DecisionCheck:
        """The request's decision checked against the approvers file, for the call hashed ``call_sha256``
        (computed from the call itself). Only approvals and denials carry one; a timeout is the
        workers' own."""
        verdict: Verdict = "approved" if request.status in _APPROVED else "denied"
        expected = Expected(request.job_id, request.id, call_sha256, verdict, request.decided_by or "")
        return check_decision(
            request.decision,
            expected,
            self.approvers,
            allow_unsigned=self.settings.approval_allow_unsigned,
        )

    def patterns(self, spec: JobSpec) -> tuple[str, ...]:
        return approval_patterns(self.settings.approval_tools, spec.approval_tools)

    def gate(self, *, job_id: str, spec: JobSpec, attempt: int, program: str, audit: AuditSink) -> RunGate:
        return RunGate(self, job_id=job_id, spec=spec, attempt=attempt, program=program, audit=audit)

    def resume_point(self, job_id: str) -> Checkpoint | None:
        """The suspended job's checkpoint, checked against its verified chain; None when there is none
        and the job never was suspended.

        Raises:
            UntrustedStateError: the chain does not verify, or does not commit to this checkpoint, or
                says the job was suspended while no checkpoint is stored.
        """
        raw = self.store.checkpoint(job_id)
        if raw is None:
            if self.verified.was_suspended(job_id):
                raise CheckpointMismatchError(
                    "the suspended job's checkpoint is missing (deleted, or its worker died while "
                    "suspending it) though its audit chain says it waited for a decision; not started "
                    "afresh, which would make its calls again"
                )
            return None
        return self.verified.checkpoint(job_id, raw)

    def audit_decisions(self, job_id: str, audit: AuditSink, attempt: int) -> None:
        """Write every denial and timeout of the job's requests the chain does not have yet (a resumed
        job); an approval is written by the gate as it takes the call to run."""
        for rid in self.store.job_request_ids(job_id):
            try:
                request = self.store.get(rid)
            except KeyError:
                continue
            if request.status == ApprovalStatus.DENIED:
                check = self.check(request, request.call_sha256)
                note_decision(self.store, request, audit, attempt, check)
            elif request.status == ApprovalStatus.TIMED_OUT:
                note_decision(self.store, request, audit, attempt, None)

    def expire(self, publish: Callable[[str], Any]) -> int:
        """Time out overdue requests; publish the jobs they free (the sweep calls this). Returns how many."""
        timed_out = self.store.expire_due()
        for request, republish in timed_out:
            log.info("approval request %s of job %s timed out", request.id, request.job_id)
            if republish:
                publish(request.job_id)
        return len(timed_out)


class RunGate:
    """The gate of one program run (thread-safe: calls arrive from the program's threads)."""

    def __init__(
        self,
        service: ApprovalService,
        *,
        job_id: str,
        spec: JobSpec,
        attempt: int,
        program: str,
        audit: AuditSink,
    ) -> None:
        self.service = service
        self.store = service.store
        self.job_id = job_id
        self.spec = spec
        self.attempt = attempt
        self.program = program
        self.audit = audit
        self.patterns = service.patterns(spec)
        self._occurrences: dict[str, int] = {}
        self._tools: dict[str, tuple[str, str]] = {}  # request id -> (tool, call sha256), for `executed`
        self._lock = threading.Lock()

    def gates(self, tool: str) -> bool:
        return is_gated(tool, self.patterns)

    def admit(
        self,
        call_key: str,
        tool: str,
        bound: inspect.BoundArguments | None,
        args: list[Any],
        kwargs: dict[str, Any],
        closed: threading.Event,
        occurrence: int | None = None,
    ) -> Admission:
        """Find or make the call's request and wait (at most the grace) for what to do with it.
        ``occurrence``: the call's own number in the job, where it has one that a resumed run keeps
        (a tool loop's call number); by default the count of this same call in the run so far."""
        sha = call_sha256(call_key)
        with self._lock:
            if occurrence is None:
                occurrence = self._occurrences.get(sha, 0) + 1
                self._occurrences[sha] = occurrence
            rid = request_id(self.job_id, self.attempt, sha, occurrence)
            self._tools[rid] = (tool, sha)
        settings = self.service.settings
        shown, hidden = redact(named_arguments(bound, args, kwargs), settings.approval_redact)
        now = time.time()
        request = ApprovalRequest(
            id=rid,
            job_id=self.job_id,
            batch_id=self.spec.batch_id,
            question=self.spec.question,
            program=self.program,
            tool=tool,
            arguments=shown,
            redacted=hidden,
            call_sha256=sha,
            attempt=self.attempt,
            occurrence=occurrence,
            worker=self.service.worker,
            asked_at=now,
            deadline=now + settings.approval_timeout_s,
        )
        outcome, rid = self.store.create(request)
        if outcome in ("final", "missing"):
            return Admission("denied", rid, message=f"call to {tool} refused: job {self.job_id} has ended")
        if outcome == "exists":  # asked before (a redelivery, a resumed run): its own deadline holds
            request = self.store.get(rid)
        if outcome == "created":
            self.audit.emit(
                AuditKind.APPROVAL,
                {
                    "event": "requested",
                    "id": rid,
                    "tool": tool,
                    "arguments": shown,
                    "redacted": hidden,
                    "call_sha256": sha,
                    "occurrence": occurrence,
                    "deadline": request.deadline,
                },
                self.attempt,
            )
            if settings.approval_webhook_url:
                payload = {"event": "approval.requested", "request": request.model_dump(mode="json")}
                webhook.notify(settings.approval_webhook_url, settings.approval_webhook_secret, payload)
        grace_ends = time.monotonic() + settings.approval_grace_s
        while True:
            admission = self._decided(rid, tool)
            if admission is not None:
                return admission
            if closed.is_set():
                return Admission("abandoned", rid)
            if time.time() > request.deadline:  # no sweep needed to time out a call that is waiting here
                try:
                    self.store.decide(
                        rid, ApprovalStatus.TIMED_OUT, by="timeout", reason="no decision in time"
                    )
                except (ApprovalDecidedError, ApprovalWithdrawnError):
                    pass  # decided meanwhile: the next look sees it
                continue
            if time.monotonic() >= grace_ends:
                return Admission("suspend", rid)
            closed.wait(POLL_S)

    def executed(self, rid: str, reply: dict[str, Any]) -> None:
        """Keep the executed call's reply on its request (served to any re-run instead of a second call):
        first the signed ``executed`` event committing to its digest, then the reply itself, so a
        stored outcome without its event (a worker that died between the two) is never served."""
        with self._lock:
            tool, sha = self._tools.get(rid, ("", ""))
        self.audit.emit(
            AuditKind.APPROVAL,
            {
                "event": EXECUTED,
                "id": rid,
                "tool": tool,
                "call_sha256": sha,
                "ok": bool(reply.get("ok")),
                "outcome_sha256": outcome_sha256(reply),
            },
            self.attempt,
        )
        self.store.record_outcome(rid, reply)

    def _decided(self, rid: str, tool: str) -> Admission | None:
        """What to do now that the request is decided, or None while it waits."""
        status = self.store.status(rid)
        if status is None or status == ApprovalStatus.PENDING:
            return None
        request = self.store.get(rid)
        status = request.status  # one read drives both the check and what follows
        with self._lock:
            sha = self._tools.get(rid, (tool, request.call_sha256))[1]
        if request.status == ApprovalStatus.EXECUTED and request.outcome is not None:
            served = self._served(request)  # verified before anything of it is used
            if served.kind == "served":  # it ran under a decision its worker checked and recorded
                note_decision(self.store, request, self.audit, self.attempt, self.service.check(request, sha))
            return served
        check = None
        if status in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED):
            check = self.service.check(request, sha)
            if not check.accepted:
                return self._refused(request, tool, check)
        if status == ApprovalStatus.APPROVED:
            taken = self.store.consume(rid, self.job_id, self.service.worker)
            if taken == "go":  # the checked decision in the chain before the call runs
                note_decision(self.store, request, self.audit, self.attempt, check, always=True)
                return Admission("run", rid)
            if taken == "final":
                return Admission(
                    "denied", rid, message=f"call to {tool} refused: job {self.job_id} has ended"
                )
            request = self.store.get(rid)  # taken meanwhile by another delivery of the job
            status = request.status
        else:
            note_decision(self.store, request, self.audit, self.attempt, check)
        if status == ApprovalStatus.EXECUTED and request.outcome is not None:
            return self._served(request)
        if status == ApprovalStatus.EXECUTING:
            return Admission(
                "denied",
                rid,
                message=f"the approved call to {tool} (request {rid}) was started by a delivery that died; "
                "an approval runs its call at most once, so it is not run again",
            )
        if status == ApprovalStatus.DENIED:
            why = f": {request.reason}" if request.reason else ""
            by = check.approver if check is not None else request.decided_by
            return Admission("denied", rid, message=f"call to {tool} denied by {by}{why}")
        if status == ApprovalStatus.TIMED_OUT:
            return Admission(
                "denied",
                rid,
                message=f"call to {tool} not approved within {self.service.settings.approval_timeout_s:g} s "
                f"(request {rid} timed out): denied",
            )
        return Admission("denied", rid, message=f"call to {tool} refused: its request {rid} was withdrawn")

    def _refused(self, request: ApprovalRequest, tool: str, check: DecisionCheck) -> Admission:
        """A decision that does not hold: the call never runs, the program is told why, and so are the
        chain (once per request), the request and the log."""
        log.warning("job %s: %s", self.job_id, check.problem)
        if self.store.mark_audited(request.id, "refused"):
            self.audit.emit(
                AuditKind.APPROVAL,
                {
                    "event": REFUSED,
                    "id": request.id,
                    "tool": tool,
                    "call_sha256": request.call_sha256,
                    "status": request.status.value,
                    **check.audit_fields(),
                },
                self.attempt,
            )
            self.store.mark_refused(request.id, check.problem)
        return Admission("denied", request.id, message=f"call to {tool} not run: {check.problem}")

    def _served(self, request: ApprovalRequest) -> Admission:
        """An executed request's stored outcome, served only if the job's verified chain commits to it."""
        try:
            outcome = self.service.verified.outcome(request)
        except UntrustedStateError as e:
            log.warning("job %s: %s", self.job_id, e)
            return Admission("untrusted", request.id, message=str(e))
        return Admission("served", request.id, outcome=outcome)


def note_decision(
    store: ApprovalStore,
    request: ApprovalRequest,
    audit: AuditSink,
    attempt: int,
    check: DecisionCheck | None,
    *,
    always: bool = False,
) -> None:
    """Write the request's decision to the chain (who decided by the approvers file, the key, the
    signed decision, when, why): once, as Redis notes it, or ``always`` (an approval whose call is
    about to run: a note in Redis never stands in for the chain's record of it)."""
    status = request.status
    decision = ApprovalStatus.APPROVED if status in _APPROVED else status
    if decision not in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED, ApprovalStatus.TIMED_OUT):
        return
    if not always and store.redis.hget(store.keys.approval(request.id), f"audited_{decision.value}"):
        return
    accepted = check.audit_fields() if check is not None and check.accepted else {"by": request.decided_by}
    audit.emit(
        AuditKind.APPROVAL,
        {
            "event": decision.value,
            "id": request.id,
            "tool": request.tool,
            "call_sha256": request.call_sha256,
            "at": request.decided_at,
            "reason": request.reason,
            **accepted,
        },
        attempt,
    )
    store.mark_audited(request.id, decision.value)
