"""The state of one run's tool bridge (sandfleet/worker/program/bridge.py ``ToolBridge``), in its homes:
the caps its calls meet (``BridgeLimits``, frozen), what its calls came to (``BridgeTally``, read when
the run ends), the calls' numbering and the running ones the per-call timeout watches
(``CallsInFlight``), and one call as it is served, with its own notes (``ServedCall``).

Calls are served on a thread each: the tally and the calls in flight take their own locks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandfleet.core.config import CodeActionSettings
from sandfleet.core.run_models import ToolCallRecord


@dataclass(frozen=True)
class BridgeLimits:
    """The caps every call of a run meets on the host: the call budget (every call counts, failed and
    unknown ones included), the request and reply sizes in bytes, and the per-call timeout in seconds
    (None: none)."""

    max_calls: int = 50
    max_request_bytes: int = 1024**2
    max_response_bytes: int = 64 * 1024**2
    call_timeout_s: float | None = None

    @classmethod
    def of(cls, settings: CodeActionSettings) -> BridgeLimits:
        """A job's limits, from its code-action settings."""
        return cls(
            max_calls=settings.max_tool_calls,
            max_request_bytes=settings.max_request_bytes,
            max_response_bytes=settings.max_response_bytes,
            call_timeout_s=settings.tool_timeout,
        )


@dataclass
class BridgeTally:
    """What a run's calls came to, kept as they finish (on a thread each) and read as the run ends
    (sandfleet/worker/program/runtime.py ``RunResult``): the records, the seconds spent in tools, whether
    the budget was exceeded, the malformed frames, and why the run was stopped, if it was."""

    records: list[ToolCallRecord] = field(default_factory=list)
    tool_time_s: float = 0.0
    budget_exceeded: bool = False
    protocol_errors: int = 0
    suspended_for: list[str] = field(default_factory=list)  # the approval requests the run stopped for
    untrusted: str | None = None  # why it stopped: state the chain lacks
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _record_lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    @property
    def stopping(self) -> bool:
        """The run is being stopped (for a decision, or for state the chain lacks): nothing more runs."""
        return bool(self.suspended_for) or self.untrusted is not None

    def protocol_error(self) -> None:
        with self._lock:
            self.protocol_errors += 1

    def spent(self, seconds: float) -> None:
        """Add one call's time in its tool."""
        with self._lock:
            self.tool_time_s += seconds

    def suspend(self, request_id: str) -> bool:
        """The run waits for ``request_id``'s decision; True for the first (the program is to be stopped)."""
        with self._lock:
            first = not self.suspended_for
            self.suspended_for.append(request_id)
        return first

    def distrust(self, message: str) -> bool:
        """A stored outcome the chain does not commit to; True for the first (the program is to be stopped)."""
        with self._lock:
            first = self.untrusted is None
            self.untrusted = self.untrusted or message
        return first

    def keep(self, record: ToolCallRecord, announce: Callable[[ToolCallRecord], None] | None) -> None:
        """Keep a call's record and ``announce`` it: the audit sees calls in the order records are kept."""
        with self._record_lock:
            self.records.append(record)
            if announce is not None:
                announce(record)


@dataclass
class ServedCall:
    """One call as the bridge serves it: its number, when it arrived, and what it asks (once parsed);
    then how it was answered: the approval request behind it, and ``quiet`` for a resumed call whose
    record is not audited again."""

    seq: int
    began: float  # time.perf_counter()
    request_id: Any = None
    tool: str = "?"
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    approval_id: str | None = None
    quiet: bool = False


class CallsInFlight:
    """The calls' numbering (a call's place in the order its frame was read) and the Python tool calls
    running under the per-call timeout, each with its deadline (``time.monotonic()``), for
    :meth:`ToolBridge.overdue`. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seq = 0
        self._running: dict[int, tuple[float, ServedCall]] = {}

    def number(self, arrival: int | None) -> int:
        """``arrival`` when the channel numbered the call, else the next number."""
        with self._lock:
            if arrival is None:
                self._seq += 1
                return self._seq
            self._seq = max(self._seq, arrival)
            return arrival

    def watch(self, call: ServedCall, deadline: float) -> None:
        with self._lock:
            self._running[call.seq] = (deadline, call)

    def returned(self, seq: int) -> bool:
        """The call's function returned; False when :meth:`late` handed it out meanwhile (answered)."""
        with self._lock:
            return self._running.pop(seq, None) is not None

    def late(self, now: float) -> list[ServedCall]:
        """The watched calls past their deadline at ``now``, no longer watched, in call order."""
        with self._lock:
            late = sorted(seq for seq, (deadline, _) in self._running.items() if deadline <= now)
            return [self._running.pop(seq)[1] for seq in late]
