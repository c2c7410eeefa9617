"""The worker's life cycle hooks: presence (heartbeat, held messages, recovery sweeps) and the
local container reaper. Connected to Celery's signals when the worker imports its tasks."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery.signals import task_received, worker_ready, worker_shutdown

from producer.keys import FleetKeys
from producer.queue import queue_name
from producer.settings import get_settings
from worker.recovery import SweepReport, WorkerPresence

log = logging.getLogger("sandfleet.worker")

REAP_INTERVAL_S = 15.0

_presence: WorkerPresence | None = None
_last_reap = 0.0
_lock = threading.Lock()
_running: dict[str, int] = {}  # job id -> deliveries of it running in this process now


@contextmanager
def running_here(job_id: str) -> Iterator[None]:
    """Mark a job as running in this process while a delivery of it runs."""
    with _lock:
        _running[job_id] = _running.get(job_id, 0) + 1
    try:
        yield
    finally:
        with _lock:
            _running[job_id] -= 1
            if not _running[job_id]:
                del _running[job_id]


def job_running_elsewhere(job_id: str, worker: str) -> bool:
    """Whether ``job_id`` runs right now on ``worker`` (another live worker, or another delivery here)."""
    presence = _presence
    if presence is None:
        return False
    if worker == presence.name:
        with _lock:
            return _running.get(job_id, 0) > 1  # this delivery counts itself
    return presence.holds(worker, job_id)


def reap_local_leftovers(report: SweepReport | None = None) -> None:
    """Remove containers on this host whose owner process died (every REAP_INTERVAL_S at most)."""
    global _last_reap
    if time.monotonic() - _last_reap < REAP_INTERVAL_S:
        return
    _last_reap = time.monotonic()
    from worker.sandbox.reaper import prune

    try:
        pruned = prune()
    except Exception as e:  # the engine may be down: the next round tries again
        log.warning("reaping leftover sandboxes failed: %s", e)
        return
    if pruned.removed:
        log.warning("removed %d sandbox container(s) left by dead workers", len(pruned.removed))


@worker_ready.connect
def start_presence(sender: Any = None, **_: Any) -> None:
    global _presence
    from producer.client import Client
    from worker.celery_app import app
    from worker.sandbox.spec import Owner
    from worker.store import JobStore

    settings = get_settings()
    name = getattr(sender, "hostname", None) or "worker"
    store = JobStore.from_settings(settings)
    producer = Client(settings=settings)  # republishes jobs whose message the broker lost
    with _lock:
        _presence = WorkerPresence(
            store.redis,
            FleetKeys(settings.key_prefix),
            name,
            app,
            queue_name(settings),
            owner_label=Owner.current().label(),
            on_sweep=reap_local_leftovers,
            republish=producer.republish,
        )
        _presence.start()
    log.info("worker %s announced (heartbeat every few seconds)", name)


@task_received.connect
def hold_message(request: Any = None, **_: Any) -> None:
    presence = _presence
    if presence is None or request is None:
        return
    tag = getattr(getattr(request, "message", None), "delivery_tag", None)
    if tag is not None:
        try:
            presence.hold(str(tag), request.id)
        except Exception as e:  # never lose the message over bookkeeping; the orphan sweep covers it
            log.warning("could not record held message %s: %s", tag, e)


@worker_shutdown.connect
def stop_presence(**_: Any) -> None:
    global _presence
    with _lock:
        presence, _presence = _presence, None
    if presence is not None:
        presence.stop(clean=True)
