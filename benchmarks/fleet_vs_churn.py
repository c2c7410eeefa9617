"""Benchmark 1: fleet throughput of trivial jobs against raw ``docker run --rm`` churn, side by side.

    .venv/bin/python benchmarks/fleet_vs_churn.py [--jobs 100] [--rounds 3] [--sandboxes 4] [--pool-sizes 2]

Raw churn: ``--sandboxes`` threads looping ``containers.run(remove=True)`` of the sandbox image with
the sandbox's hardening (sandfleet/fleet/loadtest/churn.py). Fleet: one local worker with ``--sandboxes``
slots, zero model latency, the program ``print("RESULT: 1")``, all jobs of a round at once.

A shared 2-core host drifts by 5-10% from one minute to the next, more than the gap this measures,
so the two are interleaved: one fleet stays up, and each round runs ``--jobs`` of raw churn and
``--jobs`` fleet jobs back to back, in alternating order (raw first, then fleet first, ...). The
ratio is total fleet jobs/s over total raw jobs/s across the rounds; each round's ratio is printed
too, so the spread shows. Target (issue 6): fleet >= 0.9 of raw churn. Figures are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from sandfleet.fleet.loadtest.churn import TRIVIAL_PROGRAM, ChurnResult, measure_churn
from sandfleet.fleet.loadtest.session import LoadTestOptions, make_plan, run_on_fleet
from sandfleet.fleet.local import FleetConfig, LocalFleet

TARGET_RATIO = 0.9


def ms(summary: dict[str, Any], key: str = "p50") -> str:
    value = summary.get(key)
    return "-" if value is None else f"{value * 1000:.0f}"


def fleet_round(fleet: LocalFleet, jobs: int, warmup: int) -> dict[str, Any]:
    opts = LoadTestOptions(jobs=jobs, tools_module="", program=TRIVIAL_PROGRAM, warmup=warmup)
    return run_on_fleet(fleet, make_plan(opts, fleet.model, warmup=warmup), progress=None)


def describe_fleet(report: dict[str, Any], jobs: int) -> str:
    phases = report["phases_s"]
    return (
        f"{report['throughput_jobs_per_s']:.2f} jobs/s, {report['counts']['succeeded']}/{jobs} succeeded; "
        f"p50 ms: queue {ms(phases['queue_wait'])}, acquire {ms(phases['acquire'])}, run {ms(phases['run'])}, "
        f"result write {ms(phases['result_write'])}; peak containers {report['peak_live_containers']}"
    )


def compare(args: argparse.Namespace, pool_size: int) -> float:
    """Interleaved rounds against one fleet of ``pool_size``; returns the overall fleet/raw ratio."""
    config = FleetConfig(
        workers=1,
        concurrency=args.concurrency,
        sandboxes=args.sandboxes,
        tools="",
        program=TRIVIAL_PROGRAM,
        env={"SANDFLEET_POOL_SIZE": str(pool_size)},
    )
    raws: list[ChurnResult] = []
    fleets: list[dict[str, Any]] = []
    with LocalFleet(config) as fleet:
        print(f"\npool_size {pool_size}: {args.rounds} rounds of {args.jobs} jobs each way")
        for number in range(args.rounds):
            order = ("raw", "fleet") if number % 2 == 0 else ("fleet", "raw")
            for what in order:
                if what == "raw":
                    raws.append(measure_churn(args.jobs, args.sandboxes))
                else:  # the first round warms the worker (imports, pool) outside the timed jobs
                    fleets.append(fleet_round(fleet, args.jobs, args.sandboxes if number == 0 else 0))
            raw, report = raws[-1], fleets[-1]
            print(
                f"  round {number + 1}: raw {raw.jobs_per_s:.2f} jobs/s ({raw.failures} failures), "
                f"fleet {describe_fleet(report, args.jobs)}; "
                f"ratio {report['throughput_jobs_per_s'] / raw.jobs_per_s:.2f}"
            )
    raw_rate = sum(r.runs for r in raws) / sum(r.wall_s for r in raws)
    # a round's span is first submit to last end: jobs done / throughput
    spans = [r["counts"]["done"] / r["throughput_jobs_per_s"] for r in fleets]
    fleet_rate = sum(r["counts"]["succeeded"] for r in fleets) / sum(spans)
    ratios = [f["throughput_jobs_per_s"] / r.jobs_per_s for f, r in zip(fleets, raws, strict=True)]
    ratio = fleet_rate / raw_rate
    verdict = "meets" if ratio >= TARGET_RATIO else "below"
    print(
        f"  overall: raw churn {raw_rate:.2f} jobs/s, fleet {fleet_rate:.2f} jobs/s -> "
        f"fleet/raw {ratio:.2f} ({verdict} the {TARGET_RATIO} target); "
        f"per round {min(ratios):.2f}-{max(ratios):.2f}, median {statistics.median(ratios):.2f}"
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100, help="jobs per round, each way")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sandboxes", type=int, default=4, help="worker slots = churn concurrency")
    parser.add_argument("--concurrency", type=int, default=16, help="worker jobs in flight")
    parser.add_argument(
        "--pool-sizes", default="2", help="SANDFLEET_POOL_SIZE values to try, comma-separated"
    )
    args = parser.parse_args()
    for pool_size in (int(p) for p in args.pool_sizes.split(",")):
        compare(args, pool_size)


if __name__ == "__main__":
    main()
