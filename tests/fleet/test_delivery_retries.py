"""The two retry budgets of ``sandfleet.run_job``: the engine's transient retries and Redis's own.

A Redis failure mid-delivery (the records cannot be written) retries the delivery; an unavailable
sandbox or model retries the job. Each has its own budget, so a job whose deliveries met a Redis
restart still gets every engine retry it is owed. The task runs through Celery's own eager
``apply`` (a real Celery app and task, real Redis for the records); each retry Celery asks for is
followed by hand, with the retry count and arguments Celery put in its signature.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import Retry
from celery.utils.nodenames import gethostname

from sandfleet.core.audit import RedisAuditSink
from sandfleet.core.contracts import ErrorKind, JobResult, JobSpec, JobStatus
from sandfleet.core.errors import SandboxUnavailableError
from sandfleet.core.settings import Settings
from sandfleet.core.store import JobStore
from sandfleet.producer.client import Client
from sandfleet.worker.delivery.run import JobRunner
from sandfleet.worker.delivery.state import WorkerState
from sandfleet.worker.delivery.task import REDIS_RETRIES, register_task

from .helpers import fleet_settings_for

ENGINE_RETRIES = 2


@pytest.fixture
def settings(redis_server: str, tmp_path: Any) -> Settings:
    return fleet_settings_for(
        redis_server,
        worker_state_dir=str(tmp_path / "worker-state"),
        transient_retries=ENGINE_RETRIES,
        transient_backoff_s=0.01,
    )


class FlakyEngine:
    """An engine whose first ``redis_failures`` runs lose Redis, and every later run finds Docker down."""

    def __init__(self, redis_failures: int) -> None:
        self.redis_failures = redis_failures
        self.runs = 0

    def __call__(self, spec: JobSpec, job_id: str, audit: RedisAuditSink) -> JobResult:
        self.runs += 1
        if self.runs <= self.redis_failures:
            raise redis.ConnectionError("Connection refused (Redis restarting)")
        raise SandboxUnavailableError("cannot reach the Docker engine: is the Docker daemon running?")


class EngineState(WorkerState):
    """A worker's state whose engine is the test's (everything else is the real thing)."""

    def __init__(self, settings: Settings, app: Any, engine: FlakyEngine) -> None:
        super().__init__(settings, app)
        self._engine = engine

    def engine(self) -> JobRunner:
        return self._engine


def deliver_until_settled(task: Any, job_id: str, spec: dict[str, Any], limit: int = 50) -> list[str]:
    """Apply the task, then each retry it asks for, until one does not retry; returns the states."""
    states: list[str] = []
    args, kwargs, retries = [job_id, spec], {}, 0
    for _ in range(limit):
        result = task.apply(args=args, kwargs=kwargs, retries=retries, throw=False)
        states.append(result.state)
        if not isinstance(result.result, Retry):
            return states
        signature = result.result.sig
        args, kwargs, retries = list(signature.args), dict(signature.kwargs), signature.options["retries"]
    raise AssertionError(f"still retrying after {limit} deliveries: {states}")


def run_flaky_job(
    settings: Settings, client: Client, redis_failures: int
) -> tuple[FlakyEngine, JobStore, str]:
    engine = FlakyEngine(redis_failures)
    app = Celery("delivery-retries", set_as_current=False)
    state = EngineState(settings, app, engine)
    register_task(app, state)
    state.load_signer(gethostname())  # the worker name Celery's eager apply gives the task
    job = client.submit("Docker is down, and Redis restarted under me")
    spec = job.record().spec.model_dump(mode="json")
    deliver_until_settled(app.tasks["sandfleet.run_job"], job.job_id, spec)
    return engine, state.store, job.job_id


def test_redis_retries_do_not_spend_the_engines_retry_budget(
    settings: Settings, client: Client, raw_redis: redis.Redis
) -> None:
    engine, store, job_id = run_flaky_job(settings, client, redis_failures=3)
    # three deliveries lost Redis, then the first run plus ENGINE_RETRIES retries found Docker down
    assert engine.runs == 3 + 1 + ENGINE_RETRIES
    record = store.record(job_id)
    assert record is not None and record.status == JobStatus.FAILED and record.result is not None
    assert record.result.error is not None
    assert record.result.error.kind == ErrorKind.SANDBOX_UNAVAILABLE
    assert record.result.error.message.endswith(f"(after {ENGINE_RETRIES} retries)")


def test_redis_retries_have_their_own_budget(
    settings: Settings, client: Client, raw_redis: redis.Redis
) -> None:
    """Redis failing on every delivery: the task gives up after REDIS_RETRIES retries (the message is
    acknowledged; the recovery's reconciliation republishes a job left without one), not never."""
    engine, store, job_id = run_flaky_job(settings, client, redis_failures=10_000)
    assert engine.runs == 1 + REDIS_RETRIES
    record = store.record(job_id)
    assert record is not None and not record.status.is_final
