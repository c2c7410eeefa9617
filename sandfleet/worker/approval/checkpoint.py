"""A suspended code-action job's engine state, so that it resumes where it stopped without its
container, its worker or a model call: the attempt, its program, the conversation, the earlier
attempts, the usage, and every call the program had completed (served again from these records).

Stored as JSON beside the record (``{p}:job:{id}:checkpoint``), where whoever can write Redis can
change it; its SHA-256 is in the chain's signed ``awaiting_approval`` state event, and the resuming
worker uses it only when that event is in the job's verified chain (sandfleet/worker/approval/trust.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandfleet.core.chain import sha256_hex
from sandfleet.core.contracts import (
    AttemptRecord,
    AuditEvent,
    AuditKind,
    JobStatus,
    TokenUsage,
    ToolCallRecord,
)
from sandfleet.core.errors import UntrustedStateError


class Checkpoint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    number: int = Field(description="the attempt that was suspended (resumed without a model call)")
    program: str
    reply: str
    messages: list[dict[str, Any]]
    attempts: list[AttemptRecord] = Field(default_factory=list)
    usage: TokenUsage = Field(default_factory=TokenUsage)
    phase: dict[str, float] = Field(default_factory=dict)
    memo: dict[str, list[Any]] = Field(default_factory=dict)
    calls: list[ToolCallRecord] = Field(default_factory=list, description="completed calls of the attempt")
    waiting_for: list[str] = Field(default_factory=list, description="approval request ids")
    suspensions: int = 1

    def digest(self) -> str:
        return sha256_hex(self.model_dump_json())


class JobSuspended(Exception):
    """Raised by the engine when a run stopped to wait for decisions; the delivery suspends the job."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint)
        self.checkpoint = checkpoint


class CheckpointMismatchError(UntrustedStateError):
    """The stored checkpoint is not the one the chain's awaiting_approval event commits to."""


def load_checkpoint(raw: str, events: list[AuditEvent]) -> Checkpoint:
    """The checkpoint if its digest is the one in the last awaiting_approval event of ``events``,
    which must be the job's VERIFIED chain (every entry after the producer's entry 0 signed): the
    digest is compared before the stored text is even parsed.

    Raises:
        CheckpointMismatchError: no such event, or another digest (the stored state was changed).
    """
    committed = next(
        (
            e.data.get("checkpoint_sha256")
            for e in reversed(events[1:])
            if e.kind == AuditKind.STATE and e.data.get("status") == JobStatus.AWAITING_APPROVAL.value
        ),
        None,
    )
    if committed is None:
        raise CheckpointMismatchError(
            "the suspended job's checkpoint is not used: the job's verified audit chain has no signed "
            "awaiting_approval event committing to a checkpoint; not resumed"
        )
    if committed != sha256_hex(raw):
        raise CheckpointMismatchError(
            "the suspended job's checkpoint is not the one its verified audit chain commits to (the stored "
            "checkpoint was changed); not resumed"
        )
    return Checkpoint.model_validate_json(raw)
