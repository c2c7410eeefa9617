"""Throughput of trivial jobs with Prometheus metrics on against off, in one run, interleaved rounds.

    flock /work/bench.lock .venv/bin/python benchmarks/metrics_overhead.py [--rounds 4] [--jobs 40]

Two local fleets side by side, each with its own Redis and one worker (same concurrency, sandboxes
and replay model answering at once with a trivial program): one with ``SANDFLEET_METRICS_PORT`` set,
one without. Each round runs ``--jobs`` jobs on one fleet, then on the other (the order alternates,
so drift of the host favours neither); while one runs the other is idle. The metrics endpoint is
scraped after every round of the fleet that has one, as Prometheus would. Printed: jobs/s of each
round, the totals, and the ratio on/off (target >= 0.98).
"""

from __future__ import annotations

import argparse
import statistics
import time
import urllib.request

from sandfleet.core.settings import Settings
from sandfleet.fleet.loadtest.churn import TRIVIAL_PROGRAM
from sandfleet.fleet.loadtest.driver import run_load
from sandfleet.fleet.loadtest.report import build_report
from sandfleet.fleet.loadtest.session import LoadTestOptions, make_plan
from sandfleet.fleet.local import FleetConfig, LocalFleet
from sandfleet.producer.client import Client


def run_round(fleet: LocalFleet, jobs: int) -> tuple[float, int]:
    """Jobs/s of one round of ``jobs`` trivial jobs on ``fleet``, and how many succeeded."""
    with Client(fleet.redis_url, settings=Settings(redis_url=fleet.redis_url)) as client:
        opts = LoadTestOptions(jobs=jobs, tools_module="", program=TRIVIAL_PROGRAM, warmup=0, progress=None)
        data = run_load(client, make_plan(opts, fleet.model, warmup=0), progress_stream=None)
    report = build_report(data, {"local": True})
    return report["throughput_jobs_per_s"], report["counts"]["succeeded"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=40, help="jobs per round and fleet")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sandboxes", type=int, default=2)
    args = parser.parse_args()

    def config(metrics: bool) -> FleetConfig:
        return FleetConfig(
            workers=1,
            concurrency=args.concurrency,
            sandboxes=args.sandboxes,
            tools="",
            program=TRIVIAL_PROGRAM,
            env={"SANDFLEET_POOL_SIZE": "2"},
            metrics=metrics,
        )

    rates: dict[str, list[float]] = {"on": [], "off": []}
    failed = 0
    with LocalFleet(config(True)) as on, LocalFleet(config(False)) as off:
        url = on.workers[0].metrics_url
        assert url, "the metrics fleet has no endpoint"
        fleets = {"on": on, "off": off}
        for fleet in fleets.values():  # warm-up, unmeasured: imports, first containers
            run_round(fleet, max(4, args.jobs // 8))
        for number in range(args.rounds):
            order = ["on", "off"] if number % 2 == 0 else ["off", "on"]
            for name in order:
                rate, ok = run_round(fleets[name], args.jobs)
                failed += args.jobs - ok
                rates[name].append(rate)
                if name == "on":
                    began = time.perf_counter()
                    with urllib.request.urlopen(url, timeout=5) as response:
                        size = len(response.read())
                    scrape_ms = (time.perf_counter() - began) * 1000
                    print(
                        f"round {number + 1} metrics on : {rate:6.2f} jobs/s   (scrape {size} B in {scrape_ms:.1f} ms)"
                    )
                else:
                    print(f"round {number + 1} metrics off: {rate:6.2f} jobs/s")
    mean_on, mean_off = statistics.fmean(rates["on"]), statistics.fmean(rates["off"])
    median_on, median_off = statistics.median(rates["on"]), statistics.median(rates["off"])
    print(f"{args.rounds} rounds x {args.jobs} trivial jobs per fleet, 1 worker each, concurrency {args.concurrency}, "
          f"{args.sandboxes} sandboxes")  # fmt: skip
    print(
        f"mean   on {mean_on:6.2f} jobs/s   off {mean_off:6.2f} jobs/s   ratio on/off {mean_on / mean_off:.3f}"
    )
    print(
        f"median on {median_on:6.2f} jobs/s   off {median_off:6.2f} jobs/s   ratio on/off {median_on / median_off:.3f}"
    )
    print(f"jobs not succeeded: {failed}   (target: ratio >= 0.98)")


if __name__ == "__main__":
    main()
