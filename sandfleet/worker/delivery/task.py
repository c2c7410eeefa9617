"""The Celery task ``sandfleet.run_job``: thin, it hands each delivery to
:class:`~sandfleet.worker.delivery.run.Delivery` (plain Python, callable without Celery) and turns a
failure worth another try into ``self.retry`` with exponential backoff.

Two kinds of failure retry, each with its own budget:

- a transient failure of the job's infrastructure (sandbox, model or tool server unavailable):
  ``Settings.transient_retries`` retries, then the job is recorded failed naming what was down;
- a Redis failure (the records cannot be written: Redis restarting, full): ``REDIS_RETRIES``
  retries of the delivery, never counted against the engine's budget. When they run out the
  message is acknowledged as failed; the job is left queued or running without a message, and the
  recovery's reconciliation (recovery.py, ``lost_jobs``) publishes it again.

Celery counts every retry of a message in ``request.retries``; the Redis ones are counted in the
message itself (the task's ``redis_retries`` argument, which each Redis retry raises by one), so
the engine's share is the difference (:class:`RetryCounts`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery

from sandfleet.core.errors import TransientError
from sandfleet.core.queue import TASK_NAME
from sandfleet.core.settings import (
    DEFAULT_TRANSIENT_BACKOFF_MAX_S,
    DEFAULT_TRANSIENT_BACKOFF_S,
    DEFAULT_TRANSIENT_RETRIES,
)
from sandfleet.worker.delivery.flower_report import report_delivery
from sandfleet.worker.delivery.run import Delivery, Message
from sandfleet.worker.delivery.state import WorkerState

log = logging.getLogger(__name__)

# Retries of a delivery whose records could not be written. With the transient backoff (5 s
# doubling, capped at 300 s) ten retries wait about 25 minutes in all: longer than a Redis
# restart or failover takes, short enough that a Redis that stays down does not hold the message.
REDIS_RETRIES = 10


def compute_backoff(
    retries: int, base_s: float = DEFAULT_TRANSIENT_BACKOFF_S, max_s: float = DEFAULT_TRANSIENT_BACKOFF_MAX_S
) -> float:
    """Seconds to wait before retry number ``retries + 1``: base, 2 x base, 4 x base ... capped."""
    return min(max_s, base_s * 2 ** max(0, retries))


@dataclass(frozen=True)
class RetryCounts:
    """The retries behind one message: all of them (Celery's count) and the Redis ones among them."""

    total: int
    redis: int

    @classmethod
    def of(cls, total: int, redis_retries: object) -> RetryCounts:
        """From Celery's count and the message's ``redis_retries``. The message is broker input: a
        value that is not a whole number between 0 and the total counts as 0, so a forged one can
        neither raise the engine's share past the total nor make it negative."""
        total = max(0, total)
        whole = isinstance(redis_retries, int) and not isinstance(redis_retries, bool)
        count = redis_retries if isinstance(redis_retries, int) and whole else 0
        return cls(total, count if 0 <= count <= total else 0)

    @property
    def engine(self) -> int:
        """The engine's transient retries: the budget ``Settings.transient_retries`` bounds."""
        return self.total - self.redis


def register_task(app: Celery, state: WorkerState) -> None:
    """Add ``sandfleet.run_job`` to the worker's app; it runs each delivery with ``state``."""

    # shared=False: the task belongs to this app (and its state) only, not to every app made later.
    @app.task(name=TASK_NAME, bind=True, max_retries=DEFAULT_TRANSIENT_RETRIES, shared=False)
    def run_job_task(self: Any, job_id: str, spec: Any, redis_retries: Any = 0) -> dict[str, Any]:
        """Run one job; returns ``{"job_id", "status", "result"}`` for Flower, or tells Flower the job
        did not succeed and raises Ignore (sandfleet/worker/delivery/flower_report.py). The record has the rest."""
        settings = state.settings
        counts = RetryCounts.of(self.request.retries, redis_retries)
        # Our budgets decide; Celery's own max_retries check is given room for one more.
        room = counts.total + 1
        try:
            with state.running.running(job_id) as first_here:
                message = Message(
                    job_id,
                    spec,
                    retries=counts.engine,
                    last_try=counts.engine >= settings.transient_retries,
                    running_here=not first_here,
                    message_retries=counts.total,
                )
                status = Delivery(state.delivery_services(self.request.hostname or ""), message).run()
        except TransientError as e:
            backoff = compute_backoff(
                counts.engine, settings.transient_backoff_s, settings.transient_backoff_max_s
            )
            raise self.retry(exc=e, countdown=backoff, max_retries=room) from e
        except redis.RedisError as e:
            if counts.redis >= REDIS_RETRIES:
                log.error(
                    "job %s: Redis failed %d times (%s); the recovery republishes it",
                    job_id,
                    counts.redis + 1,
                    e,
                )
                raise
            log.warning("job %s: Redis failed (%s); retrying the delivery later", job_id, e)
            backoff = compute_backoff(
                counts.redis, settings.transient_backoff_s, settings.transient_backoff_max_s
            )
            retry_kwargs = {"redis_retries": counts.redis + 1}
            raise self.retry(exc=e, countdown=backoff, kwargs=retry_kwargs, max_retries=room) from e
        return report_delivery(self, state.store, job_id, status, state.flower.take(job_id))
