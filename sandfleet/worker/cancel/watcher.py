"""The worker's cancel watcher: one thread that hears cancel requests and acts on them.

It listens on the fleet's cancel channel (pub/sub: a request reaches every worker within
milliseconds) and, every :data:`SWEEP_INTERVAL_S`, reads the set of pending requests (pub/sub is at
most once: a message sent while this worker reconnected is found there). For each job:

- running in this process: its tokens are cancelled on a small thread pool (destroying sandboxes
  takes ~0.1-0.3 s each, and a batch's cancel brings many at once);
- queued: the first worker to claim the request ends the job ``cancelled`` (``end_queued``), so it
  never starts; its message, when delivered, finds the job ended;
- ended or gone: the request is settled;
- running on another worker: that worker acts; if it died, the redelivery finds the request and
  ends the job unrun (sandfleet/worker/delivery/run.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import redis

from sandfleet.core.cancel import CancelRequest, CancelRequests
from sandfleet.core.contracts import JobStatus
from sandfleet.core.replies import text
from sandfleet.core.store import JobStore
from sandfleet.worker.cancel.scope import RunningScopes

log = logging.getLogger("sandfleet.cancel")

SWEEP_INTERVAL_S = 1.0  # how often the pending set is read (the backstop of pub/sub)
LISTEN_SLICE_S = 0.2  # longest wait for a pub/sub message before looking at the clock again
RECONNECT_PAUSE_S = 1.0  # after a Redis error
KILLERS = 4  # threads destroying the sandboxes of cancelled jobs at once


class CancelWatcher:
    """Hears cancel requests for ``store``'s fleet. Constructing it starts nothing.

    Args:
        end_queued: ends a queued job whose request this worker claimed (the one job-end path).
    """

    def __init__(
        self,
        store: JobStore,
        requests: CancelRequests,
        scopes: RunningScopes,
        end_queued: Callable[[str, CancelRequest], None],
    ) -> None:
        self.store = store
        self.requests = requests
        self.scopes = scopes
        self.end_queued = end_queued
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._killers = ThreadPoolExecutor(KILLERS, thread_name_prefix="sandfleet-cancel")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sandfleet-cancel-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._killers.shutdown(wait=True)

    def handle(self, job_id: str) -> None:
        """Act on a cancel request for ``job_id`` (see the module's docstring)."""
        tokens = self.scopes.tokens(job_id)
        if tokens:
            request = self.requests.requested(job_id) or CancelRequest(time.time(), "")
            for token in tokens:
                if not token.cancelled:
                    self._killers.submit(token.cancel, request)
            return
        status = self.store.status(job_id)
        if status is None or status.is_final:
            self.requests.settle(job_id)
        elif status in (JobStatus.QUEUED, JobStatus.AWAITING_APPROVAL):  # not running anywhere: end it here
            queued = self.requests.requested(job_id)
            if queued is not None and self.requests.claim(job_id):
                self.end_queued(job_id, queued)

    def sweep(self) -> None:
        for job_id in self.requests.pending():
            self._handle_quietly(job_id)

    def _handle_quietly(self, job_id: str) -> None:
        try:
            self.handle(job_id)
        except redis.RedisError:
            raise
        except Exception:
            log.exception("acting on the cancel request of job %s failed", job_id)

    def _run(self) -> None:
        while not self._stop.is_set():
            pubsub = self.store.redis.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(self.store.keys.cancel_channel)
                self.sweep()  # what was requested before we listened
                last_sweep = time.monotonic()
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=LISTEN_SLICE_S)
                    if message is not None and message.get("type") == "message":
                        self._handle_quietly(text(message["data"]))
                    if time.monotonic() - last_sweep >= SWEEP_INTERVAL_S:
                        self.sweep()
                        last_sweep = time.monotonic()
            except redis.RedisError as e:
                log.warning(
                    "cancel watcher: Redis failed (%s); listening again in %.0f s", e, RECONNECT_PAUSE_S
                )
                self._stop.wait(RECONNECT_PAUSE_S)
            finally:
                try:
                    pubsub.close()
                except Exception:
                    pass
