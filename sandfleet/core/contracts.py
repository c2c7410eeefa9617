"""What crosses the queue and lands in Redis: job specs, results and audit events.

Frozen pydantic models, unknown fields refused, a schema version. Only JSON crosses the queue.
"""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from sandfleet.core.config import CodeActionSettings, SandboxConfig, ToolLoopSettings
from sandfleet.core.model_limits import ModelLimits
from sandfleet.core.priority import MAX_PRIORITY, MIN_PRIORITY

# What a program run makes lives in run_models.py (the run path needs no more); re-exported here.
from sandfleet.core.run_models import ArtifactInfo as ArtifactInfo
from sandfleet.core.run_models import ArtifactLimits as ArtifactLimits
from sandfleet.core.run_models import SkippedArtifact as SkippedArtifact
from sandfleet.core.run_models import Strict as _Strict
from sandfleet.core.run_models import ToolCallRecord as ToolCallRecord
from sandfleet.core.validation_text import describe_validation_error as describe_validation_error

# The words of the records live in vocabulary.py; re-exported here, where the models use them.
from sandfleet.core.vocabulary import FINAL_STATUSES as FINAL_STATUSES
from sandfleet.core.vocabulary import ID_PATTERN as ID_PATTERN
from sandfleet.core.vocabulary import AuditKind as AuditKind
from sandfleet.core.vocabulary import ErrorKind as ErrorKind
from sandfleet.core.vocabulary import JobMode as JobMode
from sandfleet.core.vocabulary import JobStatus as JobStatus
from sandfleet.core.vocabulary import Limit as Limit

SCHEMA_VERSION: Literal[1] = 1
MAX_QUESTION_CHARS = 20_000
MAX_HISTORY_TURNS = 50
MAX_HISTORY_CHARS = 100_000
MAX_METADATA_CHARS = 10_000
MAX_TOOLS = 100

_TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
_TOOL_PATTERN = re.compile(r"^[A-Za-z0-9_*?\[\]!]{1,100}$")  # a tool name or an fnmatch glob of names
_MODEL_NAME = re.compile(r"^[a-z][a-z0-9_-]*:\S+$")


class Turn(_Strict):
    """One earlier turn of the conversation."""

    role: Literal["user", "assistant"]
    content: str


class JobSpec(_Strict):
    """One question for the fleet. Validated by the producer before anything is enqueued."""

    schema_version: Literal[1] = SCHEMA_VERSION
    question: str
    history: list[Turn] = Field(default_factory=list)
    mode: JobMode = JobMode.CODE_ACTION
    tools: list[str] = Field(default_factory=list, description="allow-list of tool names")
    approval_tools: list[str] = Field(
        default_factory=list,
        description="tools (names, globs) this job adds to the operator's approval policy; it cannot remove any",
    )
    model: str | None = Field(None, description="provider:model; the worker's default when unset")
    sandbox: dict[str, Any] = Field(default_factory=dict, description="SandboxConfig options to override")
    code_action: CodeActionSettings = Field(default_factory=CodeActionSettings)
    tool_loop: ToolLoopSettings = Field(
        default_factory=ToolLoopSettings, description="caps of the shell and chat modes' tool-calling loop"
    )
    batch_id: str | None = None
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    artifacts: ArtifactLimits = Field(
        default_factory=ArtifactLimits, description="caps on the files kept from /workspace/out/"
    )
    priority: int | None = Field(
        None,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description="0 (lowest) to 9 (highest); unset: 5 for a single job, 3 in a batch (core/priority.py)",
    )
    model_limits: ModelLimits = Field(
        default_factory=ModelLimits, description="completion tokens per call, tokens and model time per job"
    )
    webhook: str | None = Field(
        None, description="an http(s) URL that gets a signed POST when the job ends (worker's secret)"
    )
    batch_webhook: str | None = Field(
        None, description="an http(s) URL that gets a signed POST when the job's whole batch has ended"
    )

    @field_validator("question")
    @classmethod
    def _question_size(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("question is empty")
        if len(v) > MAX_QUESTION_CHARS:
            raise ValueError(f"question has {len(v)} characters; the limit is {MAX_QUESTION_CHARS}")
        return v

    @field_validator("history")
    @classmethod
    def _history_size(cls, v: list[Turn]) -> list[Turn]:
        if len(v) > MAX_HISTORY_TURNS:
            raise ValueError(f"history has {len(v)} turns; the limit is {MAX_HISTORY_TURNS}")
        total = sum(len(t.content) for t in v)
        if total > MAX_HISTORY_CHARS:
            raise ValueError(f"history has {total} characters; the limit is {MAX_HISTORY_CHARS}")
        return v

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, v: list[str]) -> list[str]:
        if len(v) > MAX_TOOLS:
            raise ValueError(f"{len(v)} tools named; the limit is {MAX_TOOLS}")
        for name in v:
            if not _TOOL_NAME.match(name):
                raise ValueError(f"tool names are Python identifiers, got {name!r}")
        return list(dict.fromkeys(v))

    @field_validator("approval_tools")
    @classmethod
    def _approval_patterns(cls, v: list[str]) -> list[str]:
        if len(v) > MAX_TOOLS:
            raise ValueError(f"{len(v)} approval tools named; the limit is {MAX_TOOLS}")
        for pattern in v:
            if not _TOOL_PATTERN.match(pattern):
                raise ValueError(f"approval tools are tool names or globs like send_*, got {pattern!r}")
        return list(dict.fromkeys(v))

    @field_validator("model")
    @classmethod
    def _model_name(cls, v: str | None) -> str | None:
        if v is not None and not _MODEL_NAME.match(v):
            raise ValueError(f"model must be 'provider:model' (e.g. openai:gpt-5-mini), got {v!r}")
        return v

    @field_validator("sandbox")
    @classmethod
    def _sandbox_options(cls, v: dict[str, Any]) -> dict[str, Any]:
        config = SandboxConfig.model_validate(v)
        return config.model_dump(mode="json", include=set(v))

    @cached_property
    def sandbox_config(self) -> SandboxConfig:
        """The job's sandbox: its ``sandbox`` options over the defaults, parsed once for every reader.

        ``sandbox`` was validated with the spec, so this does not raise for a validated spec. (A copy
        made with ``model_copy(update={"sandbox": ...})`` is validated by nobody: build a new JobSpec.)
        """
        return SandboxConfig.model_validate(self.sandbox)

    @field_validator("batch_id")
    @classmethod
    def _batch_id(cls, v: str | None) -> str | None:
        if v is not None and not ID_PATTERN.match(v):
            raise ValueError(f"batch_id must be 1-128 of letters, digits and _.:-, got {v!r}")
        return v

    @field_validator("webhook", "batch_webhook")
    @classmethod
    def _webhook_url(cls, v: str | None) -> str | None:
        if v is not None:
            from sandfleet.core.webhook_url import check_webhook_url

            return check_webhook_url(v)
        return v

    @model_validator(mode="after")
    def _metadata_size(self) -> JobSpec:
        if len(str(self.metadata)) > MAX_METADATA_CHARS:
            raise ValueError(f"metadata is larger than {MAX_METADATA_CHARS} characters")
        return self


class ErrorInfo(_Strict):
    kind: ErrorKind
    message: str


class TokenUsage(_Strict):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_calls: int = 0

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            model_calls=self.model_calls + other.model_calls,
        )


def _field_of(item: Any, name: str) -> list[Any]:
    value = item.get(name) if isinstance(item, dict) else getattr(item, name, None)
    return list(value or [])


def _count_of(item: Any, name: str) -> int:
    value = item.get(name) if isinstance(item, dict) else getattr(item, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


REFUSED_TOTAL = (
    "connections refused in all (network restricted): the counts of network_denied plus refused_unlisted"
)
REFUSED_UNLISTED = (
    "refusals network_denied does not itemise: the packet filter's past its log rate, counted by its rules"
)


class NetworkDenial(_Strict):
    """One connection the egress proxy or the sandbox's packet filter refused (network "restricted"):
    where to, and why. ``host`` is the name asked of the proxy, or the IP address a packet went to."""

    host: str
    port: int
    reason: str
    method: str | None = None
    sni: str | None = Field(None, description="the TLS server name the program sent, when it differed")
    protocol: str | None = Field(None, description="tcp, udp, icmp...: set for the packet filter's refusals")
    count: int = Field(1, ge=1, description="refusals merged into this entry (the packet filter's, per run)")


class AttemptRecord(_Strict):
    """One program the model wrote and what happened when it ran."""

    number: int
    program: str | None
    reply: str | None = None
    exit_code: int | None = None
    timed_out: bool = False
    result_found: bool = False
    result: Any = None
    result_text: str | None = Field(None, description="the RESULT payload exactly as printed")
    stdout_tail: str = ""
    stderr_tail: str = ""
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    limits_hit: list[Limit] = Field(default_factory=list)
    network_denied: list[NetworkDenial] = Field(default_factory=list)
    refused_total: int = Field(0, ge=0, description=REFUSED_TOTAL)
    refused_unlisted: int = Field(0, ge=0, description=REFUSED_UNLISTED)
    failure: str | None = None
    container_id: str | None = None
    runtime: str | None = None
    timings: dict[str, float] = Field(default_factory=dict)


class FunctionCallRecord(_Strict):
    """One tool call the model asked for in a tool-calling loop (shell and chat modes), as the host ran it.

    ``arguments`` is the JSON text as the model sent it (it may not parse), its redacted fields shown as
    ``***`` (``redacted``, with ``arguments_sha256`` of the text as sent); ``result_size`` and
    ``shown_size`` are bytes of the result's text before and after the cap on what the model is shown.
    """

    seq: int
    turn: int
    call_id: str
    tool: str
    arguments: str
    ok: bool
    error_type: str | None = None
    error: str | None = None
    result: Any = None
    result_size: int = 0
    shown_size: int = 0
    duration_ms: float = 0.0
    redacted: list[str] = Field(
        default_factory=list, description="argument paths shown as *** (SANDFLEET_APPROVAL_REDACT)"
    )
    arguments_sha256: str | None = Field(
        None, description="SHA-256 of the arguments text as the model sent it, when some were redacted"
    )


class TurnRecord(_Strict):
    """One model reply of a tool-calling loop and the calls it asked for."""

    number: int
    reply: str | None = None
    finish_reason: str | None = None
    calls: list[FunctionCallRecord] = Field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0


class SessionRecord(_Strict):
    """The session sandbox of a shell job: which container, how long it lived, and how it ended."""

    container_id: str | None = None
    runtime: str | None = None
    started_s: float = Field(0.0, description="seconds from the job's start to the sandbox's hello")
    lifetime_s: float = Field(0.0, description="seconds the sandbox lived")
    ended: str = Field("", description="why it ended: job ended, died (...), idle cap, lifetime cap")
    limits_hit: list[Limit] = Field(default_factory=list)
    network_denied: list[NetworkDenial] = Field(default_factory=list)
    refused_total: int = Field(0, ge=0, description=REFUSED_TOTAL)
    refused_unlisted: int = Field(0, ge=0, description=REFUSED_UNLISTED)


class JobResult(_Strict):
    """The final record of one job.

    Code-action jobs fill ``attempts``; shell and chat jobs fill ``turns`` (and shell jobs ``session``).
    ``mode`` is None only for a job that ended before an engine ran it (refused, crash loop).
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    job_id: str
    status: JobStatus
    result: Any = None
    final_program: str | None = None
    attempts: list[AttemptRecord] = Field(default_factory=list)
    repairs: int = 0
    tool_calls: int = 0
    usage: TokenUsage = Field(default_factory=TokenUsage)
    timings: dict[str, float] = Field(default_factory=dict, description="seconds by phase")
    error: ErrorInfo | None = None
    model: str | None = None
    mode: JobMode | None = None
    turns: list[TurnRecord] = Field(default_factory=list)
    session: SessionRecord | None = None
    limits_hit: list[Limit] = Field(default_factory=list, description="caps of the tool-calling loop hit")
    artifacts: list[ArtifactInfo] = Field(
        default_factory=list, description="files the final program wrote under /workspace/out/"
    )
    artifacts_skipped: list[SkippedArtifact] = Field(
        default_factory=list, description="files under /workspace/out/ that were not kept, and why"
    )
    network_denied: list[NetworkDenial] = Field(
        default_factory=list,
        description="connections the egress proxy or packet filter refused, all attempts (or the session)",
    )
    refused_total: int = Field(0, ge=0, description=f"{REFUSED_TOTAL}, all attempts (or the session)")
    refused_unlisted: int = Field(0, ge=0, description=f"{REFUSED_UNLISTED}, all attempts (or the session)")

    @model_validator(mode="before")
    @classmethod
    def _network_denied_of_runs(cls, data: Any) -> Any:
        """Filled from the attempts (or the session) when not given: every refusal of the job, listed
        and counted; any refusal puts ``network`` in ``limits_hit``."""
        if isinstance(data, dict) and "network_denied" not in data:
            found: list[Any] = []
            for attempt in data.get("attempts") or []:
                found += _field_of(attempt, "network_denied")
            found += _field_of(data.get("session"), "network_denied")
            if found:
                data = {**data, "network_denied": found}
        for name in ("refused_total", "refused_unlisted"):
            if isinstance(data, dict) and name not in data:
                runs = [*(data.get("attempts") or []), data.get("session")]
                if count := sum(_count_of(run, name) for run in runs):
                    data = {**data, name: count}
        refused = isinstance(data, dict) and (data.get("network_denied") or data.get("refused_total"))
        if refused:  # a refusal is a limit hit, every mode
            limits = list(data.get("limits_hit") or [])
            if Limit.NETWORK not in limits:
                data = {**data, "limits_hit": [*limits, Limit.NETWORK]}
        return data


class AuditEvent(_Strict):
    """One entry of a job's audit stream."""

    ts: float
    job_id: str
    attempt: int = 0
    kind: AuditKind
    data: dict[str, Any] = Field(default_factory=dict)
