"""The worker's Celery app, made by :func:`create_app`: the shared configuration
(:mod:`sandfleet.core.queue`) plus worker-only settings, the task, and the hooks that start and
stop the process's :class:`~sandfleet.worker.delivery.state.WorkerState`. Nothing is built at import.

Chosen so that no job is lost: late acks (a job's message is acknowledged only once its final record
is written), reject on worker lost, prefetch 1 (a busy worker does not sit on queued jobs), JSON
only (a pickled or malformed message is refused, never loaded), task events on for Flower.

Time limits nest (sandbox timeout < soft < hard < visibility timeout); :func:`create_app` refuses a
configuration that breaks the order, so a worker cannot start with one. The thread pool, used for
many jobs in flight, does not enforce Celery's time limits: there the engine's own caps (program
timeout, model request timeout, repairs) bound a job, and the limits still size the visibility
timeout; a prefork worker enforces them too.
"""

from __future__ import annotations

import logging
from queue import Empty
from typing import Any

from celery import Celery, signals
from kombu.transport import redis as kombu_redis

from sandfleet.core.priority import BROKER_PRIORITY_OPTIONS
from sandfleet.core.queue import check_time_limits, job_time_limits, make_app
from sandfleet.core.redis_connect import broker_options
from sandfleet.core.settings import DEFAULT_CONCURRENCY, Settings, get_settings
from sandfleet.worker.delivery.state import WorkerState, current_state
from sandfleet.worker.delivery.task import register_task

log = logging.getLogger(__name__)

DEFAULT_POOL = "threads"


class PoisonSafeReads:
    """The reads of kombu's Redis channels, except that a queue item which is not a kombu JSON envelope is
    discarded and recorded instead of stopping the worker (kombu's own decode error is fatal).

    The item was already popped by BRPOP when it fails to decode, so nothing is left to redeliver.
    """

    def _brpop_read(self, **options: Any) -> Any:
        try:
            return super()._brpop_read(**options)  # type: ignore[misc]
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.error("discarded a queue item that is not a kombu JSON message: %r", e)
            state = current_state()
            if state is not None:
                state.store.record_rejected("not a kombu JSON message", error=repr(e))
            raise Empty() from e


class ReusedClient:
    """kombu's channel with one synchronous redis-py client per connection pool, not one per command.

    kombu builds a new ``redis.Redis`` for each publish, event and acknowledgement outside its
    event loop (``Channel._create_client``); redis-py 8 fills a table of response callbacks in every
    constructor, ~125 us of CPU on this host, several times per job (issue 25: 10% of the worker's
    GIL samples). A client holds no connection of its own (each command checks one out of the pool),
    so one client serves every thread; it is rebuilt when kombu replaces the pool (after an error,
    a Sentinel failover), so it always uses the pool kombu would.
    """

    _reused: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        client = self._reused
        if client is None or client.connection_pool is not self.pool:  # type: ignore[attr-defined]
            client = self._reused = super()._create_client()  # type: ignore[misc]
        return client


class PoisonSafeChannel(ReusedClient, PoisonSafeReads, kombu_redis.Channel):
    """kombu's Redis channel with poison-safe reads and one reused client."""


class PoisonSafeSentinelChannel(ReusedClient, PoisonSafeReads, kombu_redis.SentinelChannel):
    """kombu's Sentinel channel (the primary the Sentinels name, again after a failover), poison-safe,
    with one reused client."""


class PoisonSafeRedisTransport(kombu_redis.Transport):
    Channel = PoisonSafeChannel


class PoisonSafeSentinelTransport(kombu_redis.SentinelTransport):
    Channel = PoisonSafeSentinelChannel


POISON_SAFE_TRANSPORT = f"{__name__}:PoisonSafeRedisTransport"
POISON_SAFE_SENTINEL_TRANSPORT = f"{__name__}:PoisonSafeSentinelTransport"


def time_limits(settings: Settings) -> tuple[float, float]:
    """``(soft, hard)`` Celery time limits in seconds for a job with the default caps."""
    return job_time_limits(settings)


def worker_config(settings: Settings) -> dict[str, object]:
    """Worker-only Celery settings on top of the shared ones.

    Raises:
        InvalidSpecError: the time limits do not nest inside the visibility timeout (numbers named).
    """
    soft, hard = check_time_limits(settings)
    scheme = settings.redis_url.partition("://")[0]
    names = {"redis": POISON_SAFE_TRANSPORT, "rediss": POISON_SAFE_TRANSPORT}
    names["sentinel"] = POISON_SAFE_SENTINEL_TRANSPORT
    transport = {"broker_transport": names[scheme]} if scheme in names else {}
    extra = broker_options(settings)["transport_options"]
    return {
        **transport,
        "worker_pool": DEFAULT_POOL,
        "worker_concurrency": DEFAULT_CONCURRENCY,
        "worker_prefetch_multiplier": 1,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            "socket_connect_timeout": 5.0,
            **BROKER_PRIORITY_OPTIONS,  # the BRPOP names each priority step's list, most urgent first
            **extra,  # master_name (and the Sentinels' password) of a sentinel:// broker
        },
        "task_soft_time_limit": soft,
        "task_time_limit": hard,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
    }


class WorkerApp(Celery):
    """The worker's Celery app; ``state`` is the process's resources (started when it consumes)."""

    state: WorkerState


def create_app(settings: Settings | None = None, *, max_sandboxes: int | None = None) -> WorkerApp:
    """The worker's Celery app with the task registered and the state's hooks connected.

    Raises:
        InvalidSpecError: the time limits do not nest inside the visibility timeout.
    """
    settings = settings or get_settings()
    app = make_app(settings, app_class=WorkerApp)
    app.conf.update(worker_config(settings))
    app.state = WorkerState(settings, app, max_sandboxes=max_sandboxes)
    register_task(app, app.state)
    _connect_hooks(app)
    return app


def _connect_hooks(app: WorkerApp) -> None:
    """Celery's signals are process-wide: each handler acts only for senders of this app."""

    def mine(sender: Any) -> bool:
        return getattr(sender, "app", None) is app

    def on_ready(sender: Any = None, **_: Any) -> None:
        if mine(sender):
            app.state.start(getattr(sender, "hostname", None) or "worker")

    def on_shutdown(sender: Any = None, **_: Any) -> None:
        if mine(sender):
            app.state.stop()

    def on_child_shutdown(**_: Any) -> None:  # a prefork child: drain its own sandbox pool
        app.state.stop()

    def on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
        tag = getattr(getattr(request, "message", None), "delivery_tag", None)
        if mine(sender) and tag is not None:
            app.state.hold(str(tag), request.id)

    def on_rejected(
        sender: Any = None, message: Any = None, exc: BaseException | None = None, **_: Any
    ) -> None:
        """Celery discarded a message it cannot run (pickle or other refused content, bad format)."""
        if mine(sender):
            headers = getattr(message, "headers", None) or {}
            app.state.store.record_rejected(
                "invalid message", task=headers.get("task"), id=headers.get("id"), error=repr(exc)[:500]
            )

    def on_unknown(sender: Any = None, name: str = "", id: str = "", **_: Any) -> None:
        """Celery discarded a message for a task this worker does not have."""
        if mine(sender):
            app.state.store.record_rejected("unknown task", task=name, id=id)

    uid = f"sandfleet-{id(app)}"
    signals.worker_ready.connect(on_ready, weak=False, dispatch_uid=f"{uid}-ready")
    signals.worker_shutdown.connect(on_shutdown, weak=False, dispatch_uid=f"{uid}-shutdown")
    signals.worker_process_shutdown.connect(on_child_shutdown, weak=False, dispatch_uid=f"{uid}-child")
    signals.task_received.connect(on_received, weak=False, dispatch_uid=f"{uid}-received")
    signals.task_rejected.connect(on_rejected, weak=False, dispatch_uid=f"{uid}-rejected")
    signals.task_unknown.connect(on_unknown, weak=False, dispatch_uid=f"{uid}-unknown")
