"""Every error Sandfleet raises on purpose, under one root.

    SandfleetError
    ├── InvalidSpecError          bad input: a spec, an option, a size; nothing was enqueued or run
    │   ├── PolicyViolationError  valid, but beyond what the operator allows
    │   ├── BatchOwnerError       the batch named was created by another submitter: joining it is refused
    │   └── ReplayScriptError     a replay script unreadable or malformed (quotes it: its owner's eyes only)
    ├── TransientError            infrastructure that may come back: retries key on this branch
    │   ├── SandboxUnavailableError   no Docker engine reachable right now
    │   ├── ModelUnavailableError     rate-limited, timed out or 5xx after the retries
    │   ├── QueueUnavailableError     Redis unreachable or full (noeviction)
    │   └── ToolServerUnavailableError   an MCP server whose tool a job names is down
    ├── SandboxError              a sandbox cannot be made as asked (missing runtime, image, filter)
    ├── ModelError                the model endpoint refused the request (4xx other than 429)
    │   ├── ModelTimeBudgetError  the job's model-time budget ran out (not retried)
    │   └── TokenBudgetError      the job's token budget is spent: no further model call
    ├── ToolLoadError             a tools module cannot be loaded
    │   └── McpConfigError        the MCP servers' config file is malformed (line and field named)
    ├── SigningKeyError           a worker's signing key cannot be loaded, made or used (revoked)
    │   └── ApproverKeyError      an approver's key, or the approvers file, cannot be read, made or used
    ├── JsonLimitError            JSON nested past the nesting cap, or a record past its size/depth cap
    ├── UnverifiedResultError     a final record its audit chain does not prove: refused, not served
    │   ├── ArtifactIntegrityError   an artifact's stored bytes are gone or not the ones the chain commits to
    │   └── SpecMismatchError        the chain proves an answer, but to a spec other than the one submitted
    ├── ClientStateError          the client's own state folder (ledger, submitter token) cannot be used
    ├── UntrustedStateError       state a worker read back that the job's verified chain does not commit to
    ├── JobCancelledError         a cancel request stopped the job (the engine unwinds on it)
    ├── ApprovalError             an approval decision that cannot be made
    │   ├── ApprovalNotFoundError     no request with that id
    │   ├── ApprovalDecidedError      decided already (approved, denied, timed out): decisions are once
    │   ├── ApprovalWithdrawnError    the request's job ended: it can never run
    │   ├── ApprovalMismatchError     the call's hash is not the one the approver was shown
    │   └── ApprovalUnverifiedError   the request in Redis is not the one its worker signed
    └── JobNotFoundError          no record for that job id

A failing model-written program is a result, not an exception. Constructors only store their
arguments (passed to ``super().__init__`` so they survive pickling and Celery's serialisation).
"""

from __future__ import annotations


class SandfleetError(Exception):
    """Root of every error Sandfleet raises on purpose."""


class InvalidSpecError(SandfleetError, ValueError):
    """Input refused before anything was enqueued or run."""


class PolicyViolationError(InvalidSpecError):
    """A valid request that the operator's policy does not allow."""


class BatchOwnerError(InvalidSpecError):
    """A job names a batch that another submitter created (or one that records no creator): nothing
    was enqueued. A batch's jobs are the ones its creator submitted (sandfleet/core/batch_creator.py)."""


class ReplayScriptError(InvalidSpecError):
    """A replay script file that cannot be read or is malformed. The message may quote the file, so
    it is shown to the file's owner only, never in the record of a job that did not choose the file."""


class TransientError(SandfleetError):
    """Infrastructure that may come back; the job is retried later."""


class SandboxUnavailableError(TransientError):
    """The sandbox backend cannot be reached (engine down, socket missing)."""


class ModelUnavailableError(TransientError):
    """The model endpoint failed with a retryable error after every retry."""


class QueueUnavailableError(TransientError):
    """Redis is unreachable or refuses writes (out of memory with noeviction)."""


class ToolServerUnavailableError(TransientError):
    """An MCP server that serves a tool the job names is down (it is being restarted)."""


class SandboxError(SandfleetError):
    """A sandbox cannot be made as configured; retrying will not help."""


class ModelError(SandfleetError):
    """The model endpoint refused the request; retrying will not help."""


class ModelTimeBudgetError(ModelError):
    """The job spent its model-time budget (``model_limits.max_model_time``) waiting on the model."""


class TokenBudgetError(ModelError):
    """The job spent its token budget (``model_limits.max_job_tokens``): no further model call starts."""


class ToolLoadError(SandfleetError):
    """A tools module or tool cannot be loaded."""


class McpConfigError(ToolLoadError):
    """The ``mcpServers`` config file cannot be used; the message names the line and the field."""


class SigningKeyError(SandfleetError):
    """A worker's signing key cannot be read, written or used (a revoked key is never used)."""


class ApproverKeyError(SigningKeyError):
    """An approver's private key, a public key given for one, or the operator's approvers file cannot
    be read, written or used (the message names the file and what to do)."""


class JsonLimitError(SandfleetError, ValueError):
    """JSON nested deeper than its cap, or a record larger or deeper than a reader can read back.

    ``args``: the message, the limit's name (``depth``, ``record_bytes``, ``record_depth``), the cap.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "JSON past its cap"

    @property
    def limit(self) -> str:
        return str(self.args[1]) if len(self.args) > 1 else "depth"


class UnverifiedResultError(SandfleetError):
    """A job's final record is not the one its audit chain commits to, or the chain does not hold.

    ``args``: the message, then the problems found (strings), so callers can show them.
    """

    @property
    def problems(self) -> list[str]:
        return list(self.args[1]) if len(self.args) > 1 else []


class ArtifactIntegrityError(UnverifiedResultError):
    """An artifact's stored bytes are missing or differ from the SHA-256 its verified record lists."""


class SpecMismatchError(UnverifiedResultError):
    """The record's chain holds, but its entry 0 commits to a spec other than the one this client
    submitted: the record answers a different question (someone rewrote the queued job in Redis).

    ``args``: the message, then the problems found, as for UnverifiedResultError.
    """


class ClientStateError(SandfleetError):
    """The client's state folder (``SANDFLEET_CLIENT_STATE_DIR``: the submission ledger and the
    submitter token) cannot be read or written; the message names the file and the fix."""


class UntrustedStateError(SandfleetError):
    """State a worker read back from Redis (a suspended job's checkpoint, an approved call's stored
    outcome) that the job's verified audit chain does not commit to: never used; the job ends
    ``untrusted_state``."""


class JobCancelledError(SandfleetError):
    """A cancel request stopped the job: raised inside the engine (a model call, a sandbox start) so
    that it unwinds at once; the delivery records the job ``cancelled``."""


class JobNotFoundError(SandfleetError, KeyError):
    """No record exists for the job id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "job not found"


class ApprovalError(SandfleetError):
    """An approval decision that cannot be made (the message says why)."""


class ApprovalNotFoundError(ApprovalError, KeyError):
    """No approval request has that id (never made, or past retention)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "approval request not found"


class ApprovalDecidedError(ApprovalError):
    """The request was decided already (approved, denied or timed out): a request is decided once."""


class ApprovalWithdrawnError(ApprovalError):
    """The request's job ended (finished, failed, timed out, cancelled): the call can never run."""


class ApprovalMismatchError(ApprovalError):
    """The approver named a call hash other than the request's: the arguments are not the ones shown."""


class ApprovalUnverifiedError(ApprovalError):
    """The request read from Redis is not the one its worker signed (rewritten, or no signed event):
    what an approver was shown may not be the call that would run, so nothing is decided."""
