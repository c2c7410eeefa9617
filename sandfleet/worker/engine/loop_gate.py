"""Approvals in the tool-calling loop (shell and chat): the gate a gated function call passes.

The same gate as a program's bridged call (sandfleet/worker/approval/gate.py ``RunGate``), asked by
the loop instead of the bridge: the call's request is bound to the job, the turn, the call's hash and
its number in the job (``seq``, which a resumed loop keeps, so the same call finds the same request
and a later one never takes an earlier one's outcome), then

- approved: the decision is checked (signed by a listed approver, for this job, request and call),
  written to the chain, and the call runs once; its reply is stored under a signed ``executed`` event;
- denied, timed out, refused: the model gets ``ToolDeniedError: ...`` as the call's result and the
  loop goes on;
- undecided after the grace: the loop stops (:class:`LoopSuspended`), the mode saves what it needs
  (shell: the session's /workspace) and the job waits in Redis with no container;
- a stored outcome the verified chain does not commit to: the job ends ``untrusted_state``.

The approver is shown the model's reply of that turn and the call, its redacted fields as ``***``.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sandfleet.core.audit_sink import AuditSink
from sandfleet.core.contracts import JobSpec
from sandfleet.core.redaction import redact_arguments_text
from sandfleet.worker.approval.checkpoint import LoopState
from sandfleet.worker.approval.gate import Admission, ApprovalService, RunGate
from sandfleet.worker.approval.policy import is_gated
from sandfleet.worker.engine.functions import CallOutcome
from sandfleet.worker.engine.job_start import JobStart
from sandfleet.worker.program.recorded import call_key
from sandfleet.worker.tools.registry import ToolRegistry
from sandfleet.worker.tools.tool import Tool

DENIED_ERROR = "ToolDeniedError"


class LoopSuspended(Exception):
    """The loop stopped at a gated call nobody decided within the grace; ``state`` resumes it."""

    def __init__(self, state: LoopState, messages: list[dict[str, Any]], request_id: str) -> None:
        super().__init__(request_id)
        self.state = state
        self.messages = messages
        self.request_id = request_id


@dataclass(frozen=True)
class GatedCall:
    """A call of a gated tool, as the loop asks the gate about it: where it was asked (turn, seq),
    the tool, its raw arguments text (shown, redacted, to the approver) and their parsed form."""

    turn: int
    seq: int
    name: str
    arguments: str
    args: list[Any]
    kwargs: dict[str, Any]


class LoopGate:
    """The approval gate of one shell or chat job: only the job's own tools (never shell mode's five
    sandbox tools) are gated, by the worker's and the job's patterns, read-only tools never."""

    def __init__(self, service: ApprovalService, start: JobStart, tools: ToolRegistry) -> None:
        """``start``: the job (its id, spec, audit, and the worker's redacted argument fields)."""
        self.service = service
        self.job_id = start.job_id
        self.spec: JobSpec = start.spec
        self.audit: AuditSink = start.audit
        self.redact = tuple(start.services.settings.approval_redact)
        patterns = service.patterns(self.spec)
        self._gated: Collection[str] = frozenset(
            t.name for t in tools if not t.read_only and is_gated(t.name, patterns)
        )
        self._tools = tools
        self._runs: dict[str, RunGate] = {}
        self._never = threading.Event()  # a loop call is never abandoned mid-wait: it ends by itself

    def gates(self, name: str) -> bool:
        return name in self._gated

    def admit(self, call: GatedCall, *, reply: str | None) -> Admission | CallOutcome:
        """Ask the gate about the call (waiting at most the grace); a CallOutcome when the call cannot
        be bound to its tool's signature (a plain function's TypeError, before a person sees it).
        ``reply``: the model's reply of the turn, shown to the approver."""
        turn, name, args, kwargs = call.turn, call.name, call.args, call.kwargs
        tool = self._tools.get(name)
        try:
            bound = tool.bind(args, kwargs)
        except TypeError as e:
            if type(tool).call is Tool.call:
                return CallOutcome(False, error_type="TypeError", error=str(e))
            bound = None  # MCP tools also take the server's own names: checked when called
        gate = self.service.gate(
            job_id=self.job_id,
            spec=self.spec,
            attempt=turn,
            program=self._shown(turn, name, call.arguments, reply),
            audit=self.audit,
        )
        admission = gate.admit(call_key(name, args, kwargs), name, bound, args, kwargs, self._never, call.seq)
        self._runs[admission.request_id] = gate
        return admission

    def executed(self, request_id: str, outcome: CallOutcome) -> None:
        """Keep the approved call's reply (signed ``executed`` event first, then the stored reply)."""
        reply: dict[str, Any] = (
            {"ok": True, "value": outcome.value}
            if outcome.ok
            else {"ok": False, "type": outcome.error_type, "message": outcome.error}
        )
        self._runs[request_id].executed(request_id, reply)

    def _shown(self, turn: int, name: str, arguments: str, reply: str | None) -> str:
        """What the approver reads as the "program": the model's reply of the turn and the call it
        asks for, its redacted argument fields as ``***``."""
        shown, _ = redact_arguments_text(arguments, self.redact)
        said = f"{reply.strip()}\n" if reply and reply.strip() else ""
        return f"{said}# {self.spec.mode.value} job, turn {turn}: the model calls\n{name}({shown})\n"


def outcome_of(admission: Admission) -> CallOutcome:
    """The CallOutcome the model is given for a served or denied admission."""
    if admission.kind == "served":
        stored = admission.outcome or {}
        if stored.get("ok"):
            return CallOutcome(True, value=stored.get("value"))
        return CallOutcome(
            False, error_type=stored.get("type") or "ToolError", error=stored.get("message") or "failed"
        )
    return CallOutcome(False, error_type=DENIED_ERROR, error=admission.message or "denied")
