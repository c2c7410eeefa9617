"""What crosses the queue and lands in Redis: job specs, results and audit events.

Frozen pydantic models, unknown fields refused, a schema version. Only JSON crosses the queue.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sandfleet.core.config import CodeActionSettings, SandboxConfig, ToolLoopSettings

SCHEMA_VERSION: Literal[1] = 1
MAX_QUESTION_CHARS = 20_000
MAX_HISTORY_TURNS = 50
MAX_HISTORY_CHARS = 100_000
MAX_METADATA_CHARS = 10_000
MAX_TOOLS = 100

_TOOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
_MODEL_NAME = re.compile(r"^[a-z][a-z0-9_-]*:\S+$")
ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    REFUSED = "refused"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATUSES


FINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.TIMED_OUT, JobStatus.REFUSED})


class JobMode(StrEnum):
    """How a job uses the model and the sandbox (``JobSpec.mode``); README "Three modes" says when to use each.

    code-action: the model writes ONE program per attempt; it runs in a fresh sandbox; its RESULT line is
        the answer (repairs capped by ``code_action``).
    shell: a tool-calling loop whose tools are the job's tools plus five sandbox tools on ONE session
        sandbox, made when the job starts and destroyed when it ends (caps in ``tool_loop``).
    chat: a tool-calling loop over the job's tools on the host, no sandbox: the plain-agent baseline.
    """

    CODE_ACTION = "code-action"
    SHELL = "shell"
    CHAT = "chat"

    @property
    def uses_tool_loop(self) -> bool:
        """Whether the job runs the function-calling loop (shell and chat) rather than programs."""
        return self is not JobMode.CODE_ACTION


class ErrorKind(StrEnum):
    """Why a job ended without an answer (``JobResult.error.kind``)."""

    REFUSED = "refused"  # the job asked for something the worker's policy or tools refuse
    INVALID_SPEC = "invalid_spec"  # the message's spec did not validate on the worker
    MODEL = "model"  # the model endpoint failed for good (not a transient error)
    SANDBOX = "sandbox"  # the sandbox could not run the program (not a transient error)
    PROGRAM = "program"  # every attempt's program failed
    NO_PROGRAM = "no_program"  # the last reply held no Python program
    TIMEOUT = "timeout"  # the last attempt's program ran out of time
    AGENT_KILLED = "agent_killed"  # the last attempt's program killed its sandbox's agent (no limit hit)
    TIME_LIMIT = "time_limit"  # the job passed its Celery soft time limit
    CRASH_LOOP = "crash_loop"  # the job killed its worker on every delivery
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"  # transient retries exhausted: no engine
    MODEL_UNAVAILABLE = "model_unavailable"  # transient retries exhausted: no model endpoint
    TOOL_SERVER_UNAVAILABLE = "tool_server_unavailable"  # transient retries exhausted: an MCP server down
    INTERNAL = "internal_error"  # a bug: the engine raised
    LIMIT = "limit"  # a cap of the tool-calling loop ended the job (turns, tool calls, tokens, wall time)
    NO_ANSWER = "no_answer"  # the tool-calling loop's last reply held no answer (empty text)


class AuditKind(StrEnum):
    """What an audit event records (``AuditEvent.kind``)."""

    STATE = "state"  # the job's status changed
    MODEL_CALL = "model_call"  # one model request and its reply
    PROGRAM = "program"  # the program of an attempt (or that the reply had none)
    SANDBOX_RUN = "sandbox_run"  # how the program ran: exit code, limits, output tails, timings
    TOOL_CALL = "tool_call"  # one bridged tool call and its result
    LIMIT = "limit"  # a limit the run hit
    ERROR = "error"  # the job was refused before any model call
    FUNCTION_CALL = "function_call"  # a tool call the model asked for in a tool-calling loop, before it runs
    FUNCTION_RESULT = "function_result"  # what that call returned to the model (or why it was refused)
    SESSION = "session"  # the session sandbox of a shell job: started, died, destroyed (and why)


class Limit(StrEnum):
    """A limit a program's run hit (``AttemptRecord.limits_hit``)."""

    TIMEOUT = "timeout"  # the program's wall-clock deadline
    MEMORY = "memory"  # the sandbox's memory limit (the kernel's OOM killer)
    OUTPUT = "output"  # stdout/stderr past the sandbox's output cap
    TOOL_CALLS = "tool_calls"  # the job's tool-call budget
    RESULT_SIZE = "result_size"  # a RESULT payload past its size cap
    TURNS = "turns"  # the tool-calling loop's cap on model turns
    TOKENS = "tokens"  # the tool-calling loop's cap on tokens (prompt + completion) per job
    WALL_TIME = "wall_time"  # the tool-calling loop's wall-clock cap per job
    IDLE = "idle"  # a session sandbox destroyed after its idle cap (no sandbox tool call for that long)
    LIFETIME = "lifetime"  # a session sandbox destroyed at its lifetime cap (its sandbox timeout)


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


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
    model: str | None = Field(None, description="provider:model; the worker's default when unset")
    sandbox: dict[str, Any] = Field(default_factory=dict, description="SandboxConfig options to override")
    code_action: CodeActionSettings = Field(default_factory=CodeActionSettings)
    tool_loop: ToolLoopSettings = Field(
        default_factory=ToolLoopSettings, description="caps of the shell and chat modes' tool-calling loop"
    )
    batch_id: str | None = None
    metadata: dict[str, str | int | float | bool | None] = Field(default_factory=dict)

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

    @field_validator("batch_id")
    @classmethod
    def _batch_id(cls, v: str | None) -> str | None:
        if v is not None and not ID_PATTERN.match(v):
            raise ValueError(f"batch_id must be 1-128 of letters, digits and _.:-, got {v!r}")
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


class ToolCallRecord(_Strict):
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
    failure: str | None = None
    container_id: str | None = None
    runtime: str | None = None
    timings: dict[str, float] = Field(default_factory=dict)


class FunctionCallRecord(_Strict):
    """One tool call the model asked for in a tool-calling loop (shell and chat modes), as the host ran it.

    ``arguments`` is the JSON text exactly as the model sent it (it may not parse); ``result_size`` and
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


class AuditEvent(_Strict):
    """One entry of a job's audit stream."""

    ts: float
    job_id: str
    attempt: int = 0
    kind: AuditKind
    data: dict[str, Any] = Field(default_factory=dict)


def describe_validation_error(err: ValidationError) -> str:
    """``field: reason`` for each problem, joined by ``; ``."""
    parts = []
    for item in err.errors(include_url=False):
        where = ".".join(str(p) for p in item["loc"]) or "spec"
        parts.append(f"{where}: {item['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)
