"""Serving a running program's tool calls concurrently, without a thread hop on any call's path.

One thread at a time leads: it reads the agent's frames and keeps the command's deadlines (the
``step`` it is given). When a frame is a tool call, the leader hands leadership to an idle thread
(or starts one), serves the call itself and sends the reply; then it waits to lead again. A program
calling from one thread gets each call read, served and answered by one thread, as when calls were
served inline; a program calling from several threads has them served side by side. The caller of
:meth:`CallConversation.run` (the job's thread) leads until the first call, then only waits for the
end, so a tool that hangs never holds it: the leader answers such a call at its timeout (the
handler's ``overdue()``, asked now and then while calls are served) and the run ends on time.

At the end (the command finished, or was lost) the calls sent before it get a short grace to finish,
so that they are recorded with the run; then every thread still here leaves, and replies are dropped.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

log = logging.getLogger("sandfleet.sandbox")

MAX_CONCURRENT_CALLS = 16  # the agent forwards at most this many calls before it has their replies
MAX_SERVING = 2 * MAX_CONCURRENT_CALLS  # past this (an agent that ignores its cap), calls wait their turn
OVERDUE_POLL_S = 0.1  # how late a per-call timeout may fire, at most (seconds)
CLOSE_GRACE_S = 2.0  # how long the calls sent before the command ended get to finish

# (header, body, number) of one call -> the reply bytes, or None when the handler answered it already
# (through its optional ``overdue()``: replies for calls past their timeout). ``number`` counts the
# calls in the order they were read (1, 2, ...): the order of the budget, whoever serves them first.
Handler = Callable[[dict[str, Any], bytes, int], bytes | None]
T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """A tool call frame the leader read; ``number`` is set by the conversation (reading order)."""

    header: dict[str, Any]
    body: bytes
    number: int = 0


class CallConversation(Generic[T]):
    """Drives one command: ``step(busy)`` reads one frame and returns the final result (a ``T``), a
    :class:`Call` to serve, or None (nothing to do yet); ``busy`` says whether calls are being served
    (the step then wakes in time to answer overdue ones). Only the leader calls ``step``."""

    def __init__(
        self,
        step: Callable[[bool], T | Call | None],
        handler: Handler,
        send_reply: Callable[[bytes], None],
        grace_s: float = CLOSE_GRACE_S,
    ) -> None:
        self._step = step
        self._handler = handler
        self._send_reply = send_reply
        self._grace_s = grace_s
        self._cond = threading.Condition()
        self._leading = False
        self._idle = 0  # threads waiting to lead
        self._serving = 0
        self._waiting: deque[Call] = deque()  # calls past MAX_SERVING, served as threads free up
        self._read = 0  # calls read so far (only the leader counts)
        self._done = False
        self._result: T | None = None
        self._error: BaseException | None = None

    def run(self) -> T:
        """Lead until the first call, then wait for the end. Raises what ``step`` raised."""
        with self._cond:
            self._leading = True
        call = self._lead()
        if call is not None:
            self._start(self._serve_then_follow, call)
            with self._cond:
                while not self._done:
                    self._cond.wait()
        with self._cond:  # the grace: calls sent before the end are recorded with the run
            self._cond.wait_for(lambda: self._serving == 0, timeout=self._grace_s)
            self._waiting.clear()
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    # -- the threads --------------------------------------------------------------------------------

    def _lead(self) -> Call | None:
        """Step until a call comes (returned, leadership given up) or the end (None)."""
        while True:
            try:
                outcome = self._step(self._busy())
            except BaseException as e:  # the caller of run() gets it
                self._end(error=e)
                return None
            if isinstance(outcome, Call):
                self._read += 1
                outcome = dataclasses.replace(outcome, number=self._read)
                with self._cond:
                    self._leading = False
                    if self._serving >= MAX_SERVING:
                        self._waiting.append(outcome)
                        self._leading = True  # keep leading; a thread that frees up serves it
                        continue
                    self._serving += 1
                    self._hand_over()
                return outcome
            if outcome is not None:
                self._end(result=outcome)
                return None

    def _serve_then_follow(self, call: Call | None) -> None:
        while call is not None:
            self._serve(call)
            call = self._follow()

    def _follow(self) -> Call | None:
        """The next call this thread serves: one that waited, or one it reads once it leads."""
        with self._cond:
            while True:
                if self._done:
                    return None
                if self._waiting:
                    self._serving += 1
                    return self._waiting.popleft()
                if not self._leading:
                    self._leading = True
                    break
                self._idle += 1
                self._cond.wait()
                self._idle -= 1
        return self._lead()

    def _serve(self, call: Call) -> None:
        try:
            reply = self._handler(call.header, call.body, call.number)
        except Exception:  # the bridge answers every call; this is a bug, and the deadline holds
            log.exception("a tool call handler raised instead of replying")
            reply = None
        finally:
            with self._cond:
                self._serving -= 1
                self._cond.notify_all()
        if reply is not None and not self._done:
            self._send_reply(reply)

    def _hand_over(self) -> None:
        """Someone else leads now (called with the lock held, after giving up leadership)."""
        if self._idle:
            self._cond.notify_all()
        else:
            self._start(self._follow_to_the_end)

    def _follow_to_the_end(self) -> None:
        call = self._follow()
        if call is not None:
            self._serve_then_follow(call)

    def _start(self, target: Callable[..., None], *args: Any) -> None:
        threading.Thread(target=target, args=args, name="sandfleet-call", daemon=True).start()

    def _busy(self) -> bool:
        with self._cond:
            return self._serving > 0

    def _end(self, *, result: T | None = None, error: BaseException | None = None) -> None:
        with self._cond:
            self._done, self._result, self._error = True, result, error
            self._leading = False
            self._cond.notify_all()
