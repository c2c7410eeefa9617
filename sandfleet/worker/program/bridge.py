"""The host side of the tool bridge: every call a program makes passes here, and only here.

Caps and limits live on this side, never in the stub: the allow-list, the call budget (every
call counts, failed and unknown ones included), request and reply sizes, the nesting cap on
arguments and results (``MAX_JSON_DEPTH``, read from the request's text before it is parsed), the
per-call timeout, the operator's policy hook, and the audit record of each call. A program that
rewrites its stub or writes bytes by hand gets nothing more than the stub would.

A call may be answered from a record instead of its tool: the bridge asks its ``recorded`` source
(sandfleet/worker/program/recorded.py: a replay, a resumed run's completed calls, the memo of
side-effecting calls) "is there a recorded answer for call N?" before it runs anything.

Calls may arrive from several of the program's threads at once: :meth:`ToolBridge.handle` is called
on a thread per call and is thread-safe. Each call's sequence number (and its place in the budget) is
its place in the order the frames were read; records are kept, and reported, as calls finish. The per-call timeout: an
MCP call is cancelled at it; a Python function cannot be stopped, so the program's loop asks
:meth:`ToolBridge.overdue` now and then, which answers a call past ``limits.call_timeout_s`` with a
``TimeoutError`` (recorded so) and drops the function's result when it comes.

The bridge's state has its homes in sandfleet/worker/program/bridge_state.py: the frozen
``BridgeLimits`` (the caps above), the ``BridgeTally`` (what the calls came to, read when the run
ends), ``CallsInFlight`` (the numbering, and the running calls the timeout watches) and the
``ServedCall`` (one call, with its own notes: its approval request, whether its record is audited).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sandfleet.core import json_limits
from sandfleet.core.errors import JsonLimitError
from sandfleet.core.redaction import positional_names, redact_call
from sandfleet.core.run_models import ToolCallRecord
from sandfleet.worker.program.bridge_state import BridgeLimits, BridgeTally, CallsInFlight, ServedCall
from sandfleet.worker.program.recorded import RecordedAnswer, RecordedAnswers, call_digest, call_key
from sandfleet.worker.tools.registry import ToolRegistry
from sandfleet.worker.tools.tool import Tool

STUB_SOURCE = Path(__file__).resolve().parent.parent / "sandbox" / "inside" / "tools_stub.py"
MAX_RECORDED_RESULT_BYTES = 8 * 1024**2
BUDGET_ERROR = "ToolBudgetExceededError"
DENIED_ERROR = "ToolDeniedError"  # a gated call a person denied (or did not approve in time)
MAX_ERROR_CHARS = 8000  # of a tool's error message, for the program and the record
REQUEST_ENVELOPE_DEPTH = 2  # a request object, then its args list (or kwargs object), then the values
REPLY_ENVELOPE_DEPTH = 1  # a reply object, then the value


@dataclass(frozen=True)
class CallRequest:
    """What the policy hook sees of a call before it runs."""

    tool: str
    args: list[Any]
    kwargs: dict[str, Any]
    job_id: str | None
    seq: int


@dataclass(frozen=True)
class PolicyDecision:
    allow: bool
    reason: str = ""


class CallPolicy(Protocol):
    """Decides whether a call may run (e.g. human approval). Runs on the host, before the tool."""

    def __call__(self, request: CallRequest) -> PolicyDecision | bool: ...


def allow_all(request: CallRequest) -> PolicyDecision:
    return PolicyDecision(True)


def stub_module(registry: ToolRegistry, max_request_bytes: int = 0) -> str:
    """The source of ``sandfleet_tools`` for a program allowed exactly ``registry``'s tools."""
    specs = [{"name": t.name, "signature": t.signature, "description": t.description} for t in registry]
    source = STUB_SOURCE.read_text().replace("_TOOLS = []", f"_TOOLS = {json.dumps(specs)}", 1)
    return source.replace("_MAX_REQUEST = 0", f"_MAX_REQUEST = {int(max_request_bytes)}", 1)


class _Refusal(Exception):
    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(error_type, message)
        self.error_type, self.message = error_type, message


class _AlreadyAnswered(Exception):
    """The call was answered with a TimeoutError while its function ran: its result is dropped."""


class _Unanswered(Exception):
    """The run is being suspended (or has ended) while the call waited for a decision: no reply, no record."""


@dataclass
class ToolBridge:
    """Serves one program run's calls. ``handle`` gets a request frame and returns the reply bytes;
    ``tally`` says what the calls came to."""

    registry: ToolRegistry
    limits: BridgeLimits = field(default_factory=BridgeLimits)
    policy: CallPolicy = allow_all
    job_id: str | None = None
    recorded: RecordedAnswers | None = None  # replay, resume, memo: calls answered from a record
    on_call: Callable[[ToolCallRecord], None] | None = None
    gate: Any = None  # sandfleet/worker/approval/gate.py RunGate: asked before a gated call runs
    on_suspend: Callable[[], None] | None = None  # stops the program (waits past the grace, or untrusted)
    redact: tuple[str, ...] = ()  # argument fields its records show as *** (SANDFLEET_APPROVAL_REDACT)
    tally: BridgeTally = field(default_factory=BridgeTally, init=False)
    _calls: CallsInFlight = field(default_factory=CallsInFlight, init=False, repr=False)
    _closed: threading.Event = field(default_factory=threading.Event, init=False, repr=False)

    def close(self) -> None:
        """The run ended: calls still waiting for a decision give up (unanswered, unrecorded)."""
        self._closed.set()

    def __call__(self, header: dict[str, Any], body: bytes, arrival: int | None = None) -> bytes | None:
        return self.handle(header, body, arrival)

    def handle(self, header: dict[str, Any], body: bytes, arrival: int | None = None) -> bytes | None:
        """Serve one call frame; the reply bytes, or None when :meth:`overdue` answered it already.

        ``arrival``: the call's place in the order the frames were read (its sequence number and its
        place in the budget), given when calls are served on several threads; else the next one.
        """
        call = ServedCall(self._calls.number(arrival), time.perf_counter())
        try:
            self._check_frame(header, body)
            call.request_id, call.tool, call.args, call.kwargs = self._parse(body)
            self._check_call(call)
            value, replayed = self._run(call)
            reply = _value_reply(call.tool, call.request_id, value)
            if len(reply) > self.limits.max_response_bytes:
                raise _Refusal(
                    "ValueError",
                    f"tool {call.tool} returned {len(reply)} bytes, more than the "
                    f"{self.limits.max_response_bytes}-byte limit",
                )
            self._record(call, value=value, size=len(reply), replayed=replayed)
            return reply
        except (_AlreadyAnswered, _Unanswered):
            return None
        except _Refusal as e:
            return self._fail(call, e.error_type, e.message)
        except Exception as e:  # the tool's own exception reaches the program, type name and message kept
            return self._fail(call, type(e).__name__, _message(e))

    def _check_frame(self, header: dict[str, Any], body: bytes) -> None:
        """Refuse a frame the agent marked oversize or malformed, or one past the request size."""
        if header.get("oversize") is not None:
            raise _Refusal(
                "ValueError",
                f"tool request of {header['oversize']} bytes exceeds the {self.limits.max_request_bytes}-byte limit",
            )
        if header.get("malformed"):
            self.tally.protocol_error()
            raise _Refusal("ConnectionError", str(header["malformed"]))
        if len(body) > self.limits.max_request_bytes:
            raise _Refusal(
                "ValueError",
                f"tool request of {len(body)} bytes exceeds the {self.limits.max_request_bytes}-byte limit",
            )

    def _check_call(self, call: ServedCall) -> None:
        """Refuse a call past the budget, of a tool not allowed, or denied by the operator's policy."""
        if call.seq > self.limits.max_calls:
            self.tally.budget_exceeded = True
            raise _Refusal(BUDGET_ERROR, f"tool-call budget of {self.limits.max_calls} exceeded")
        if call.tool not in self.registry:
            allowed = ", ".join(self.registry.names()) or "none"
            raise _Refusal(
                "NameError", f"tool {call.tool!r} is not allowed for this job; allowed tools: {allowed}"
            )
        decision = self.policy(CallRequest(call.tool, call.args, call.kwargs, self.job_id, call.seq))
        if isinstance(decision, bool):
            decision = PolicyDecision(decision)
        if not decision.allow:
            raise _Refusal(
                "PermissionError",
                f"call to {call.tool} denied by policy" + (f": {decision.reason}" if decision.reason else ""),
            )

    def _parse(self, body: bytes) -> tuple[Any, str, list[Any], dict[str, Any]]:
        try:
            request = json_limits.loads(
                body, "a tool argument", envelope=REQUEST_ENVELOPE_DEPTH
            )  # checked before parsing: json's decoder recurses
        except JsonLimitError as e:
            raise _Refusal("ValueError", str(e)) from None
        except (ValueError, UnicodeDecodeError) as e:
            self.tally.protocol_error()
            raise _Refusal("ValueError", f"malformed tool request: {e}") from None
        if not isinstance(request, dict):
            self.tally.protocol_error()
            raise _Refusal("ValueError", "malformed tool request: not an object")
        tool, args, kwargs = request.get("tool"), request.get("args", []), request.get("kwargs", {})
        if not isinstance(tool, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
            self.tally.protocol_error()
            raise _Refusal(
                "ValueError", "malformed tool request: needs tool (str), args (list), kwargs (object)"
            )
        oversize = request.get("oversize")
        if isinstance(oversize, int) and not isinstance(oversize, bool):  # the stub did not send it whole
            raise _Refusal(
                "ValueError",
                f"tool request of {oversize} bytes exceeds the {self.limits.max_request_bytes}-byte limit",
            )
        return request.get("id"), tool[:200], args, kwargs

    def _run(self, call: ServedCall) -> tuple[Any, bool]:
        replaying = self.recorded is not None and self.recorded.replaying
        if not replaying and self.tally.stopping:
            raise _Unanswered()  # the program is being stopped: nothing more runs
        if self.recorded is not None:
            answer = self.recorded.answer(call.seq, call.tool, call.args, call.kwargs, self._has_side_effects)
            if answer is not None:
                return self._served(call, answer), answer.replayed
        approval = None
        if self.gate is not None and self._gated(call.tool):
            approval = self._admit(call)
            if approval is None:
                raise _Unanswered()
            if approval[0] == "served":  # the approved call ran once already: its reply, not a second run
                return approval[1], False
        try:
            value, replayed = self._execute(call)
        except _AlreadyAnswered:
            raise
        except Exception as e:
            if approval is not None:
                self.gate.executed(
                    approval[1], {"ok": False, "type": type(e).__name__, "message": _message(e)}
                )
            raise
        if approval is not None:
            self.gate.executed(approval[1], {"ok": True, "value": value})
        return value, replayed

    def _admit(self, call: ServedCall) -> tuple[str, Any] | None:
        """Ask the gate about a gated call: ("run", request id), ("served", value), or None (unanswered:
        the run suspends or ended). Raises _Refusal(ToolDeniedError) for a denial."""
        tool, args, kwargs = call.tool, call.args, call.kwargs
        tool_obj = self.registry.get(tool)
        try:
            bound = tool_obj.bind(args, kwargs)
        except TypeError:
            if type(tool_obj).call is Tool.call:  # a plain function: a bad call fails before a person sees it
                raise
            bound = None  # MCP tools also take the server's own names: checked when called
        admission = self.gate.admit(call_key(tool, args, kwargs), tool, bound, args, kwargs, self._closed)
        call.approval_id = admission.request_id
        if admission.kind == "run":
            return ("run", admission.request_id)
        if admission.kind == "served":
            outcome = admission.outcome or {}
            if not outcome.get("ok"):
                raise _Refusal(outcome.get("type") or "ToolError", outcome.get("message") or "failed")
            return ("served", outcome.get("value"))
        if admission.kind == "denied":
            raise _Refusal(DENIED_ERROR, admission.message)
        if admission.kind == "suspend":
            if self.tally.suspend(admission.request_id) and self.on_suspend is not None:
                self.on_suspend()
        if admission.kind == "untrusted":  # a stored outcome the chain does not commit to: nothing served
            if self.tally.distrust(admission.message) and self.on_suspend is not None:
                self.on_suspend()
        return None

    def _gated(self, tool: str) -> bool:
        """Whether the call waits for a person: its name is gated and the tool is not read-only."""
        return not self.registry.get(tool).read_only and self.gate.gates(tool)

    def _has_side_effects(self, tool: str) -> bool:
        return self.registry.get(tool).side_effects

    def _served(self, call: ServedCall, answer: RecordedAnswer) -> Any:
        """The value of a recorded answer (raised as the program's error when it records one)."""
        call.quiet = call.quiet or answer.quiet
        if answer.approval_id:
            call.approval_id = answer.approval_id
        if not answer.ok:
            raise _Refusal(answer.error_type or "ToolError", answer.error or "failed")
        return answer.value

    def _execute(self, call: ServedCall) -> tuple[Any, bool]:
        timeout = self.limits.call_timeout_s
        watched = timeout is not None and not self.registry.get(call.tool).stops_at_timeout
        if timeout is not None and watched:
            self._calls.watch(call, time.monotonic() + timeout)
        started = time.perf_counter()
        try:
            value = self.registry.call(call.tool, call.args, call.kwargs, timeout)
        except Exception:
            if self._finished(call.seq, watched, started):
                raise _AlreadyAnswered() from None
            raise
        if self._finished(call.seq, watched, started):
            raise _AlreadyAnswered()
        return value, False

    def _finished(self, seq: int, watched: bool, started: float) -> bool:
        """Account for a call that returned; True when overdue() answered it meanwhile."""
        self.tally.spent(time.perf_counter() - started)
        return watched and not self._calls.returned(seq)

    def overdue(self) -> list[bytes]:
        """Answer every Python tool call past its timeout with a TimeoutError (recorded so)."""
        replies = []
        for call in self._calls.late(time.monotonic()):
            message = (
                f"tool {call.tool} did not return within {self.limits.call_timeout_s:g} s (the per-call "
                "timeout); its result, if it comes, is dropped"
            )
            replies.append(self._fail(call, "TimeoutError", message))
        return replies

    def _fail(self, call: ServedCall, error_type: str, message: str) -> bytes:
        self._record(call, error=(error_type, message))
        return _encode({"id": call.request_id, "ok": False, "type": error_type, "message": message})

    def _record(
        self,
        call: ServedCall,
        *,
        value: Any = None,
        size: int = 0,
        error: tuple[str, str] | None = None,
        replayed: bool = False,
    ) -> None:
        """Keep the call's record (``error``: its type and message; None when it answered ``value``),
        its redacted fields shown as ``***`` beside the digest of the whole call."""
        args, kwargs, hidden = self._redacted(call)
        record = ToolCallRecord(
            seq=call.seq,
            tool=call.tool,
            args=args,
            kwargs=kwargs,
            ok=error is None,
            error_type=error[0] if error else None,
            error=error[1] if error else None,
            result=value if size <= MAX_RECORDED_RESULT_BYTES else None,
            result_size=size,
            duration_ms=(time.perf_counter() - call.began) * 1000,
            replayed=replayed,
            approval_id=call.approval_id,
            redacted=hidden,
            call_sha256=call_digest(call.tool, call.args, call.kwargs),
        )
        self.tally.keep(record, None if call.quiet else self.on_call)

    def _redacted(self, call: ServedCall) -> tuple[list[Any], dict[str, Any], list[str]]:
        """The call's arguments as its record shows them, and the paths hidden."""
        if not self.redact:
            return call.args, call.kwargs, []
        signature = self.registry.get(call.tool).parameters() if call.tool in self.registry else None
        names = positional_names(signature, len(call.args))
        return redact_call(call.args, call.kwargs, self.redact, names)


def _message(e: Exception) -> str:
    """The error's message for the program and the record, its middle cut past MAX_ERROR_CHARS (a
    check's message may quote the whole argument: jsonschema's does, megabytes of it)."""
    text = str(e.args[0]) if isinstance(e, KeyError) and len(e.args) == 1 else str(e)
    if len(text) <= MAX_ERROR_CHARS:
        return text
    half = MAX_ERROR_CHARS // 2
    return f"{text[:half]} ... ({len(text) - 2 * half} characters cut) ... {text[-half:]}"


def _value_reply(tool: str, request_id: Any, value: Any) -> bytes:
    """The reply carrying ``value``, refused if it nests past the cap. Values a tool returned were
    converted under the cap already (sandfleet/worker/tools/values.py); replayed, resumed and approved ones
    come from records, so every reply is checked here, whatever its source."""
    try:
        reply = _encode({"id": request_id, "ok": True, "value": value})
        json_limits.check_depth(reply, f"the value tool {tool} returned", envelope=REPLY_ENVELOPE_DEPTH)
    except (RecursionError, JsonLimitError):  # json's encoder recurses: deeper than ~1000 it raises
        raise _Refusal(
            "ValueError", f"the value tool {tool} returned {json_limits.nested_message()}"
        ) from None
    return reply


def _encode(reply: dict[str, Any]) -> bytes:
    # surrogatepass: a str may hold lone surrogates (a tool echoing what the program sent); the stub's
    # json.loads(bytes) decodes with surrogatepass too, so they round-trip instead of failing here.
    return json.dumps(reply, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
