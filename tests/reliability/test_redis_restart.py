"""Redis restarted (kill -9, then started again on the same port and folder) under a running fleet.

With AOF (appendfsync always) nothing is lost: a message popped by a worker just as Redis died is in
neither the queue nor kombu's ``unacked``, and the workers' reconciliation (sandfleet/worker/delivery/recovery.py,
triggered by Redis' new run id) publishes such jobs again. Without persistence, the control run
shows that the harness does see loss when there is some. Redis full (maxmemory, noeviction) is covered by
tests/fleet/test_client.py::test_submit_fails_clearly_when_redis_is_full_and_nothing_is_half_written.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from sandfleet.fleet.local import LocalFleet

from .harness import final_state_events, note_figure, outcome_of, running_on, sleeper_script, wait_for

pytestmark = [pytest.mark.slow]

JOBS = 6


def restart_under_load(server: Any, fleet: LocalFleet, model: str) -> dict[str, Any]:
    fleet.start_worker(concurrency=2, sandboxes=2)
    fleet.start_worker(concurrency=2, sandboxes=2)
    with fleet.client() as client:
        jobs = [client.submit(f"Sleep {i}", model=model) for i in range(JOBS)]
        assert wait_for(lambda: sum(running_on(client, j.job_id) is not None for j in jobs) >= 2, 60)
    server.restart(kill=True)
    back = time.monotonic()
    with fleet.client() as client:
        probe = client.submit("Sleep after the restart", model=model)
        consumed = wait_for(
            lambda: (
                running_on(client, probe.job_id) is not None or client.get(probe.job_id).status().is_final
            ),
            120,
        )
        consume_s = time.monotonic() - back if consumed else None
        outcomes = {j.job_id: outcome_of(client, j.job_id, 120) for j in jobs}
        probe_outcome = outcome_of(client, probe.job_id, 60)
        duplicates = sum(
            final_state_events(client, job_id) > 1
            for job_id, o in outcomes.items()
            if not o.startswith("lost")
        )
    lost = sum(o.startswith("lost") for o in outcomes.values())
    return {
        "jobs": JOBS,
        "lost": lost,
        "outcomes": sorted(outcomes.values()),
        "consume_again_s": consume_s,
        "probe": probe_outcome,
        "duplicate_final_records": duplicates,
    }


def test_with_aof_a_redis_restart_loses_no_job(
    redis_factory: Callable[..., Any], make_fleet: Callable[..., LocalFleet]
) -> None:
    server = redis_factory("--save", "", "--appendonly", "yes", "--appendfsync", "always")
    fleet = make_fleet(server.url)
    figures = restart_under_load(server, fleet, f"replay:{sleeper_script(fleet.scripts_dir, 3)}")
    note_figure("redis_restart_aof", figures)
    assert figures["lost"] == 0, figures
    assert figures["duplicate_final_records"] == 0, figures
    assert figures["probe"] == "succeeded" and figures["consume_again_s"] is not None, figures


def test_without_persistence_the_harness_sees_the_loss(
    redis_factory: Callable[..., Any], make_fleet: Callable[..., LocalFleet]
) -> None:
    server = redis_factory()  # no RDB, no AOF: the control
    fleet = make_fleet(server.url)
    figures = restart_under_load(server, fleet, f"replay:{sleeper_script(fleet.scripts_dir, 3)}")
    note_figure("redis_restart_no_persistence_control", figures)
    assert figures["lost"] > 0, figures  # the harness can see loss
