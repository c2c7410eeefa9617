"""Serving a running program's tool calls concurrently, while one thread owns the channel.

The loop in :meth:`SandboxContainer.execute` reads the agent's frames and is the only writer to the
channel. Each call frame is handed to a worker thread here (up to ``max_concurrent`` at once, the
agent's own cap on calls in flight); a finished reply is queued and a byte written to a wake pipe,
which the loop watches beside the channel, so it sends the reply as soon as it is ready. A program
calling tools from several threads has them served side by side instead of one after another.
While calls are being served the loop also wakes every ``OVERDUE_POLL_S`` to ask the handler for
replies to calls past their timeout (a Python function cannot be interrupted; its caller can stop
waiting).

:meth:`CallDispatcher.close` (the command ended) gives the calls the program sent before it ended a
short grace to finish, so they are recorded with the run as before, when calls were served one by
one; then it cancels what has not started and drops every reply not yet sent.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sandfleet.sandbox")

MAX_CONCURRENT_CALLS = 16  # the agent forwards at most this many calls before it has their replies
OVERDUE_POLL_S = 0.1  # how late a per-call timeout may fire, at most (seconds)
CLOSE_GRACE_S = 2.0  # how long the calls sent before the command ended get to finish

# (header, body) of one call -> the reply bytes, or None when the handler answered it already
# (through its optional ``overdue()``: replies for calls past their timeout).
Handler = Callable[[dict[str, Any], bytes], bytes | None]


class CallDispatcher:
    """Runs ``handler(header, body) -> reply`` for each call on a thread; replies come back in
    :meth:`ready` after the wake pipe (:attr:`wake_fd`) becomes readable."""

    def __init__(self, handler: Handler, max_concurrent: int = MAX_CONCURRENT_CALLS) -> None:
        self._handler = handler
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_concurrent, thread_name_prefix="sandfleet-call"
        )
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._lock = threading.Lock()
        self._replies: list[bytes] = []
        self._pending: set[concurrent.futures.Future[None]] = set()
        self._closed = False

    @property
    def wake_fd(self) -> int:
        return self._wake_r

    def submit(self, header: dict[str, Any], body: bytes) -> None:
        """Start serving one call (returns at once)."""
        future = self._threads.submit(self._serve, header, body)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: concurrent.futures.Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    @property
    def busy(self) -> bool:
        """Whether calls are being served (the loop then asks :meth:`overdue` now and then)."""
        with self._lock:
            return bool(self._pending)

    def overdue(self) -> list[bytes]:
        """Replies the handler gives for calls past their timeout (none if it has no ``overdue``)."""
        overdue = getattr(self._handler, "overdue", None)
        return overdue() if overdue is not None else []

    def ready(self) -> list[bytes]:
        """The replies finished since the last time, in the order they finished."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            replies, self._replies = self._replies, []
        return replies

    def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Wait up to ``grace_s`` for the calls submitted, then cancel those not started, drop unsent
        replies and free the pipe. A call still running finishes on its thread (the bridge bounds it
        by its timeout) unwaited for."""
        with self._lock:
            pending = list(self._pending)
        if pending:
            concurrent.futures.wait(pending, timeout=grace_s)
        with self._lock:
            self._closed = True
            self._replies.clear()
        self._threads.shutdown(wait=False, cancel_futures=True)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    def _serve(self, header: dict[str, Any], body: bytes) -> None:
        try:
            reply = self._handler(header, body)
        except Exception:  # the bridge answers every call; this is a bug, and the program's deadline holds
            log.exception("a tool call handler raised instead of replying")
            return
        if reply is None:
            return
        with self._lock:
            if self._closed:
                return
            self._replies.append(reply)
            try:
                os.write(self._wake_w, b"!")
            except BlockingIOError:
                pass  # the pipe is full of wake-ups already: the loop will look
