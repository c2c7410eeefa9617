"""``recovery_s`` of ``loadtest --kill-redis-primary``: the first job that *began* after the kill and
ended, not the first to end (a job in flight at the kill seals its record before the workers take
new jobs again)."""

from __future__ import annotations

from sandfleet.fleet.loadtest.hosts_run import new_job_done_s

KILL = 1000.0


def test_recovery_counts_only_jobs_that_began_after_the_kill() -> None:
    jobs = [
        {"running_at": 998.0, "ended_at": 1002.5},  # in flight at the kill: ends first, not counted
        {"running_at": 1004.0, "ended_at": 1006.0},
        {"running_at": 1005.0, "ended_at": 1005.5},  # began later, ended sooner: the recovery
        {"running_at": 1007.0, "ended_at": None},  # still running
        {"running_at": None, "ended_at": None},  # never ran
    ]
    assert new_job_done_s(jobs, KILL) == 5.5


def test_no_job_begun_after_the_kill_gives_no_figure() -> None:
    assert new_job_done_s([{"running_at": 990.0, "ended_at": 1003.0}], KILL) is None
