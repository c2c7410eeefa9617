"""What a cancel request reaches while a job runs: its token, and the sandboxes it holds.

A delivery opens a scope for its job (:meth:`RunningScopes.open`); the token is then the job's
*current* token in that thread (a context variable, so the engine, the program runtime and the
session keeper find it without it being passed through every call). What holds a sandbox registers
it with :func:`track_container`; a cancel kills and removes every registered sandbox at once (the
program's run ends as its container goes) and wakes whatever waits on the token (a model call in
flight, :mod:`sandfleet.worker.cancel.model`). After a cancel the engine raises
:class:`~sandfleet.core.errors.JobCancelledError` at its next model call or sandbox start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

from sandfleet.core.errors import JobCancelledError

if TYPE_CHECKING:  # the sandbox commands load this module; the request side (redis) stays unloaded
    from sandfleet.core.cancel import CancelRequest

log = logging.getLogger("sandfleet.cancel")


class Removable(Protocol):
    """Docker's side of a sandbox: remove (kill) it; never raises, may run twice."""

    def remove(self) -> None: ...


class Destroyable(Protocol):
    """A sandbox as the token sees it: an id and its Docker handle."""

    @property
    def id(self) -> str: ...

    @property
    def handle(self) -> Removable: ...


class CancelToken:
    """The cancel state of one running delivery. Thread-safe: the watcher cancels, the job reads."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.request: CancelRequest | None = None
        self.cancelled_at: float | None = None  # time.monotonic() of the cancel
        self.killed: list[str] = []  # ids of the sandboxes the cancel destroyed
        self.abandoned_model_calls = 0
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._containers: dict[int, Destroyable] = {}
        self._waiters: set[threading.Event] = set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, request: CancelRequest) -> None:
        """Mark the job cancelled, wake its waiters and destroy its sandboxes (once; later calls do nothing)."""
        with self._lock:
            if self._event.is_set():
                return
            self.request = request
            self.cancelled_at = time.monotonic()
            self._event.set()
            containers = list(self._containers.values())
            self._containers.clear()
            waiters = list(self._waiters)
        for waiter in waiters:
            waiter.set()
        for container in containers:
            self._destroy(container)
        log.info("job %s cancelled: %d sandbox(es) destroyed", self.job_id, len(containers))

    def raise_if_cancelled(self, doing: str) -> None:
        """JobCancelledError if the job was cancelled (``doing``: what it was about to do)."""
        if self.cancelled:
            raise JobCancelledError(f"job {self.job_id} was cancelled; {doing} was not started")

    def track(self, container: Destroyable) -> Callable[[], None]:
        """Destroy ``container`` on a cancel (at once if the job is cancelled already); returns the
        function that stops tracking it."""
        with self._lock:
            if not self._event.is_set():
                self._containers[id(container)] = container
                return lambda: self._untrack(container)
        self._destroy(container)
        return lambda: None

    def wait(self, done: threading.Event, timeout_s: float | None = None) -> bool:
        """Wait until ``done`` is set or the job is cancelled; True when it is cancelled."""
        with self._lock:
            if self._event.is_set():
                return True
            self._waiters.add(done)
        try:
            done.wait(timeout_s)
        finally:
            with self._lock:
                self._waiters.discard(done)
        return self.cancelled

    def _untrack(self, container: Destroyable) -> None:
        with self._lock:
            self._containers.pop(id(container), None)

    def _destroy(self, container: Destroyable) -> None:
        # Kill and remove the container only: its agent's stream then ends, and the run waiting on it
        # returns at once. Closing that stream from here instead would leave the reader's wait
        # unwoken; the holder (the pool's release, the session's close) closes it and finds the
        # container gone.
        container.handle.remove()
        with self._lock:
            self.killed.append(container.id)


_current: ContextVar[CancelToken | None] = ContextVar("sandfleet_cancel_token", default=None)


def current_token() -> CancelToken | None:
    """The token of the job running in this thread, if a delivery opened one."""
    return _current.get()


def track_container(container: Destroyable) -> Callable[[], None]:
    """Register a sandbox the current job holds (no job: nothing to do); returns the untrack function."""
    token = _current.get()
    return token.track(container) if token is not None else (lambda: None)


def raise_if_cancelled(doing: str) -> None:
    """JobCancelledError if the current job was cancelled."""
    token = _current.get()
    if token is not None:
        token.raise_if_cancelled(doing)


class RunningScopes:
    """The tokens of the deliveries running in this process, by job id. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tokens: dict[str, list[CancelToken]] = {}

    @contextmanager
    def open(self, job_id: str) -> Iterator[CancelToken]:
        """A token for one delivery of ``job_id``, current in this thread while inside."""
        token = CancelToken(job_id)
        with self._lock:
            self._tokens.setdefault(job_id, []).append(token)
        reset = _current.set(token)
        try:
            yield token
        finally:
            _current.reset(reset)
            with self._lock:
                tokens = self._tokens.get(job_id, [])
                if token in tokens:
                    tokens.remove(token)
                if not tokens:
                    self._tokens.pop(job_id, None)

    def tokens(self, job_id: str) -> list[CancelToken]:
        """The tokens of the deliveries of ``job_id`` running here now."""
        with self._lock:
            return list(self._tokens.get(job_id, ()))
