"""The worker's Celery app: the shared configuration (:mod:`producer.queue`) plus worker-only settings.

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

from celery import Celery
from kombu.transport import redis as kombu_redis

from producer.queue import check_time_limits, job_time_limits, make_app
from producer.settings import Settings, get_settings

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 32  # jobs in flight per worker; most wait on the model and hold no container
DEFAULT_POOL = "threads"
CONF_MAX_SANDBOXES = "sandfleet_max_sandboxes"  # app.conf key the CLI sets for EngineServices.start


class PoisonSafeChannel(kombu_redis.Channel):
    """kombu's Redis channel, except that a queue item which is not a kombu JSON envelope is
    discarded and recorded instead of stopping the worker (kombu's own decode error is fatal).

    The item was already popped by BRPOP when it fails to decode, so nothing is left to redeliver.
    """

    def _brpop_read(self, **options: Any) -> Any:
        try:
            return super()._brpop_read(**options)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            log.error("discarded a queue item that is not a kombu JSON message: %r", e)
            from worker.tasks import process_store

            process_store().record_rejected("not a kombu JSON message", error=repr(e))
            raise Empty() from e


class PoisonSafeRedisTransport(kombu_redis.Transport):
    Channel = PoisonSafeChannel


POISON_SAFE_TRANSPORT = f"{__name__}:PoisonSafeRedisTransport"


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
    transport = {"broker_transport": POISON_SAFE_TRANSPORT} if scheme in ("redis", "rediss") else {}
    return {
        **transport,
        "include": ["worker.tasks", "worker.lifecycle"],
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
        },
        "task_soft_time_limit": soft,
        "task_time_limit": hard,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        CONF_MAX_SANDBOXES: settings.max_sandboxes,
    }


def create_app(settings: Settings | None = None) -> Celery:
    """The worker's Celery app. Refuses (InvalidSpecError) time limits that do not nest."""
    settings = settings or get_settings()
    app = make_app(settings)
    app.conf.update(worker_config(settings))
    return app


app = create_app()
