"""Signed decisions: an approver's Ed25519 signature over exactly what they decided.

``sandfleet approvals approve/deny`` (:mod:`sandfleet.producer.approvals`) signs, with the approver's
key (:mod:`sandfleet.core.approvers`), the decision's every field: the job, the request, the exact
call's SHA-256 (``call_sha256``: of its canonical JSON, the redacted values included), approved or
denied, the reason, the name given, the key id and the time. The signed message is
``sandfleet-decision-v1\\n`` + the canonical JSON of those fields: the same key type, key ids and
checks as the workers' audit entries (:mod:`sandfleet.core.signing`), and a domain of its own, so a
signature of one kind is never taken for the other.

The decision is stored on its request in Redis (field ``decision``), where whoever can write Redis
can also write one. So the worker that is to act on it checks, before anything runs
(:func:`check_decision`): that it is signed; by a key the approvers file lists and has not revoked;
that the signature verifies; that it was signed for this job and this request (not replayed from
another) and for the call the program is making now (the digest the worker computes from the call
itself, not the one Redis holds); and that it says what the request's status says. Only then is an
approved call run, and the signed decision is written to the job's audit chain first.

Unsigned decisions are refused unless the worker allows them (``SANDFLEET_APPROVAL_ALLOW_UNSIGNED``,
for a fleet moving from unsigned approvals): then the name given is recorded, marked unsigned. A
signature that does not verify is refused either way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandfleet.core import json_limits
from sandfleet.core.approvers import ApproversFile
from sandfleet.core.chain import canonical_json, sha256_hex
from sandfleet.core.errors import ApproverKeyError
from sandfleet.core.signing import KeyStatus, WorkerKey
from sandfleet.core.validation_text import describe_validation_error

DECISION_FORMAT: Literal["sandfleet-decision/1"] = "sandfleet-decision/1"
DECISION_DOMAIN = b"sandfleet-decision-v1\n"
MAX_DECISION_BYTES = 16 * 1024  # a decision is ~600 bytes; a reason is capped below
MAX_REASON_CHARS = 2000
Verdict = Literal["approved", "denied"]


class Decision(BaseModel):
    """What an approver signs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["sandfleet-decision/1"] = DECISION_FORMAT
    job_id: str = Field(max_length=200)
    request_id: str = Field(max_length=64)
    call_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    decision: Verdict
    reason: str = Field("", max_length=MAX_REASON_CHARS)
    by: str = Field(max_length=200, description="the name the approver gave (the approvers file's counts)")
    key_id: str = Field(max_length=64)
    decided_at: float

    def message(self) -> bytes:
        """The bytes signed: the domain, then the canonical JSON of every field."""
        return DECISION_DOMAIN + canonical_json(self.model_dump(mode="json")).encode()


class SignedDecision(BaseModel):
    """A decision and its signature, as stored on the request and recorded in the audit chain."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    decision: Decision
    signature: str = Field(max_length=200)

    def text(self) -> str:
        return canonical_json(self.model_dump(mode="json"))


def sign_decision(
    key: WorkerKey,
    *,
    job_id: str,
    request_id: str,
    call_sha256: str,
    decision: Verdict,
    by: str,
    reason: str = "",
    decided_at: float | None = None,
) -> SignedDecision:
    """The decision signed with the approver's ``key``."""
    body = Decision(
        job_id=job_id,
        request_id=request_id,
        call_sha256=call_sha256,
        decision=decision,
        reason=reason,
        by=by,
        key_id=key.key_id,
        decided_at=time.time() if decided_at is None else decided_at,
    )
    return SignedDecision(decision=body, signature=key.sign(body.message()))


@dataclass(frozen=True)
class DecisionCheck:
    """What a worker found of a request's decision: accepted (by whom, with which key, signed or not),
    or refused (``problem`` says why, in words a person can act on)."""

    accepted: bool
    approver: str = ""  # the approvers file's name for the key; an unsigned decision's given name
    key_id: str | None = None  # the key that signed it (refused: the key it claims, if any)
    signed: SignedDecision | None = None
    problem: str = ""
    raw_sha256: str | None = None  # refused: the digest of what Redis held, for the audit

    def audit_fields(self) -> dict[str, Any]:
        """What the audit chain records of the decision."""
        if not self.accepted:
            return {"problem": self.problem, "key_id": self.key_id, "decision_sha256": self.raw_sha256}
        signed = self.signed.model_dump(mode="json") if self.signed is not None else None
        return {"by": self.approver, "key_id": self.key_id, "signed": signed is not None, "decision": signed}


@dataclass(frozen=True)
class Expected:
    """The decision a worker may act on: for this job, this request, this call, saying this."""

    job_id: str
    request_id: str
    call_sha256: str  # computed by the worker from the call the program is making
    status: Verdict  # what the request's status in Redis says
    declared_by: str = ""  # the request's decided_by (an unsigned decision's only name)


def check_decision(
    raw: str | None, expected: Expected, approvers: ApproversFile | None, *, allow_unsigned: bool
) -> DecisionCheck:
    """Accept the decision stored on a request (``raw``), or say why not. Pure but for reading the
    approvers file (cached by its stat)."""
    what = f"decision for job {expected.job_id} request {expected.request_id}"
    if not raw:
        if allow_unsigned:
            return DecisionCheck(True, approver=expected.declared_by or "?")
        return DecisionCheck(False, problem=_unsigned_problem(what, approvers))
    digest = sha256_hex(raw)
    parsed = _parse(raw)
    if isinstance(parsed, str):
        return DecisionCheck(
            False, problem=f"{what} is not a signed decision ({parsed}): refused", raw_sha256=digest
        )
    body, key_id = parsed.decision, parsed.decision.key_id
    refused = _key_problem(what, key_id, parsed, approvers)
    if refused is None:
        refused = _binding_problem(what, body, expected)
    if refused is not None:
        return DecisionCheck(False, key_id=key_id, problem=refused, raw_sha256=digest)
    if approvers is None:  # _key_problem refuses without a file; said again so python -O keeps it
        return DecisionCheck(
            False, key_id=key_id, problem=f"{what} has no approvers file: refused", raw_sha256=digest
        )
    info = approvers.ring().get(key_id)
    return DecisionCheck(True, approver=info.worker if info else "?", key_id=key_id, signed=parsed)


def _parse(raw: str) -> SignedDecision | str:
    """The signed decision in ``raw``, or why it is not one (sizes and nesting checked first)."""
    if len(raw) > MAX_DECISION_BYTES:
        return f"{len(raw)} characters, more than the {MAX_DECISION_BYTES} a decision may have"
    try:
        return SignedDecision.model_validate(json_limits.loads(raw, "a decision", cap=8))
    except ValidationError as e:
        return describe_validation_error(e, root="decision")[:200]
    except ValueError as e:
        return str(e)[:200]


def _unsigned_problem(what: str, approvers: ApproversFile | None) -> str:
    accepted = (
        f"only decisions signed by an approver in {approvers.source}"
        if approvers is not None
        else "no decision: it has no approvers file (SANDFLEET_APPROVERS_FILE)"
    )
    return (
        f"{what} is not signed: refused. This worker accepts {accepted}; `sandfleet approvals approve` "
        "signs with the approver's key (SANDFLEET_APPROVER_KEY), and SANDFLEET_APPROVAL_ALLOW_UNSIGNED=true "
        "on the workers accepts unsigned ones"
    )


def _key_problem(
    what: str, key_id: str, signed: SignedDecision, approvers: ApproversFile | None
) -> str | None:
    """Why the key or the signature is not good enough, or None."""
    if approvers is None:
        return (
            f"{what} is signed by key {key_id}, but this worker has no approvers file "
            "(SANDFLEET_APPROVERS_FILE): refused"
        )
    try:
        ring = approvers.ring()
    except ApproverKeyError as e:
        return f"{what} cannot be checked: {e}: refused"
    info = ring.get(key_id)
    if info is None:
        return f"{what} is signed by key {key_id}, which is not in {approvers.source}: refused"
    if info.status == KeyStatus.REVOKED:
        return f"{what} is signed by key {key_id} of approver {info.worker}, which is revoked in {approvers.source}: refused"
    if ring.check(key_id, signed.decision.message(), signed.signature) is not None:
        return (
            f"{what}: its signature does not verify with key {key_id} of approver {info.worker} "
            "(the decision was changed after it was signed, or never signed with that key): refused"
        )
    return None


def _binding_problem(what: str, body: Decision, expected: Expected) -> str | None:
    """Why a genuinely signed decision is not one for this request and call, or None."""
    if body.job_id != expected.job_id or body.request_id != expected.request_id:
        return (
            f"{what} was signed for job {body.job_id} request {body.request_id} (a decision replayed from "
            "another request): refused"
        )
    if body.call_sha256 != expected.call_sha256:
        return (
            f"{what} was signed for the call with SHA-256 {body.call_sha256[:16]}..., not the pending call "
            f"({expected.call_sha256[:16]}...): refused"
        )
    if body.decision != expected.status:
        return (
            f"{what}: the request says {expected.status}, its signed decision says {body.decision}: refused"
        )
    return None
