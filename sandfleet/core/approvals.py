"""Approval requests of gated calls: what a person judges, and every change of one, in Redis.

A program's call of a gated tool (sandfleet/worker/approval/) becomes a request bound to the job, the attempt,
the exact call (the SHA-256 of its canonical JSON) and its occurrence in the run. Producers and
workers share this store: approvers decide (:meth:`ApprovalStore.decide`), workers create, consume
and withdraw. Every step is one Lua script (:mod:`sandfleet.core.approval_lua`):

    pending ──approve──▶ approved ──consume──▶ executing ──▶ executed   (the call ran, once)
       │  ╲──deny─────▶ denied                                        (ToolDeniedError in the program)
       │   ╲─deadline─▶ timed_out                                     (a denial)
       └─ the job ends ▶ withdrawn  (also an approved, unused one: it can never run)

A decision on a suspended job moves it back to queued in the same script, and the decider publishes
its message (:class:`~sandfleet.core.publish.JobPublisher`): no worker holds a waiting job, and a
decision made meanwhile is never lost (a decider that dies before publishing leaves a queued job
without a message, which the workers' reconciliation publishes again).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from enum import StrEnum
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict, Field

from sandfleet.core import json_limits
from sandfleet.core.approval_lua import CONSUME, CREATE, DECIDE, SUSPEND, WITHDRAW
from sandfleet.core.chain import sha256_hex
from sandfleet.core.contracts import JobStatus
from sandfleet.core.errors import (
    ApprovalDecidedError,
    ApprovalMismatchError,
    ApprovalNotFoundError,
    ApprovalWithdrawnError,
)
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.replies import text, text_list, text_map, text_or_none

REQUEST_ID_PREFIX = "apr-"

log = logging.getLogger(__name__)


class ApprovalStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    TIMED_OUT = "timed_out"
    WITHDRAWN = "withdrawn"
    EXECUTING = "executing"  # approved and taken by a worker: the call is running (or its worker died)
    EXECUTED = "executed"  # the approved call ran; ``outcome`` is what it returned


class ApprovalRequest(BaseModel):
    """One request as an approver sees it. ``arguments`` are named and redacted (``redacted`` lists the
    fields shown as ``***``); ``call_sha256`` binds the decision to the exact, unredacted call."""

    model_config = ConfigDict(frozen=True)

    id: str
    job_id: str
    batch_id: str | None = None
    question: str
    program: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    redacted: list[str] = Field(default_factory=list)
    call_sha256: str
    attempt: int
    occurrence: int = 1
    worker: str = ""
    asked_at: float
    deadline: float
    status: ApprovalStatus = ApprovalStatus.PENDING
    decided_by: str | None = None
    decided_at: float | None = None
    reason: str | None = None
    executed_at: float | None = None
    outcome: dict[str, Any] | None = Field(None, description="the executed call's reply: ok, value or error")
    decision: str | None = Field(
        None, description="the signed decision as stored (sandfleet/core/decisions.py), unchecked"
    )
    refused: str | None = Field(None, description="why a worker refused the decision, if one did")

    def static_json(self) -> str:
        """The fields fixed when the request is made (stored once, as ``request``)."""
        return self.model_dump_json(
            exclude={
                "status",
                "decided_by",
                "decided_at",
                "reason",
                "executed_at",
                "outcome",
                "decision",
                "refused",
            }
        )

    @classmethod
    def from_hash(cls, fields: dict[str, str]) -> ApprovalRequest:
        data = json_limits.loads(fields["request"], "an approval request", cap=json_limits.MAX_RECORD_DEPTH)
        data["status"] = fields.get("status", "pending")
        for name in ("decided_by", "reason", "decision", "refused"):
            if fields.get(name):
                data[name] = fields[name]
        for name in ("decided_at", "executed_at"):
            if fields.get(name):
                data[name] = float(fields[name])
        if fields.get("outcome"):
            data["outcome"] = json_limits.loads(
                fields["outcome"], "an approval outcome", cap=json_limits.MAX_RECORD_DEPTH
            )
        return cls.model_validate(data)


def _readable(fields: dict[str, str]) -> ApprovalRequest | None:
    """The request, or None (logged) when what Redis holds cannot be read: one planted request past the
    caps must not break every approver's listing."""
    try:
        return ApprovalRequest.from_hash(fields)
    except ValueError as e:  # JsonLimitError, JSONDecodeError, pydantic's ValidationError
        log.warning("an approval request in Redis cannot be read and is left out: %s", str(e)[:200])
        return None


def request_id(job_id: str, attempt: int, call_sha256: str, occurrence: int) -> str:
    """The id of the request for this call: the same call asked again (a redelivery, a resumed run)
    finds the same request instead of making another."""
    digest = hashlib.sha256(f"{job_id}|{attempt}|{call_sha256}|{occurrence}".encode()).hexdigest()
    return REQUEST_ID_PREFIX + digest[:20]


def map_field(attempt: int, call_sha256: str, occurrence: int) -> str:
    return f"{attempt}:{call_sha256}:{occurrence}"


class ApprovalStore:
    """Reads and writes of approval requests under one fleet's keys. Thread-safe."""

    def __init__(self, client: redis.Redis, keys: FleetKeys, retention_s: int) -> None:
        self.redis = client
        self.keys = keys
        self.retention_s = retention_s
        self._create = client.register_script(CREATE)
        self._decide = client.register_script(DECIDE)
        self._suspend = client.register_script(SUSPEND)
        self._consume = client.register_script(CONSUME)
        self._withdraw = client.register_script(WITHDRAW)

    # -- reading ------------------------------------------------------------------------------
    def get(self, rid: str) -> ApprovalRequest:
        """The request, or ApprovalNotFoundError."""
        fields = text_map(self.redis.hgetall(self.keys.approval(rid))) if _safe(rid) else {}
        if not fields or "request" not in fields:
            raise ApprovalNotFoundError(f"no approval request {rid!r} (never made, or past retention)")
        return ApprovalRequest.from_hash(fields)

    def requests(
        self, *, pending_only: bool = True, job_id: str | None = None, limit: int = 100
    ) -> list[ApprovalRequest]:
        """Requests, oldest first: the pending ones (default) or all; with ``job_id``, all of that job's."""
        if job_id is not None:
            ids = text_list(self.redis.hvals(self.keys.job_approvals(job_id)))
        elif pending_only:
            ids = text_list(self.redis.zrange(self.keys.approvals_pending, 0, limit - 1))
        else:
            ids = text_list(self.redis.zrevrange(self.keys.approvals, 0, limit - 1))[::-1]
        pipe = self.redis.pipeline(transaction=False)
        for rid in ids:
            pipe.hgetall(self.keys.approval(rid))
        found = [r for f in pipe.execute() if f and "request" in f and (r := _readable(text_map(f)))]
        if pending_only and job_id is None:
            found = [r for r in found if r.status == ApprovalStatus.PENDING]
        return sorted(found, key=lambda r: r.asked_at)[:limit]

    def job_request_ids(self, job_id: str) -> list[str]:
        return text_list(self.redis.hvals(self.keys.job_approvals(job_id)))

    # -- deciding (approvers and the timeout sweep) -------------------------------------------
    def decide(
        self,
        rid: str,
        decision: ApprovalStatus,
        *,
        by: str,
        reason: str = "",
        expect_sha256: str = "",
        signed: str = "",
    ) -> tuple[ApprovalRequest, bool]:
        """Record a decision (``signed``: the signed decision's JSON, stored beside it for the worker
        to check); returns the request and whether its job must be published again (it was suspended
        waiting and is queued now).

        Raises:
            ApprovalNotFoundError, ApprovalDecidedError (decided before, or past its deadline: timed
            out now), ApprovalWithdrawnError (its job ended), ApprovalMismatchError.
        """
        if decision not in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED, ApprovalStatus.TIMED_OUT):
            raise ValueError(f"a decision is approved, denied or timed_out, not {decision}")
        current = self.get(rid)
        job_id = current.job_id
        batch_id = text_or_none(self.redis.hget(self.keys.job(job_id), "batch_id")) or "-"
        keys = [
            self.keys.approval(rid),
            self.keys.approvals_pending,
            self.keys.job(job_id),
            self.keys.final_guard(job_id),
            self.keys.deliveries(job_id),
            self.keys.batch_counts(batch_id),
            self.keys.status_index(JobStatus.AWAITING_APPROVAL),
            self.keys.status_index(JobStatus.QUEUED),
        ]
        args = [rid, decision.value, by, repr(time.time()), reason, expect_sha256, job_id, signed]
        outcome, detail = text_list(self._decide(keys=keys, args=args))
        if outcome == "missing":
            raise ApprovalNotFoundError(f"no approval request {rid!r} (never made, or past retention)")
        if outcome == "withdrawn":
            raise ApprovalWithdrawnError(
                f"request {rid} was withdrawn: job {job_id} has ended, so the call can never run"
            )
        if outcome == "mismatch":
            raise ApprovalMismatchError(
                f"request {rid} is for the call with hash {detail}, not the one given: nothing decided"
            )
        if outcome == "decided":
            request = self.get(rid)
            if request.status == ApprovalStatus.WITHDRAWN:
                raise ApprovalWithdrawnError(
                    f"request {rid} was withdrawn: job {job_id} has ended, so the call can never run"
                )
            raise ApprovalDecidedError(_decided_text(request))
        # A decision past the deadline is recorded as timed_out: request.status says which it was.
        return self.get(rid), detail == "republish"

    def expire_due(self, now: float | None = None) -> list[tuple[ApprovalRequest, bool]]:
        """Time out every pending request past its deadline; ``(request, republish)`` for each."""
        due = text_list(self.redis.zrangebyscore(self.keys.approvals_pending, 0, now or time.time()))
        timed_out = []
        for rid in due:
            try:
                timed_out.append(
                    self.decide(rid, ApprovalStatus.TIMED_OUT, by="timeout", reason="no decision in time")
                )
            except ApprovalNotFoundError:
                self.redis.zrem(self.keys.approvals_pending, rid)  # expired with its job
            except (ApprovalDecidedError, ApprovalWithdrawnError):
                pass  # decided just now by someone else
        return timed_out

    # -- the worker's side --------------------------------------------------------------------
    def create(self, request: ApprovalRequest) -> tuple[str, str]:
        """Store ``request`` unless its call has one already; ``(outcome, id)`` with outcome created,
        exists (the id of the earlier one), final (the job ended) or missing (no job record)."""
        keys = [
            self.keys.approval(request.id),
            self.keys.job_approvals(request.job_id),
            self.keys.approvals,
            self.keys.approvals_pending,
            self.keys.final_guard(request.job_id),
            self.keys.job(request.job_id),
        ]
        field = map_field(request.attempt, request.call_sha256, request.occurrence)
        args: list[str | float] = [
            request.id,
            field,
            request.static_json(),
            repr(request.asked_at),
            repr(request.deadline),
            request.call_sha256,
            request.job_id,
            self.retention_s,
        ]
        outcome, rid = text_list(self._create(keys=keys, args=args))
        return outcome, rid

    def status(self, rid: str) -> ApprovalStatus | None:
        value = self.redis.hget(self.keys.approval(rid), "status")
        return None if value is None else ApprovalStatus(text(value))

    def consume(self, rid: str, job_id: str, worker: str) -> str:
        """Take an approved request for execution: "go" once; else the status that stops it ("final"
        when the job ended)."""
        keys = [self.keys.approval(rid), self.keys.final_guard(job_id)]
        [outcome] = text_list(self._consume(keys=keys, args=[worker, repr(time.time())]))
        return outcome

    def record_outcome(self, rid: str, outcome: dict[str, Any]) -> None:
        """The executed call's reply, kept so that a re-run of the program is served it, not a second run
        (only while the job's signed chain commits to it: :func:`outcome_sha256`)."""
        self.redis.hset(
            self.keys.approval(rid),
            mapping={"status": ApprovalStatus.EXECUTED.value, "outcome": encode_outcome(outcome)},
        )

    def mark_refused(self, rid: str, problem: str) -> None:
        """Note on the request why a worker refused its decision (``approvals show`` prints it)."""
        self.redis.hset(self.keys.approval(rid), "refused", problem)

    def mark_audited(self, rid: str, what: str) -> bool:
        """True the first time ``what`` (a decision) of ``rid`` is noted as written to the chain."""
        return bool(self.redis.hsetnx(self.keys.approval(rid), f"audited_{what}", "1"))

    def suspend(self, job_id: str, checkpoint_json: str, waiting_for: list[str]) -> str:
        """running -> awaiting_approval with the checkpoint: "suspended"; "decided" when a request was
        decided meanwhile (the job is queued again: publish it); "final", "missing" or "state"."""
        batch_id = text_or_none(self.redis.hget(self.keys.job(job_id), "batch_id")) or "-"
        keys = [
            self.keys.job(job_id),
            self.keys.final_guard(job_id),
            self.keys.checkpoint(job_id),
            self.keys.deliveries(job_id),
            self.keys.batch_counts(batch_id),
            self.keys.status_index(JobStatus.RUNNING),
            self.keys.status_index(JobStatus.AWAITING_APPROVAL),
            self.keys.status_index(JobStatus.QUEUED),
            *(self.keys.approval(rid) for rid in waiting_for),
        ]
        reply = text_list(
            self._suspend(keys=keys, args=[job_id, repr(time.time()), self.retention_s, checkpoint_json])
        )
        return reply[0]

    def checkpoint(self, job_id: str) -> str | None:
        return text_or_none(self.redis.get(self.keys.checkpoint(job_id)))

    def withdraw_job(self, job_id: str) -> list[dict[str, str]]:
        """Withdraw the job's pending and approved-but-unused requests: ``[{"id", "was"}]``."""
        ids = self.job_request_ids(job_id)
        if not ids:
            return []
        keys = [self.keys.approvals_pending, *(self.keys.approval(rid) for rid in ids)]
        flat = text_list(self._withdraw(keys=keys, args=[repr(time.time()), *ids]))
        return [{"id": flat[i], "was": flat[i + 1]} for i in range(0, len(flat), 2)]


def withdraw_job_approvals(client: redis.Redis, keys: FleetKeys, job_id: str) -> list[dict[str, str]]:
    """Withdraw every request of a job that is ending, so none can ever run: the one function every
    job-end path calls before its final write (``JobStore.finish`` does). ``[{"id", "was"}]``."""
    return ApprovalStore(client, keys, retention_s=0).withdraw_job(job_id)


def encode_outcome(outcome: dict[str, Any]) -> str:
    """An executed call's reply as stored: canonical JSON (sorted keys, ASCII, so lone surrogates a tool
    echoed survive), values JSON cannot hold written as their ``str``. Decoding and encoding again gives
    the same text, so the digest of what is served is the digest of what was stored."""
    return json.dumps(outcome, sort_keys=True, separators=(",", ":"), default=str)


def outcome_sha256(outcome: dict[str, Any]) -> str:
    """The digest the executing worker's signed ``executed`` event commits to."""
    return sha256_hex(encode_outcome(outcome))


def call_sha256(call_key: str) -> str:
    """The hash an approval binds: of the call's canonical JSON ``[tool, args, kwargs]``."""
    return sha256_hex(call_key)


def _decided_text(request: ApprovalRequest) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(request.decided_at)) if request.decided_at else "?"
    if request.status == ApprovalStatus.TIMED_OUT:
        return (
            f"request {request.id} timed out at {when} UTC (no decision before its deadline): it was denied"
        )
    if request.status in (ApprovalStatus.EXECUTING, ApprovalStatus.EXECUTED):
        return f"request {request.id} was approved by {request.decided_by} at {when} UTC and its call has run"
    return f"request {request.id} was {request.status.value} by {request.decided_by} at {when} UTC already"


def _safe(rid: str) -> bool:
    return isinstance(rid, str) and 0 < len(rid) <= 64 and all(c.isalnum() or c in "-_" for c in rid)
