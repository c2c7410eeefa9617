"""Hosts whose clocks are off (issue 24 point 5): host 1's worker runs 30 s behind, host 2's 30 s
ahead (libfaketime, monotonic clocks true: sandfleet/fleet/skewed_clock.py), against Redis, the
driver and each other, while a batch runs on both.

Each worker's own heartbeat shows the offset (the time it wrote against Redis's clock). What is
asserted: both hosts ran jobs; every job ends succeeded, delivered once (nothing handed back early:
no restore or republish in ``{p}:recovered``), with exactly one final state event, and its chain
verifies; no container is left on either engine."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from reliability.harness import final_state_events, note_figure, sleeper_script, wait_for

from sandfleet.core.replies import text
from sandfleet.fleet.hosts import HostFleet
from sandfleet.fleet.skewed_clock import libfaketime

pytestmark = [pytest.mark.slow]

OFFSETS = {1: -30.0, 2: 30.0}
JOBS = 12
JOB_SLEEP_S = 4.0
LIMIT_S = 180.0


def worker_clock_offset_s(fleet: HostFleet, host: int) -> float:
    """The host's worker's clock minus Redis's: its last heartbeat's ``at`` (written with the
    worker's ``time.time()``) against Redis's TIME now (a beat is at most ~2 s old)."""
    worker = fleet.host_workers[host].name
    with fleet.client() as client:
        beat = json.loads(text(client.redis.get(client.keys.heartbeat(worker))))
        seconds, micros = client.redis.time()
    return float(beat["at"]) - (seconds + micros / 1e6)


@pytest.mark.timeout(LIMIT_S + 150)
def test_workers_30_s_behind_and_ahead_run_a_batch_exactly_once_and_hand_nothing_back(
    host_fleet: Callable[..., HostFleet], skip_or_fail: Callable[[str], None]
) -> None:
    try:
        libfaketime()
    except FileNotFoundError as e:
        skip_or_fail(str(e))
    fleet = host_fleet(2, clocks={h: f"{o:+.0f}s" for h, o in OFFSETS.items()})
    seen = {h: worker_clock_offset_s(fleet, h) for h in OFFSETS}
    for host, offset in OFFSETS.items():  # the workers' time.time() really is off
        assert abs(seen[host] - offset) < 10, seen
    model = f"replay:{sleeper_script(fleet.scripts_dir, JOB_SLEEP_S)}"
    with fleet.client() as client:
        jobs = [client.submit(f"Sleep {i}", model=model) for i in range(JOBS)]
        for job in jobs:
            job.result(timeout=LIMIT_S)
        records = [client.get(j.job_id).record() for j in jobs]
        finals = [final_state_events(client, j.job_id) for j in jobs]
        unverified = [j.job_id for j in jobs if not client.get(j.job_id).verify().verified]
        recovered = client.redis.xrange(client.keys.recovered)
    hosts_used = {(r.worker or "?").split("-")[0] for r in records}
    figures = {
        "jobs": JOBS,
        "worker_clock_offsets_s": {h: round(v, 1) for h, v in seen.items()},
        "lost": sum(f == 0 for f in finals),
        "done_twice": sum(f > 1 for f in finals),
        "redelivered": sum(r.deliveries > 1 for r in records),
        "handed_back": len(recovered),
        "jobs_per_host": {
            h: sum((r.worker or "").startswith(f"{h}-") for r in records) for h in ("h1", "h2")
        },
    }
    print(figures)
    note_figure("hosts_clock_skew", figures)
    assert hosts_used == {"h1", "h2"}, figures  # both skewed workers ran jobs
    assert [r.status.value for r in records] == ["succeeded"] * JOBS, figures
    assert finals == [1] * JOBS, figures  # none lost, none done twice
    assert [r.deliveries for r in records] == [1] * JOBS, figures  # nothing handed back early
    assert recovered == [], recovered
    assert unverified == [], unverified
    for engine in fleet.engines.values():
        assert wait_for(lambda e=engine: not e.sandboxes(), 60, 0.5), engine.sandboxes()
