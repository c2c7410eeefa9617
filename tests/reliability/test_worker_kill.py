"""kill -9 and SIGTERM of real workers in the middle of real jobs (Docker sandboxes, replay model).

The long version (20+ kills, p50/max redelivery time) is benchmarks/kill_workers.py.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest

from sandfleet.fleet.local import LocalFleet

from .harness import (
    containers_of,
    final_state_events,
    kill_round,
    running_on,
    sleeper_script,
    wait_for,
)

pytestmark = [pytest.mark.slow]

KILLS = 3
JOB_SLEEP_S = 8.0
LIMIT_S = 60.0


def test_killed_workers_jobs_are_redelivered_completed_once_and_their_containers_reaped(
    redis_factory: Callable[..., Any], make_fleet: Callable[..., LocalFleet]
) -> None:
    server = redis_factory()
    fleet = make_fleet(server.url)
    fleet.start_worker()
    fleet.start_worker()
    model = f"replay:{sleeper_script(fleet.scripts_dir, JOB_SLEEP_S)}"
    with fleet.client() as client:
        rounds = [kill_round(fleet, client, model, limit_s=LIMIT_S) for _ in range(KILLS)]
    for r in rounds:
        assert not r["lost"], r
        assert r["result"] == "10001@sandbox", r  # it ran in a sandbox, as the sandbox user
        assert r["redelivered_s"] is not None and r["redelivered_s"] < LIMIT_S, r
        assert r["final_records"] == 1 and r["deliveries"] >= 2, r
        assert r["reaped_s"] is not None and r["reaped_s"] < LIMIT_S, r


def test_sigterm_lets_running_jobs_finish_or_go_back_and_loses_none(
    redis_factory: Callable[..., Any], make_fleet: Callable[..., LocalFleet]
) -> None:
    server = redis_factory()
    fleet = make_fleet(server.url)
    first = fleet.start_worker(concurrency=1, sandboxes=1)
    model = f"replay:{sleeper_script(fleet.scripts_dir, 4)}"
    with fleet.client() as client:
        jobs = [client.submit(f"Sleep {i}", model=model) for i in range(3)]
        assert wait_for(lambda: any(running_on(client, j.job_id) for j in jobs), 60)
        first.process.send_signal(signal.SIGTERM)  # warm shutdown while a job runs and two wait
        assert first.process.wait(timeout=60) == 0, first.log()[-3000:]
        fleet.start_worker(concurrency=2, sandboxes=2)
        results = [j.result(timeout=120) for j in jobs]
        assert [r.status.value for r in results] == ["succeeded"] * 3
        assert all(final_state_events(client, j.job_id) == 1 for j in jobs)
    assert not containers_of(first.process.pid)
