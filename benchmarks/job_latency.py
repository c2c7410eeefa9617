"""Benchmark 2: the latency one job sees on a warm, idle fleet, split by phase.

    .venv/bin/python benchmarks/job_latency.py [--jobs 50] [--pause 0.5]

One local worker (4 slots, warm pool), zero model latency, ``print("RESULT: 1")``. Jobs go one at a
time: submit, wait for the result, pause so the pool refills, next. Printed per phase (from the job
record, see sandfleet/fleet/loadtest/phases.py) and as the client saw it (submit call to result returned).
Target (issue 6): p50 under 150 ms end to end excluding model time, on 2 cores. Printed, not asserted.
"""

from __future__ import annotations

import argparse
import time

from sandfleet.core.settings import Settings
from sandfleet.fleet.loadtest.churn import TRIVIAL_PROGRAM
from sandfleet.fleet.loadtest.phases import PHASES, job_phases
from sandfleet.fleet.loadtest.stats import phase_summaries
from sandfleet.fleet.local import FleetConfig, LocalFleet
from sandfleet.producer.client import Client

TARGET_P50_S = 0.150
WARMUP_JOBS = 3
RESULT_TIMEOUT_S = 60.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--sandboxes", type=int, default=4)
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between jobs (the pool refills)")
    args = parser.parse_args()

    config = FleetConfig(
        workers=1, concurrency=8, sandboxes=args.sandboxes, tools="", program=TRIVIAL_PROGRAM
    )
    with (
        LocalFleet(config) as fleet,
        Client(fleet.redis_url, settings=Settings(redis_url=fleet.redis_url)) as client,
    ):
        per_job = []
        for index in range(WARMUP_JOBS + args.jobs):
            began = time.perf_counter()
            handle = client.submit("trivial", model=fleet.model)
            result = handle.result(timeout=RESULT_TIMEOUT_S)
            seen_s = time.perf_counter() - began
            if index >= WARMUP_JOBS:
                record = handle.record()
                attempts = [a.timings for a in result.attempts if a.program]
                phases = job_phases(record.timestamps, result.timings, attempts)
                phases["client_seen"] = seen_s
                phases["client_seen_excl_model"] = seen_s - phases.get("model", 0.0)
                per_job.append(phases)
                if result.status.value != "succeeded":
                    print(f"job {handle.job_id} {result.status.value}: {result.error}")
            time.sleep(args.pause)
    names = [*PHASES, "client_seen", "client_seen_excl_model"]
    summaries = phase_summaries(per_job, names)
    print(f"{len(per_job)} sequential trivial jobs on a warm, idle fleet (1 worker, {args.sandboxes} slots)")
    print(f"{'phase (ms)':<26}{'p50':>8}{'p95':>8}{'max':>8}")
    for name in names:
        s = summaries[name]
        if s["count"]:
            print(f"{name:<26}{s['p50'] * 1000:>8.1f}{s['p95'] * 1000:>8.1f}{s['max'] * 1000:>8.1f}")
    p50 = summaries["end_to_end_excl_model"]["p50"]
    verdict = "meets" if p50 < TARGET_P50_S else "misses"
    print(
        f"\nend to end excluding model, p50: {p50 * 1000:.0f} ms ({verdict} the {TARGET_P50_S * 1000:.0f} ms target)"
    )


if __name__ == "__main__":
    main()
