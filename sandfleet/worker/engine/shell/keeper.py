"""Session sandboxes of one worker process: made for shell jobs, watched, and destroyed with them.

Session sandboxes live as long as their job, so they are counted apart from the warm pool of
single-use sandboxes: at most ``Settings.max_sessions`` per worker (a shell job waits for a free
slot, until its wall time). One watchdog thread destroys a session whose idle or lifetime cap has
passed; the reaper removes any past its lifetime (its ``sandfleet.expires`` label) even if this
process is stuck; ``close`` destroys all of them when the worker stops.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import SandboxError
from sandfleet.core.settings import Settings
from sandfleet.worker.cancel.scope import raise_if_cancelled, track_container
from sandfleet.worker.engine.shell.session import SessionSandbox
from sandfleet.worker.sandbox.backends import SandboxBackend, backend_named
from sandfleet.worker.sandbox.docker.labels import LABEL_EXPIRES, LABEL_JOB, LABEL_ROLE, ROLE_SESSION

log = logging.getLogger("sandfleet.shell")

WATCH_INTERVAL_S = 0.5
REAPER_GRACE_S = 30.0  # the reaper's deadline trails the session's own lifetime cap by this much
WHEELHOUSE_INSIDE = "/opt/sandfleet/wheelhouse"  # where an operator's wheelhouse is mounted read-only


class SessionKeeper:
    """Opens session sandboxes under a per-worker cap and destroys them on their caps. Constructing it
    starts nothing (``backend``, by default the Docker one, is asked for a sandbox at each open); the
    watchdog thread starts with the first session."""

    def __init__(self, settings: Settings, *, backend: SandboxBackend | None = None) -> None:
        self.settings = settings
        self.max_sessions = settings.max_sessions
        self._backend = backend
        self._slots = threading.BoundedSemaphore(settings.max_sessions)
        self._lock = threading.Lock()
        self._open: dict[int, SessionSandbox] = {}
        self._closed = False
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    @property
    def wheelhouse(self) -> Path | None:
        """The operator's wheelhouse on this host, when one is configured and exists."""
        folder = self.settings.wheelhouse_dir
        if not folder:
            return None
        path = Path(folder).expanduser().resolve()
        return path if path.is_dir() else None

    def open(
        self, config: SandboxConfig, *, job_id: str, lifetime_s: float, idle_s: float, wait_s: float
    ) -> SessionSandbox:
        """Start a session sandbox for one job (a fresh container, never a warm one).

        Args:
            config: the job's sandbox options (same hardening and limits as every sandbox).
            lifetime_s: its lifetime cap in seconds; the reaper's label allows REAPER_GRACE_S more.
            idle_s: its idle cap in seconds.
            wait_s: how long to wait for a free session slot.

        Raises:
            SandboxError: no slot within ``wait_s``, a closed keeper, or the sandbox cannot be made.
            SandboxUnavailableError: no engine.
        """
        raise_if_cancelled("the session sandbox")
        if not self._slots.acquire(timeout=max(0.0, wait_s)):
            raise SandboxError(
                f"no session sandbox slot became free within {wait_s:g} s "
                f"({self.max_sessions} per worker: SANDFLEET_MAX_SESSIONS)"
            )
        try:
            if self._closed:
                raise SandboxError("the worker is stopping: no new session sandboxes")
            labels = {
                LABEL_ROLE: ROLE_SESSION,
                LABEL_JOB: job_id,
                LABEL_EXPIRES: f"{time.time() + lifetime_s + REAPER_GRACE_S:.0f}",
            }
            mounts = {str(self.wheelhouse): WHEELHOUSE_INSIDE} if self.wheelhouse else None
            if self._backend is None:
                self._backend = backend_named()
            container = self._backend.start(config, labels=labels, read_only_mounts=mounts)
        except BaseException:
            self._slots.release()
            raise
        track_container(container)  # a cancel of the job destroys it (destroying twice is harmless)
        session = SessionSandbox(container, job_id=job_id, lifetime_s=lifetime_s, idle_s=idle_s)
        with self._lock:
            self._open[id(session)] = session
        self._ensure_watchdog()
        return session

    def close_session(self, session: SessionSandbox, reason: str | None = None) -> None:
        """Destroy a session (if it still runs) and free its slot. Never raises."""
        try:
            if reason is None:
                session.close()
            else:
                session.close(reason)
        except Exception:
            log.exception("destroying session sandbox %s failed", session.container.id[:12])
        with self._lock:
            gone = self._open.pop(id(session), None)
        if gone is not None:
            self._slots.release()

    def live(self) -> int:
        """Sessions open now (their containers may already be destroyed by a cap)."""
        with self._lock:
            return len(self._open)

    def close(self) -> None:
        """Refuse new sessions, destroy the open ones and stop the watchdog. Idempotent."""
        self._closed = True
        self._stop.set()
        with self._lock:
            sessions = list(self._open.values())
        for session in sessions:
            self.close_session(session, "the worker stopped")
        if self._watchdog is not None:
            self._watchdog.join(timeout=10)

    def _ensure_watchdog(self) -> None:
        with self._lock:
            if self._watchdog is None and not self._closed:
                self._watchdog = threading.Thread(target=self._watch, name="sandfleet-sessions", daemon=True)
                self._watchdog.start()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL_S):
            with self._lock:
                sessions = list(self._open.values())
            now = time.monotonic()
            for session in sessions:
                try:
                    session.expire(now)
                except Exception:
                    log.exception("checking session sandbox %s failed", session.container.id[:12])
