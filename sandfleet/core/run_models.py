"""The models one program run makes on its own: its tool calls, its files and their caps.

They are part of the job's contracts (sandfleet/core/contracts.py re-exports them, and its records
nest them), kept apart so that ``sandfleet run`` builds these four models, not the ~20 of the
queue and the records (issue 25: ~15 ms of its start-up).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    """Frozen, unknown fields refused: every model of the records."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ArtifactLimits(Strict):
    """A job's caps on the files it hands back from ``/workspace/out/`` (None: the operator's setting).

    A job may lower the operator's caps (``SANDFLEET_ARTIFACT_MAX_*``), never raise them: a job asking
    for more is refused before anything runs.
    """

    max_file_bytes: int | None = Field(None, ge=0, description="the largest file kept, in bytes")
    max_total_bytes: int | None = Field(None, ge=0, description="bytes kept per job, all files together")
    max_files: int | None = Field(None, ge=0, description="files kept per job")


class ArtifactInfo(Strict):
    """One file a program wrote under ``/workspace/out/``, as the host received and stored it.

    ``name`` is its path relative to that folder (``/``-separated); ``sha256`` is the host's own digest
    of the bytes it stored, which the audit chain commits to.
    """

    name: str
    size: int = Field(ge=0, description="bytes")
    media_type: str
    sha256: str


class SkippedArtifact(Strict):
    """A file under ``/workspace/out/`` that was not kept, and why (over a cap, a symlink, a device)."""

    name: str
    size: int | None = None
    reason: str


class ToolCallRecord(Strict):
    """One call a program made through the bridge, as the host saw it."""

    seq: int
    tool: str
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    ok: bool
    error_type: str | None = None
    error: str | None = None
    result: Any = None
    result_size: int = 0
    duration_ms: float = 0.0
    replayed: bool = False
    approval_id: str | None = Field(None, description="the approval request that let this call run")
    redacted: list[str] = Field(
        default_factory=list, description="argument paths shown as *** (SANDFLEET_APPROVAL_REDACT)"
    )
    call_sha256: str | None = Field(
        None,
        description="SHA-256 of the whole call's canonical JSON [tool, args, kwargs], redacted values "
        "included: what ran, and what a replay matches a redacted call by",
    )
