"""A waiting job survives its worker's kill -9 and a Redis restart (AOF): the decision is made while no
worker is alive, and the job resumes on another worker, running the approved call once."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from sandfleet_testing.workers import WorkerFactory

from sandfleet.core.contracts import JobStatus

from .helpers import JOB_TIMEOUT_S, approval_env, gated_worker, ledger, pending_of, wait_for

pytestmark = [pytest.mark.slow]


def test_a_waiting_job_survives_a_killed_worker_and_a_redis_restart(
    redis_factory: Any, fleet_worker: WorkerFactory
) -> None:
    server = redis_factory("--save", "", "--appendonly", "yes", "--appendfsync", "always")
    first = gated_worker(fleet_worker, "durable", approval_env(), redis_url=server.url)
    client = first.client
    job = client.submit("Refund order one", tools=["lookup_order", "issue_refund"], model=first.model)
    wait_for(lambda: job.status() == JobStatus.AWAITING_APPROVAL, what="the job to be suspended")
    first.fleet.kill(first.worker, signal.SIGKILL)  # no worker is alive now
    first.worker.process.wait()
    server.restart(kill=True)  # kill -9, started again from its AOF
    wait_for(lambda: _answers(client), 30, what="Redis to come back")
    assert job.status() == JobStatus.AWAITING_APPROVAL
    [request] = pending_of(first, job.job_id)
    client.approve(request.id, by="ana")  # decided while no worker is alive: queued and published
    assert job.status() == JobStatus.QUEUED
    # Another worker of the same fleet (its readiness is the job's result: no control ping here).
    first.fleet.start_worker(wait=False)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == {"refund": "refund-O-1-25", "paid": 25.0}
    # Each tool ran once, across both workers: the resumed run was served lookup_order's record.
    assert [e["tool"] for e in ledger(first.fleet.data_dir)] == ["lookup_order", "issue_refund"]
    assert job.record().worker != first.worker.name


def _answers(client: Any) -> bool:
    try:
        return bool(client.redis.ping())
    except Exception:
        return False
