"""The words records use: job states, job modes, error kinds, audit event kinds, limits (StrEnums),
and the alphabet of ids.

Apart from the contracts (contracts.py re-exports them) so that a command line can offer them as
choices, and the sandbox can name a limit, without building every pydantic model first.
"""

from __future__ import annotations

import re
from enum import StrEnum

# Job and batch ids become part of Redis key names (sandfleet/core/redis_keys.py): a safe alphabet.
ID_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    REFUSED = "refused"
    CANCELLED = "cancelled"  # someone asked for it to stop (`sandfleet cancel`): final, like the others
    AWAITING_APPROVAL = "awaiting_approval"  # suspended for a decision: no container, no slot, not final

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATUSES


FINAL_STATUSES = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.TIMED_OUT, JobStatus.REFUSED, JobStatus.CANCELLED}
)


class JobMode(StrEnum):
    """How a job uses the model and the sandbox (``JobSpec.mode``); docs/modes.md says when to use each.

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
    CANCELLED = "cancelled"  # a cancel request ended the job (before it started, or while it ran)
    UNTRUSTED_STATE = "untrusted_state"  # state read back that the job's verified chain does not commit to
    RECORD_LIMIT = "record_limit"  # the final record would be too large or deep to read back: not kept


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
    ARTIFACTS = (
        "artifacts"  # the files kept from /workspace/out/ (name, size, media type, sha256) and those skipped
    )
    CANCEL = (
        "cancel"  # a running job was stopped by a cancel request: its sandboxes killed, model call dropped
    )
    APPROVAL = "approval"  # a gated call's request: requested, decided, resumed (core/approvals.py)
    WEBHOOK = "webhook"  # the completion webhook's delivery: sent (status, tries) or given up


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
    NETWORK = "network"  # the egress proxy or packet filter refused a connection (network_denied)
    ARTIFACTS = "artifacts"  # files in /workspace/out/ past the per-file, per-job or file-count cap (skipped)
    MODEL_TIME = "model_time"  # the job's model-time budget (model_limits.max_model_time) ran out
    NESTING = "nesting"  # a RESULT (or an answer) nested past the JSON nesting cap (core/json_limits.py)
