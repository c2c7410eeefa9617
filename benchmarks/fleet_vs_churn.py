"""Benchmark 1: fleet throughput of trivial jobs against raw ``docker run --rm`` churn, side by side.

    .venv/bin/python benchmarks/fleet_vs_churn.py [--jobs 150] [--sandboxes 4] [--pool-sizes 2,4]

Raw churn: ``--sandboxes`` threads looping ``containers.run(remove=True)`` of the sandbox image with
the sandbox's hardening (worker/loadtest/churn.py). Fleet: one local worker with ``--sandboxes``
slots, zero model latency, the program ``print("RESULT: 1")``, all jobs at once. Churn is measured
before and after the fleet runs and averaged, so drift on a shared host shows. Target (issue 6):
fleet >= 0.9 of raw churn. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics

from worker.loadtest.churn import TRIVIAL_PROGRAM, measure_churn
from worker.loadtest.fleet import FleetConfig, LocalFleet
from worker.loadtest.session import LoadTestOptions, make_plan, run_on_fleet

TARGET_RATIO = 0.9


def fleet_run(jobs: int, sandboxes: int, concurrency: int, pool_size: int) -> dict:
    config = FleetConfig(
        workers=1,
        concurrency=concurrency,
        sandboxes=sandboxes,
        tools="",
        program=TRIVIAL_PROGRAM,
        env={"SANDFLEET_POOL_SIZE": str(pool_size)},
    )
    with LocalFleet(config) as fleet:
        opts = LoadTestOptions(jobs=jobs, tools_module="", program=TRIVIAL_PROGRAM, warmup=sandboxes)
        return run_on_fleet(fleet, make_plan(opts, fleet.model, warmup=sandboxes))


def ms(summary: dict, key: str = "p50") -> str:
    value = summary.get(key)
    return "-" if value is None else f"{value * 1000:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=150)
    parser.add_argument("--sandboxes", type=int, default=4, help="worker slots = churn concurrency")
    parser.add_argument("--concurrency", type=int, default=16, help="worker jobs in flight")
    parser.add_argument(
        "--pool-sizes", default="2", help="SANDFLEET_POOL_SIZE values to try, comma-separated"
    )
    args = parser.parse_args()

    churn = [measure_churn(args.jobs, args.sandboxes)]
    print(
        f"raw churn (before): {churn[0].jobs_per_s:.2f} jobs/s, per run p50 {ms(churn[0].per_run_s)} ms, "
        f"{churn[0].failures} failures"
    )
    fleets = {}
    for pool_size in (int(p) for p in args.pool_sizes.split(",")):
        report = fleet_run(args.jobs, args.sandboxes, args.concurrency, pool_size)
        fleets[pool_size] = report
        phases = report["phases_s"]
        print(
            f"fleet (pool_size {pool_size}): {report['throughput_jobs_per_s']:.2f} jobs/s, "
            f"{report['counts']['succeeded']}/{args.jobs} succeeded; p50 ms: queue {ms(phases['queue_wait'])}, "
            f"acquire {ms(phases['acquire'])} (p95 {ms(phases['acquire'], 'p95')}), run {ms(phases['run'])}, "
            f"engine {ms(phases['engine'])}, result write {ms(phases['result_write'])}; "
            f"peak containers {report['peak_live_containers']}"
        )
    churn.append(measure_churn(args.jobs, args.sandboxes))
    print(f"raw churn (after): {churn[1].jobs_per_s:.2f} jobs/s, per run p50 {ms(churn[1].per_run_s)} ms")
    raw = statistics.mean(c.jobs_per_s for c in churn)
    print(f"\nraw churn at concurrency {args.sandboxes}: {raw:.2f} jobs/s (mean of before/after)")
    for pool_size, report in fleets.items():
        ratio = report["throughput_jobs_per_s"] / raw
        verdict = "meets" if ratio >= TARGET_RATIO else "below"
        print(f"fleet/raw (pool_size {pool_size}): {ratio:.2f}  ({verdict} the {TARGET_RATIO} target)")


if __name__ == "__main__":
    main()
