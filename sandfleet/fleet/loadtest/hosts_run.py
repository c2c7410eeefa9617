"""``sandfleet loadtest --local --hosts N [--kill-host K] [--sentinel [--kill-redis-primary]]``: the
load test through a multi-host fleet (sandfleet/fleet/hosts.py), with the figures a fault needs: jobs
lost, jobs done twice, recovery.

``lost``: jobs with no final record when the wait ended. ``done_twice``: jobs whose audit holds more
than one final ``state`` event (a job that ran to the end twice). With ``kill_host``, host K's worker
and engine are SIGKILLed once a quarter of the jobs ended, and K comes back ``REJOIN_AFTER_S`` later
(a new engine and worker, whose reaper removes what the dead one left). With ``kill_redis_primary``
(a ``sentinel`` fleet), the Redis primary is SIGKILLed at the same point; ``recovery_s`` is the time
from the kill until a job that started running after it has ended: the fleet takes and finishes new
work again (the next job to end is usually one that was in flight, and says less: Celery's consumers
reconnect after the jobs in flight have sealed their records).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from sandfleet.fleet.hosts import HostFleet
from sandfleet.fleet.loadtest.driver import LoadPlan, run_load
from sandfleet.fleet.loadtest.report import build_report
from sandfleet.fleet.local import FleetConfig
from sandfleet.producer.client import Client

FINAL_STATES = frozenset({"succeeded", "failed", "timed_out", "refused", "cancelled"})
REJOIN_AFTER_S = 10.0
PROMOTION_TIMEOUT_S = 30.0
KILL_AT_FRACTION = 0.25


class HostKiller:
    """Kills host K once ``KILL_AT_FRACTION`` of the jobs ended, restores it later (in a thread)."""

    def __init__(self, fleet: HostFleet, host: int, jobs: int) -> None:
        self.fleet, self.host, self.jobs = fleet, host, jobs
        self.killed_at: float | None = None
        self.restored_at: float | None = None
        self.error: str | None = None
        self._thread: threading.Thread | None = None

    def on_progress(self, done: int) -> None:
        if self._thread is None and done >= max(1, int(self.jobs * KILL_AT_FRACTION)):
            self._thread = threading.Thread(target=self._run, name="kill-host", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self.killed_at = time.time()
            self.fleet.kill_host(self.host)
            time.sleep(REJOIN_AFTER_S)
            self.fleet.restore_host(self.host)
            self.restored_at = time.time()
        except Exception as e:  # reported, not raised: the other hosts' jobs are still measured
            self.error = f"{type(e).__name__}: {e}"

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=120)


class PrimaryKiller:
    """Kills the Redis primary once ``KILL_AT_FRACTION`` of the jobs ended; times the recovery."""

    def __init__(self, fleet: HostFleet, jobs: int) -> None:
        self.fleet, self.jobs = fleet, jobs
        self.done_at_kill: int | None = None
        self.killed_at: float | None = None  # monotonic
        self.killed_wall: float | None = None  # time.time(), against the records' timestamps
        self.promoted_s: float | None = None
        self.recovery_s: float | None = None
        self.error: str | None = None

    def on_progress(self, done: int) -> None:
        if self.done_at_kill is None and done >= max(1, int(self.jobs * KILL_AT_FRACTION)):
            self.done_at_kill = done
            self.killed_at, self.killed_wall = time.monotonic(), time.time()
            threading.Thread(target=self._kill, name="kill-redis-primary", daemon=True).start()
        elif self.killed_at is not None and self.recovery_s is None and done > (self.done_at_kill or 0):
            self.recovery_s = time.monotonic() - self.killed_at

    def _kill(self) -> None:
        cluster = self.fleet.sentinel
        try:
            assert cluster is not None and self.killed_at is not None
            self.fleet.kill_redis_primary()
            deadline = self.killed_at + PROMOTION_TIMEOUT_S
            while time.monotonic() < deadline:
                if cluster.primary_port() == cluster.replica.port:
                    self.promoted_s = time.monotonic() - self.killed_at
                    return
                time.sleep(0.05)
            self.error = f"no replica promoted within {PROMOTION_TIMEOUT_S:g} s"
        except Exception as e:  # reported, not raised: the jobs are still counted
            self.error = f"{type(e).__name__}: {e}"

    def figures(self, jobs: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "promoted_s": self.promoted_s,
            "next_job_done_s": self.recovery_s,
            "new_job_done_s": None if self.killed_wall is None else new_job_done_s(jobs, self.killed_wall),
            "done_before_kill": self.done_at_kill,
            "error": self.error,
        }


def new_job_done_s(jobs: list[dict[str, Any]], since: float) -> float | None:
    """Seconds from ``since`` (epoch s) until the first job that began running after it ended, from
    the jobs' record summaries (``running_at``, ``ended_at``); None when no such job ended."""
    ends = [j["ended_at"] for j in jobs if j.get("ended_at") and (j.get("running_at") or 0) > since]
    return min(ends) - since if ends else None


def exactly_once_counts(client: Client, job_ids: list[str]) -> dict[str, int]:
    """``{"lost": .., "done_twice": ..}`` over the jobs, from their records and audit chains."""
    lost = twice = 0
    for job_id in job_ids:
        handle = client.get(job_id)
        finals = sum(1 for e in handle.audit() if e.kind == "state" and e.data.get("status") in FINAL_STATES)
        lost += finals == 0
        twice += finals > 1
    return {"lost": lost, "done_twice": twice}


def run_on_hosts(
    hosts: int,
    config: FleetConfig,
    plan_for: Any,
    kill_host: int | None,
    progress: TextIO | None = sys.stderr,
    *,
    secured: bool = False,
    sentinel: bool = False,
    kill_redis_primary: bool = False,
) -> dict[str, Any]:
    """Start ``hosts`` hosts, drive them with ``plan_for(model)``, optionally kill one (or the Redis
    primary); the report.

    ``secured``: the fleet's Redis speaks TLS only, with an ACL user per role; ``sentinel``: it is a
    primary, a replica and three Sentinels (HostFleet)."""
    fleet = HostFleet(hosts, config, secured=secured, sentinel=sentinel)
    with fleet:
        plan: LoadPlan = plan_for(fleet.model)
        killer = HostKiller(fleet, kill_host, plan.jobs) if kill_host else None
        primary_killer = PrimaryKiller(fleet, plan.jobs) if kill_redis_primary else None

        def on_progress(done: int) -> None:
            for fault in (killer, primary_killer):
                if fault is not None:
                    fault.on_progress(done)

        with Client(settings=fleet.settings) as client:
            data = run_load(client, plan, progress_stream=progress, on_progress=on_progress)
            if killer is not None:
                killer.join()
            counts = exactly_once_counts(client, client.reader.batch_job_ids(data.batch_id))
        described = {
            "local": True,
            "hosts": hosts,
            "redis_url": fleet.settings.redis_url,
            "redis_secured": secured,
            "redis_sentinel": sentinel,
            "concurrency": config.concurrency,
            "sandboxes": config.sandboxes,
            "model_latency_s": config.model_latency_s,
            "containers_counted": "not sampled (each host has its own engine)",
        }
        report = build_report(data, described)
        left = {h: len(engine.sandboxes()) for h, engine in fleet.engines.items()}
    report.update(counts)
    report["jobs_per_s"] = report["throughput_jobs_per_s"]
    report["succeeded"] = report["counts"]["succeeded"]
    report["sandboxes_at_end_per_host"] = left
    if primary_killer is not None:
        report["kill_redis_primary"] = primary_killer.figures(data.jobs)
        report["recovery_s"] = report["kill_redis_primary"]["new_job_done_s"]
    if killer is not None:
        report["kill_host"] = {
            "host": kill_host,
            "killed_at": killer.killed_at,
            "restored_at": killer.restored_at,
            "error": killer.error,
        }
    return report
