"""A suspended job's engine state, so that it resumes where it stopped without its container, its
worker or a model call.

- code-action: the attempt, its program, the conversation, the earlier attempts, the usage, and every
  call the program had completed, the approved ones included (served again from these records, so a
  job suspended twice never runs a call twice);
- shell and chat (``loop``, :class:`LoopState`): the conversation up to the model's reply that asked
  for the gated call, every turn and function call made so far (with their results: they are never
  made again), the calls of that reply still to serve (the gated one first), the wall time used and,
  for shell, the session's ``/workspace`` saved as an archive in the artifact store
  (:class:`WorkspaceArchive`: its SHA-256 is here, so the signed chain commits to it too), and the
  connections its session sandboxes refused so far (a fresh session is made on resume: the job's
  result counts every session's refusals, :func:`carry_refusals`).

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
    Limit,
    NetworkDenial,
    SessionRecord,
    TokenUsage,
    ToolCallRecord,
    TurnRecord,
)
from sandfleet.core.errors import UntrustedStateError


class PendingCall(BaseModel):
    """A function call of the suspended reply not answered yet (the gated one first)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    call_id: str
    name: str
    arguments: str
    announced: bool = Field(False, description="its function_call event is in the chain already")


class WorkspaceArchive(BaseModel):
    """A shell session's /workspace, saved as a tar archive in the artifact store while the job waits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    files: int = Field(0, ge=0)
    skipped: list[str] = Field(default_factory=list, description="entries not saved (links, devices)")


class LoopState(BaseModel):
    """Where a shell or chat job's tool-calling loop stopped for a decision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: str
    turn: int = Field(ge=1, description="the turn whose reply asked for the gated call")
    pending: list[PendingCall]
    turns: list[TurnRecord] = Field(default_factory=list, description="every turn and call so far")
    tool_calls: int = Field(0, ge=0, description="calls counted before the first pending one")
    usage: TokenUsage = Field(default_factory=TokenUsage)
    model_s: float = 0.0
    tool_s: float = 0.0
    limits_hit: list[Limit] = Field(default_factory=list)
    budget_refused: bool = False
    sent: int = Field(0, ge=0, description="messages already shown in a model_call event")
    elapsed_s: float = Field(0.0, ge=0, description="wall time used (the wait for a person not counted)")
    workspace: WorkspaceArchive | None = None
    # shell: what the job's earlier session sandboxes refused (absent from older checkpoints: none)
    network_denied: list[NetworkDenial] = Field(default_factory=list)
    refused_total: int = Field(0, ge=0, description="refusals of the earlier sessions, in all")
    refused_unlisted: int = Field(0, ge=0, description="of which network_denied does not itemise")


def carry_refusals(earlier: LoopState | None, record: SessionRecord) -> SessionRecord:
    """``record`` (one session's) with the refusals of the job's sessions before it, which a
    suspension destroyed: a shell job's result and its next checkpoint count every one."""
    if earlier is None:
        return record
    refused = earlier.refused_total > 0 or bool(earlier.network_denied)
    limits = [*record.limits_hit, *([Limit.NETWORK] if refused else [])]
    return record.model_copy(
        update={
            "limits_hit": list(dict.fromkeys(limits)),
            "network_denied": [*earlier.network_denied, *record.network_denied],
            "refused_total": earlier.refused_total + record.refused_total,
            "refused_unlisted": earlier.refused_unlisted + record.refused_unlisted,
        }
    )


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
    loop: LoopState | None = Field(None, description="shell and chat: where the tool loop stopped")

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
