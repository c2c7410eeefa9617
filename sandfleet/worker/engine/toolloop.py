"""The tool-calling loop of shell and chat jobs, over the OpenAI chat API's function calling.

    question -> model -> tool calls -> run each (host tools, sandbox tools) -> results -> model -> ...
                  |                                                                     |
                  +------ a reply with no tool call: the answer (its RESULT line) <-----+

Caps (``ToolLoopSettings``), each ending the job with a clear error and a ``limits_hit`` entry:

- turns: at most ``max_turns`` model replies; a last reply that still asks for calls is not run.
- tool calls, as in code-action: every call counts (failed, unknown and malformed ones too); a call
  past ``max_tool_calls`` is refused with ``ToolBudgetExceededError`` and the model gets one more
  turn to answer; a reply that asks for calls after that ends the job.
- tokens: prompt + completion over the job; past ``max_tokens`` no further call runs.
- wall time: ``wall_timeout`` seconds from the start; each model request's timeout and each
  command's timeout are bounded by what is left.

Audit: every model call (``model_call``), every call the model asked for before it runs
(``function_call``) and what it returned (``function_result``), the redacted argument fields
(``SANDFLEET_APPROVAL_REDACT``) shown as ``***`` in all three. A model that fails for good ends the
job ``failed`` (kind ``model``); a transient failure raises ``ModelUnavailableError`` (the job is retried)
unless the wall time ran out meanwhile.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandfleet.core.audit_sink import AuditSink
from sandfleet.core.config import ToolLoopSettings
from sandfleet.core.contracts import (
    AuditKind,
    ErrorInfo,
    ErrorKind,
    FunctionCallRecord,
    JobStatus,
    Limit,
    TokenUsage,
    TurnRecord,
)
from sandfleet.core.errors import JsonLimitError, ModelError, ModelUnavailableError
from sandfleet.core.redaction import redact_arguments_text
from sandfleet.worker.approval.checkpoint import LoopState, PendingCall
from sandfleet.worker.engine.clip import clip_text
from sandfleet.worker.engine.functions import CallOutcome, FunctionTable
from sandfleet.worker.engine.loop_gate import GatedCall, LoopGate, LoopSuspended, outcome_of
from sandfleet.worker.llm.bounds import budget_outcome
from sandfleet.worker.llm.client import ModelClient, ModelReply
from sandfleet.worker.program.bridge import BUDGET_ERROR
from sandfleet.worker.program.runtime import RESULT_PREFIX, parse_result_line

RECORDED_RESULT_BYTES = (
    64 * 1024
)  # a call's result is kept in the job record up to this size (the audit has all)
NOT_RUN = "NotRunError"  # the error type of calls a cap stopped before they ran


@dataclass
class LoopOutcome:
    """How the loop ended: a status, the answer (or the error), and everything it did."""

    status: JobStatus
    answer: str | None = None
    result: Any = None
    error: ErrorInfo | None = None
    turns: list[TurnRecord] = field(default_factory=list)
    usage: TokenUsage = field(default_factory=TokenUsage)
    limits_hit: list[Limit] = field(default_factory=list)
    tool_calls: int = 0
    model_s: float = 0.0
    tool_s: float = 0.0


def parse_answer(text: str) -> Any:
    """The answer of a final reply: the payload of its last ``RESULT:`` line (JSON when it parses), else
    the whole text.

    Raises:
        JsonLimitError: the RESULT payload nests past the cap (``MAX_JSON_DEPTH``).
    """
    for line in reversed(text.splitlines()):
        candidate = line.strip().strip("`").strip()
        if candidate.startswith(RESULT_PREFIX):
            return parse_result_line(candidate)[1]
    return text.strip()


@dataclass(frozen=True)
class LoopSetup:
    """How one job's loop is wired beyond its model, functions, caps and audit.

    Args:
        request_timeout_s: the model request timeout of the settings; shortened to the time left.
        redact: argument fields shown as ``***`` in the audit and the records (the function runs
            with them; sandfleet/core/redaction.py).
        gate: the job's approval gate (loop_gate.py), asked before each call of a gated tool; a call
            still undecided after the grace stops the loop with :class:`LoopSuspended`.
        resume_note: on resume, a message from the host the model reads after the resumed calls'
            results (shell: what its fresh session sandbox lacks); shown in the next ``model_call``.
        clock: seconds, monotonic (injectable for tests of the caps).
    """

    request_timeout_s: float
    redact: tuple[str, ...] = ()
    gate: LoopGate | None = None
    resume_note: str = ""
    clock: Callable[[], float] = time.monotonic


class ToolLoop:
    """One job's loop: a model, the functions it may call, the caps and where events go.

    Args:
        model: the model client (function calling through ``complete(..., tools=...)``).
        functions: the job's functions.
        caps: the job's ``tool_loop`` settings.
        audit: where every model call and function call is reported.
        setup: the rest of the job's wiring (:class:`LoopSetup`).
    """

    def __init__(
        self,
        model: ModelClient,
        functions: FunctionTable,
        caps: ToolLoopSettings,
        audit: AuditSink,
        setup: LoopSetup,
    ) -> None:
        self.model = model
        self.functions = functions
        self.caps = caps
        self.audit = audit
        self.gate = setup.gate
        self.resume_note = setup.resume_note
        self.request_timeout_s = setup.request_timeout_s
        self.clock = setup.clock
        self.redact = setup.redact

    def run(
        self,
        messages: list[dict[str, Any]],
        *,
        deadline: float | None = None,
        resume: LoopState | None = None,
    ) -> LoopOutcome:
        """Talk to the model until it answers or a cap ends the job. ``messages`` grows as it goes.
        ``resume``: where a suspended loop stopped: its reply's calls still to serve go first (the
        approved one through the gate), then the next turn; nothing made before is made again.

        Raises:
            LoopSuspended: a gated call is still undecided after the grace (its state resumes it).
        """
        deadline = self.clock() + self.caps.wall_timeout if deadline is None else deadline
        job = _Job(LoopOutcome(status=JobStatus.RUNNING), messages, deadline)
        first = 1
        if resume is not None:
            self._resumed(job, resume)
            if job.out.status != JobStatus.RUNNING:
                return job.out
            first = resume.turn + 1
        for number in range(first, self.caps.max_turns + 1):
            ended = self._turn(job, number)
            if ended is not None:
                return ended
        raise AssertionError("unreachable: the last turn returns")  # pragma: no cover

    # -- steps ----------------------------------------------------------------------------------

    def _turn(self, job: _Job, number: int) -> LoopOutcome | None:
        """One model reply and the calls it asks for; the outcome when the job ended, else None."""
        out, messages = job.out, job.messages
        left = job.deadline - self.clock()
        if left <= 0:
            return self._wall_time(out)
        try:
            reply = self.model.complete(
                messages, tools=self.functions.schemas, timeout_s=min(self.request_timeout_s, left)
            )
        except ModelError as e:
            kind, limit = budget_outcome(e)
            return self._stop(out, JobStatus.FAILED, kind, str(e), limit)
        except ModelUnavailableError:
            if self.clock() >= job.deadline:
                return self._wall_time(out)
            raise
        turn = self._account(out, number, reply, messages[job.sent :])
        job.sent = len(messages) + 1
        assistant = _assistant_message(reply, number)
        messages.append(assistant)
        if not reply.tool_calls:
            return self._answered(out, reply)
        asked = [
            _Asked(call_id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
            for c in assistant["tool_calls"]
        ]
        capped = self._capped(job, turn, asked)
        if capped is not None:
            return capped
        self._serve_calls(job, turn, asked)
        if out.status != JobStatus.RUNNING:  # a call found state the chain does not commit to
            return out
        if self.clock() >= job.deadline:
            return self._wall_time(out)
        return None

    def _capped(self, job: _Job, turn: TurnRecord, asked: list[_Asked]) -> LoopOutcome | None:
        """A reply's calls that a cap (turns, tool-call budget, tokens) stops: recorded as not run,
        the job ended; None when they may run."""
        out, number, spent = (
            job.out,
            turn.number,
            job.out.usage.prompt_tokens + job.out.usage.completion_tokens,
        )
        if number == self.caps.max_turns:
            self._not_run(job, turn, asked, f"the job reached its cap of {number} model turns")
            return self._stop(
                out, JobStatus.FAILED, ErrorKind.LIMIT,
                f"the model still asked for tool calls after {number} turns (max_turns)", Limit.TURNS,
            )  # fmt: skip
        if job.budget_refused:
            self._not_run(job, turn, asked, "the tool-call budget was already spent")
            return self._stop(
                out, JobStatus.FAILED, ErrorKind.LIMIT,
                f"the model kept asking for tool calls past the budget of {self.caps.max_tool_calls}",
                Limit.TOOL_CALLS,
            )  # fmt: skip
        if spent > self.caps.max_tokens:
            self._not_run(job, turn, asked, "the job used up its token budget")
            return self._stop(
                out, JobStatus.FAILED, ErrorKind.LIMIT,
                f"the job used {spent} tokens, more than its max_tokens of {self.caps.max_tokens}",
                Limit.TOKENS,
            )  # fmt: skip
        return None

    def _resumed(self, job: _Job, resume: LoopState) -> None:
        """Serve the suspended reply's calls still to serve (the approved one through the gate); the
        job ends here when a call or the wall time ended it."""
        job.out, job.sent, job.budget_refused = _restored(resume), resume.sent, resume.budget_refused
        pending = [
            _Asked(call_id=p.call_id, name=p.name, arguments=p.arguments, announced=i == 0)
            for i, p in enumerate(resume.pending)
        ]
        self._serve_calls(job, job.out.turns[-1], pending)
        if job.out.status == JobStatus.RUNNING and self.clock() >= job.deadline:
            self._wall_time(job.out)
        if job.out.status == JobStatus.RUNNING and self.resume_note:
            job.messages.append({"role": "user", "content": self.resume_note})

    def _serve_calls(self, job: _Job, turn: TurnRecord, calls: list[_Asked]) -> None:
        """Run the calls of one reply (each counts), in order; a call the budget refuses marks the job
        ``budget_refused`` (the model gets one more turn to answer).

        Raises:
            LoopSuspended: a gated call waits for a person past the grace (the calls from it on
                are in the state, the gated one first).
        """
        out, refused = job.out, False
        for index, asked in enumerate(calls):
            if out.status != JobStatus.RUNNING:
                outcome = CallOutcome(False, error_type=NOT_RUN, error="not run: the job ended")
            elif self.clock() >= job.deadline:
                outcome = CallOutcome(False, error_type=NOT_RUN, error="the job ran out of wall time")
            elif out.tool_calls >= self.caps.max_tool_calls:
                refused = True
                outcome = CallOutcome(
                    False,
                    error_type=BUDGET_ERROR,
                    error=f"tool-call budget of {self.caps.max_tool_calls} exceeded: no more calls "
                    "will run; answer now with what you have",
                )
            else:
                outcome = None
            out.tool_calls += 1
            try:
                self._call(job, turn, asked, outcome)
            except _Waiting as waiting:
                out.tool_calls -= 1
                raise self._suspended(job, turn, calls[index:], waiting.request_id) from None
        job.budget_refused = job.budget_refused or refused
        if job.budget_refused and Limit.TOOL_CALLS not in out.limits_hit:
            out.limits_hit.append(Limit.TOOL_CALLS)

    def _suspended(self, job: _Job, turn: TurnRecord, rest: list[_Asked], request_id: str) -> LoopSuspended:
        """The loop's state at a gated call that waits: everything so far, the calls still to serve."""
        out = job.out
        pending = [
            PendingCall(call_id=a.call_id, name=a.name, arguments=a.arguments, announced=i == 0)
            for i, a in enumerate(rest)
        ]
        used = self.caps.wall_timeout - (job.deadline - self.clock())
        state = LoopState(
            mode="",  # the mode fills it in
            turn=turn.number,
            pending=pending,
            turns=[t.model_copy(deep=True) for t in out.turns],
            tool_calls=out.tool_calls,
            model_s=out.model_s,
            tool_s=out.tool_s,
            limits_hit=list(out.limits_hit),
            budget_refused=job.budget_refused,
            sent=job.sent,
            usage=out.usage,
            elapsed_s=max(0.0, used),
        )
        return LoopSuspended(state, list(job.messages), request_id)

    def _account(
        self, out: LoopOutcome, number: int, reply: ModelReply, new_messages: list[dict[str, Any]]
    ) -> TurnRecord:
        out.usage = out.usage + TokenUsage(
            prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens, model_calls=1
        )
        out.model_s += reply.latency_s
        data = reply.audit_data(new_messages, with_tool_calls=True)
        self.audit.emit(AuditKind.MODEL_CALL, _redacted_model_call(data, self.redact), number)
        turn = TurnRecord(
            number=number,
            reply=reply.text,
            finish_reason=reply.finish_reason,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            latency_s=reply.latency_s,
        )
        out.turns.append(turn)
        return turn

    def _call(self, job: _Job, turn: TurnRecord, asked: _Asked, outcome: CallOutcome | None) -> None:
        """Run one call (unless ``outcome`` already says it may not run), record it, answer the model.
        ``asked.announced``: its function_call event was written before the job was suspended.

        Raises:
            _Waiting: the call is gated and nobody decided within the grace.
        """
        out, seq = job.out, job.out.tool_calls
        shown_arguments, hidden = redact_arguments_text(asked.arguments, self.redact)
        digest = _text_sha256(asked.arguments) if hidden else None
        redaction = {"redacted": hidden, "arguments_sha256": digest} if hidden else {}
        if not asked.announced:
            self.audit.emit(
                AuditKind.FUNCTION_CALL,
                {"seq": seq, "call_id": asked.call_id, "tool": asked.name, "arguments": shown_arguments}
                | redaction,
                turn.number,
            )
        if outcome is None:
            outcome = self._run_call(out, turn, seq, asked)
        out.tool_s += outcome.duration_s
        shown, size = clip_text(outcome.text(), self.caps.max_result_bytes)
        record = FunctionCallRecord(
            seq=seq,
            turn=turn.number,
            call_id=asked.call_id,
            tool=asked.name,
            arguments=shown_arguments,
            redacted=hidden,
            arguments_sha256=digest,
            ok=outcome.ok,
            error_type=outcome.error_type,
            error=outcome.error,
            result=outcome.value if outcome.ok and size <= RECORDED_RESULT_BYTES else None,
            result_size=size,
            shown_size=len(shown.encode(errors="surrogatepass")),
            duration_ms=outcome.duration_s * 1000,
        )
        turn.calls.append(record)
        self.audit.emit(
            AuditKind.FUNCTION_RESULT,
            {**record.model_dump(mode="json", exclude={"result"}), "shown": shown},
            turn.number,
        )
        job.messages.append({"role": "tool", "tool_call_id": asked.call_id, "content": shown})

    def _run_call(self, out: LoopOutcome, turn: TurnRecord, seq: int, asked: _Asked) -> CallOutcome:
        """Run one call, through the approval gate when its tool is gated."""
        name, arguments = asked.name, asked.arguments
        if self.gate is None or not self.gate.gates(name):
            return self.functions.call(name, arguments, seq)
        began = time.perf_counter()
        prepared = self.functions.prepare(name, arguments, seq)
        if isinstance(prepared, CallOutcome):
            return prepared
        args, kwargs = prepared
        admission = self.gate.admit(
            GatedCall(turn=turn.number, seq=seq, name=name, arguments=arguments, args=args, kwargs=kwargs),
            reply=turn.reply,
        )
        if isinstance(admission, CallOutcome):
            return admission
        if admission.kind == "run":
            outcome = self.functions.run(name, args, kwargs, began=began)
            self.gate.executed(admission.request_id, outcome)
            return outcome
        if admission.kind == "suspend":
            raise _Waiting(admission.request_id)
        if admission.kind == "untrusted":  # a stored outcome the chain does not commit to: nothing served
            self._stop(out, JobStatus.FAILED, ErrorKind.UNTRUSTED_STATE, admission.message)
            return CallOutcome(False, error_type=NOT_RUN, error=f"not run: {admission.message}")
        return outcome_of(admission)  # served (the approved call ran once already) or denied

    def _not_run(self, job: _Job, turn: TurnRecord, asked: list[_Asked], why: str) -> None:
        """Record the calls of a reply that a cap stopped, without running them."""
        for call in asked:
            outcome = CallOutcome(False, error_type=NOT_RUN, error=f"not run: {why}")
            job.out.tool_calls += 1
            self._call(job, turn, call, outcome)

    def _answered(self, out: LoopOutcome, reply: ModelReply) -> LoopOutcome:
        text = reply.text.strip()
        if not text:
            return self._stop(out, JobStatus.FAILED, ErrorKind.NO_ANSWER, "the model's last reply was empty")
        try:
            answer = parse_answer(reply.text)
        except JsonLimitError as e:
            return self._stop(
                out, JobStatus.FAILED, ErrorKind.LIMIT, f"the model's answer: {e}", Limit.NESTING
            )
        out.status, out.answer, out.result = JobStatus.SUCCEEDED, reply.text, answer
        return out

    def _wall_time(self, out: LoopOutcome) -> LoopOutcome:
        return self._stop(
            out, JobStatus.TIMED_OUT, ErrorKind.LIMIT,
            f"the job passed its wall time of {self.caps.wall_timeout:g} s (wall_timeout)", Limit.WALL_TIME,
        )  # fmt: skip

    def _stop(
        self, out: LoopOutcome, status: JobStatus, kind: ErrorKind, message: str, limit: Limit | None = None
    ) -> LoopOutcome:
        out.status, out.error = status, ErrorInfo(kind=kind, message=message)
        if limit is not None and limit not in out.limits_hit:
            out.limits_hit.append(limit)
        return out


@dataclass
class _Job:
    """One job's loop state: its outcome so far, the conversation, the wall-time deadline, how many
    messages the model_call events showed already (``sent``), and whether the budget refused a call."""

    out: LoopOutcome
    messages: list[dict[str, Any]]
    deadline: float
    sent: int = 0
    budget_refused: bool = False


@dataclass(frozen=True)
class _Asked:
    """One call the model asked for, as the assistant message names it (its id made unique).
    ``announced``: its function_call event was written before a suspension (a resumed call)."""

    call_id: str
    name: str
    arguments: str
    announced: bool = False


class _Waiting(Exception):
    """A gated call nobody decided within the grace (the loop turns it into LoopSuspended)."""

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id)
        self.request_id = request_id


def _restored(state: LoopState) -> LoopOutcome:
    """The outcome so far of a suspended loop, from its state."""
    return LoopOutcome(
        status=JobStatus.RUNNING,
        turns=[t.model_copy(deep=True) for t in state.turns],
        usage=state.usage,
        limits_hit=list(state.limits_hit),
        tool_calls=state.tool_calls,
        model_s=state.model_s,
        tool_s=state.tool_s,
    )


def _text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _redacted_model_call(data: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """A ``model_call`` event with the redacted fields of every function call's arguments (the
    reply's, and those of the assistant messages sent back) shown as ``***``."""
    if not fields:
        return data

    def shown(arguments: Any) -> Any:
        return redact_arguments_text(arguments, fields)[0] if isinstance(arguments, str) else arguments

    calls = [{**c, "arguments": shown(c.get("arguments"))} for c in data.get("tool_calls", [])]
    messages = []
    for message in data.get("messages", []):
        if isinstance(message, dict) and message.get("tool_calls"):
            message = {
                **message,
                "tool_calls": [
                    {**c, "function": {**c["function"], "arguments": shown(c["function"].get("arguments"))}}
                    if isinstance(c, dict) and isinstance(c.get("function"), dict)
                    else c
                    for c in message["tool_calls"]
                ],
            }
        messages.append(message)
    return {**data, "tool_calls": calls, "messages": messages}


def _assistant_message(reply: ModelReply, number: int) -> dict[str, Any]:
    """The reply as the next assistant message; a call without an id gets one (each must be answered)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        seen: set[str] = set()
        calls = []
        for index, call in enumerate(reply.tool_calls):
            call_id = call.id if call.id and call.id not in seen else f"call_t{number}_{index}"
            seen.add(call_id)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
            )
        message["tool_calls"] = calls
    elif not reply.text:
        message["content"] = ""
    return message
