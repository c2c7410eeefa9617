"""Benchmark: replaying and verifying a whole batch in one process against one command per job.

    flock /work/bench.lock .venv/bin/python benchmarks/replay_batch.py [--jobs 500] [--per-job 100]

A local fleet (2 workers) runs ``--jobs`` trivial jobs (the model answers at once with a program
printing ``RESULT: 1``); then, side by side in this run, with the workers idle:

1. ``sandfleet replay --batch ID --concurrency C``: one process, a warm pool, C replays at once;
2. ``sandfleet replay JOB``, one command after another (half of them before the batch replay, half
   after), for ``--per-job`` of the jobs (100 by default, ~1 s each: all 500 would take most of ten
   minutes): what an auditor had to do before. With fewer
   than all, the per-job total is the mean of those measured times ``--jobs`` (printed as such);
3. ``sandfleet audit --verify --batch ID``: its own verification time (in the JSON summary) and its
   wall time, and ``BatchHandle.verify()`` in this process (median of 3): events checked per second.

Every replay must match and every job verify; the script says so, and exits 1 if not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sandfleet.core.settings import Settings
from sandfleet.fleet.loadtest.churn import TRIVIAL_PROGRAM
from sandfleet.fleet.local import FleetConfig, LocalFleet
from sandfleet.producer.client import Client

SANDFLEET = str(Path(sys.executable).with_name("sandfleet"))
JOB_TIMEOUT_S = 1800.0


def command(fleet: LocalFleet, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run ``sandfleet ARGS`` against the fleet's Redis; ``(wall seconds, the process)``."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
        "SANDFLEET_REDIS_URL": fleet.redis_url,
    }
    began = time.perf_counter()
    done = subprocess.run([SANDFLEET, *args], env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    return time.perf_counter() - began, done


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument(
        "--per-job", type=int, default=100, help="jobs replayed one command each (0: all of them)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="replays at once in the batch replay")
    args = parser.parse_args()
    per_job = min(args.per_job or args.jobs, args.jobs)

    config = FleetConfig(workers=2, concurrency=16, sandboxes=4, tools="", program=TRIVIAL_PROGRAM)
    config.env["SANDFLEET_POOL_SIZE"] = "0"  # idle workers hold no warm containers during the replays
    ok = True
    with (
        LocalFleet(config) as fleet,
        Client(fleet.redis_url, settings=Settings(redis_url=fleet.redis_url)) as client,
    ):
        began = time.perf_counter()
        batch = client.submit_batch(
            [{"question": f"six times seven #{i}", "model": fleet.model} for i in range(args.jobs)]
        )
        results = batch.wait(timeout=JOB_TIMEOUT_S)
        run_s = time.perf_counter() - began
        succeeded = sum(r.status == "succeeded" for r in results)
        print(f"{args.jobs} trivial jobs run by 2 workers in {run_s:.1f} s ({succeeded} succeeded)")

        # The per-job commands run half before and half after the batch replay, so a change in the
        # host's load during the run weighs on both sides alike.
        sample = batch.job_ids[:per_job]
        times: list[float] = []

        def replay_one_by_one(job_ids: list[str]) -> int:
            """Replay each job with its own command; returns how many did not match."""
            mismatches = 0
            for job_id in job_ids:
                seconds, one = command(fleet, "replay", job_id)
                times.append(seconds)
                mismatches += one.returncode != 0
            return mismatches

        mismatches = replay_one_by_one(sample[: per_job // 2])
        batch_s, done = command(
            fleet, "replay", "--batch", batch.batch_id, "--concurrency", str(args.concurrency)
        )
        summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
        print(f"replay --batch (concurrency {args.concurrency}): {batch_s:.1f} s wall; {summary}")
        ok &= done.returncode == 0
        mismatches += replay_one_by_one(sample[per_job // 2 :])
        per_job_total = statistics.fmean(times) * args.jobs
        measured = "measured" if per_job == args.jobs else f"mean of {per_job} measured x {args.jobs}"
        print(
            f"one replay command per job: {sum(times):.1f} s for {per_job} jobs (half before, half after "
            f"the batch replay), {statistics.fmean(times):.3f} s a job (median "
            f"{statistics.median(times):.3f}), {mismatches} not matching; {per_job_total:.1f} s for "
            f"{args.jobs} ({measured})"
        )
        ok &= mismatches == 0
        print(f"replay --batch vs one replay per job: {per_job_total / batch_s:.1f}x faster")

        verify_s, done = command(fleet, "audit", "--verify", "--batch", batch.batch_id, "--json")
        data = json.loads(done.stdout)["summary"]
        ok &= done.returncode == 0 and data["verified"] == args.jobs
        print(
            f"audit --verify --batch: {data['verified']}/{data['jobs']} verified, {data['events']} events "
            f"checked in {data['seconds']:.3f} s ({data['events'] / data['seconds']:,.0f} events/s); "
            f"command wall {verify_s:.2f} s"
        )
        rounds = []
        for _ in range(3):
            report = client.batch(batch.batch_id).verify()
            rounds.append(report)
        best = statistics.median(r.seconds for r in rounds)
        events = rounds[0].events
        print(
            f"BatchHandle.verify() in process: {events} events in {best:.3f} s (median of 3): {events / best:,.0f} events/s"
        )
    print(
        "every replay matched and every job verified"
        if ok
        else "NOT ALL REPLAYS MATCHED OR VERIFIED: see above"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
