"""``sandfleet loadtest --local --hosts N [--kill-host K]``: the load test through a multi-host fleet
(sandfleet/fleet/hosts.py), with the figures a fault needs: jobs lost, jobs done twice, recovery.

``lost``: jobs with no final record when the wait ended. ``done_twice``: jobs whose audit holds more
than one final ``state`` event (a job that ran to the end twice). With ``kill_host``, host K's worker
and engine are SIGKILLed once a quarter of the jobs ended, and K comes back ``REJOIN_AFTER_S`` later
(a new engine and worker, whose reaper removes what the dead one left).
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
) -> dict[str, Any]:
    """Start ``hosts`` hosts, drive them with ``plan_for(model)``, optionally kill one; the report.

    ``secured``: the fleet's Redis speaks TLS only, with an ACL user per role (HostFleet)."""
    fleet = HostFleet(hosts, config, secured=secured)
    with fleet:
        plan: LoadPlan = plan_for(fleet.model)
        killer = HostKiller(fleet, kill_host, plan.jobs) if kill_host else None
        with Client(settings=fleet.settings) as client:
            data = run_load(
                client, plan, progress_stream=progress, on_progress=killer.on_progress if killer else None
            )
            if killer is not None:
                killer.join()
            counts = exactly_once_counts(client, client.reader.batch_job_ids(data.batch_id))
        described = {
            "local": True,
            "hosts": hosts,
            "redis_url": fleet.settings.redis_url,
            "redis_secured": secured,
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
    if killer is not None:
        report["kill_host"] = {
            "host": kill_host,
            "killed_at": killer.killed_at,
            "restored_at": killer.restored_at,
            "error": killer.error,
        }
    return report
