"""The Redis primary SIGKILLed mid-batch under a multi-host fleet (issue 24 point 5): primary, replica
and three Sentinels in the control namespace, every host's worker and the driver on the
``sentinel://`` URL. What is asserted: the Sentinels promote the replica, every job ends succeeded with
exactly one final state event (none lost, none done twice), every chain verifies (the audit events a
result depends on survived the failover), and no container is left on either engine. Recovery times
are printed and noted in artifacts/reliability-results.json, never asserted."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from reliability.harness import final_state_events, note_figure, outcome_of, sleeper_script, wait_for

from sandfleet.fleet.hosts import HostFleet

pytestmark = [pytest.mark.slow]

JOBS = 8
JOB_SLEEP_S = 4.0
LIMIT_S = 180.0


@pytest.mark.timeout(LIMIT_S + 150)
def test_the_redis_primary_killed_mid_batch_loses_no_job_on_any_host(
    host_fleet: Callable[..., HostFleet],
) -> None:
    fleet = host_fleet(2, sentinel=True)
    cluster = fleet.sentinel
    assert cluster is not None and fleet.redis_url.startswith("sentinel://")
    model = f"replay:{sleeper_script(fleet.scripts_dir, JOB_SLEEP_S)}"
    with fleet.client() as client:
        jobs = [client.submit(f"Sleep {i}", model=model) for i in range(JOBS)]
    running_on_both = lambda: all(e.sandboxes() for e in fleet.engines.values())  # noqa: E731
    assert wait_for(running_on_both, 60), "no job reached both hosts"
    killed = time.monotonic()
    fleet.kill_redis_primary()
    assert wait_for(lambda: cluster.primary_port() == cluster.replica.port, 30), "no replica promoted"
    promoted_s = time.monotonic() - killed
    with fleet.client() as client:
        outcomes = {j.job_id: outcome_of(client, j.job_id, LIMIT_S) for j in jobs}
        all_done_s = time.monotonic() - killed
        finals = [final_state_events(client, j) for j in outcomes]
        unverified = [j for j in outcomes if not client.get(j).verify().verified]
    figures = {
        "jobs": JOBS,
        "lost": sum(o.startswith("lost") for o in outcomes.values()),
        "done_twice": sum(f > 1 for f in finals),
        "promoted_after_kill_s": round(promoted_s, 1),
        "all_done_after_kill_s": round(all_done_s, 1),
    }
    print(figures)
    note_figure("hosts_redis_failover", figures)
    assert sorted(outcomes.values()) == ["succeeded"] * JOBS, outcomes
    assert finals == [1] * JOBS, finals  # none lost, none done twice
    assert unverified == [], unverified
    for engine in fleet.engines.values():
        assert wait_for(lambda e=engine: not e.sandboxes(), 60, 0.5), engine.sandboxes()
