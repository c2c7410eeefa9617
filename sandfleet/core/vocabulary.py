"""The words records use: job states, error kinds, audit event kinds, limits. StrEnums only.

Apart from the contracts (contracts.py re-exports them) so that a command line can offer them as
choices, and the sandbox can name a limit, without building every pydantic model first.
"""

from __future__ import annotations

from enum import StrEnum


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


class ErrorKind(StrEnum):
    """Why a job ended without an answer (``JobResult.error.kind``)."""

    REFUSED = "refused"  # the job asked for something the worker's policy or tools refuse
    INVALID_SPEC = "invalid_spec"  # the message's spec did not validate on the worker
    MODEL = "model"  # the model endpoint failed for good (not a transient error)
    SANDBOX = "sandbox"  # the sandbox could not run the program (not a transient error)
    PROGRAM = "program"  # every attempt's program failed
    NO_PROGRAM = "no_program"  # the last reply held no Python program
    TIMEOUT = "timeout"  # the last attempt's program ran out of time
    TIME_LIMIT = "time_limit"  # the job passed its Celery soft time limit
    CRASH_LOOP = "crash_loop"  # the job killed its worker on every delivery
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"  # transient retries exhausted: no engine
    MODEL_UNAVAILABLE = "model_unavailable"  # transient retries exhausted: no model endpoint
    INTERNAL = "internal_error"  # a bug: the engine raised


class AuditKind(StrEnum):
    """What an audit event records (``AuditEvent.kind``)."""

    STATE = "state"  # the job's status changed
    MODEL_CALL = "model_call"  # one model request and its reply
    PROGRAM = "program"  # the program of an attempt (or that the reply had none)
    SANDBOX_RUN = "sandbox_run"  # how the program ran: exit code, limits, output tails, timings
    TOOL_CALL = "tool_call"  # one bridged tool call and its result
    LIMIT = "limit"  # a limit the run hit
    ERROR = "error"  # the job was refused before any model call


class Limit(StrEnum):
    """A limit a program's run hit (``AttemptRecord.limits_hit``)."""

    TIMEOUT = "timeout"  # the program's wall-clock deadline
    MEMORY = "memory"  # the sandbox's memory limit (the kernel's OOM killer)
    OUTPUT = "output"  # stdout/stderr past the sandbox's output cap
    TOOL_CALLS = "tool_calls"  # the job's tool-call budget
    RESULT_SIZE = "result_size"  # a RESULT payload past its size cap
