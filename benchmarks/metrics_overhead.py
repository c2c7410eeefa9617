"""Throughput of trivial jobs with Prometheus metrics on against off, in one run, interleaved rounds.

    flock /work/bench.lock .venv/bin/python benchmarks/metrics_overhead.py [--rounds 4] [--jobs 40]

Two local fleets side by side, each with its own Redis and one worker (same concurrency, sandboxes
and replay model answering at once with a trivial program): one with ``SANDFLEET_METRICS_PORT`` set,
one without. Each round runs ``--jobs`` jobs on one fleet, then on the other (the order alternates,
so drift of the host favours neither); while one runs the other is idle. The metrics endpoint is
scraped after every round of the fleet that has one, as Prometheus would. Printed: jobs/s of each
round, the totals, and the ratio on/off (target >= 0.98); then, since a shared host makes rounds
swing, the cost the metrics add to one job measured directly (``WorkerMetrics.job_ended`` on a
finished job's record, the only work the metrics do per job) against the mean time per job.
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


def job_ended_cost_us(repeats: int = 5000) -> float:
    """Microseconds of ``WorkerMetrics.job_ended`` for a code-action job with a repair and tool calls."""
    from sandfleet.core.contracts import AttemptRecord, JobResult, JobStatus, TokenUsage, ToolCallRecord
    from sandfleet.core.records import JobRecord
    from sandfleet.worker.metrics import WorkerMetrics

    calls = [ToolCallRecord(seq=i, tool="load_orders", ok=True, duration_ms=3.0) for i in range(3)]
    result = JobResult(
        job_id="j",
        status=JobStatus.SUCCEEDED,
        attempts=[
            AttemptRecord(number=1, program="x", tool_calls=calls),
            AttemptRecord(number=2, program="y"),
        ],
        repairs=1,
        usage=TokenUsage(prompt_tokens=900, completion_tokens=120, model_calls=2),
        timings={"model_s": 0.5, "acquire_s": 0.01, "run_s": 0.2, "tool_s": 0.01, "total_s": 0.8},
    )
    record = JobRecord(
        job_id="j", status=JobStatus.SUCCEEDED, timestamps={"queued": 1.0, "running": 1.2}, result=result
    )
    metrics = WorkerMetrics()
    began = time.perf_counter()
    for _ in range(repeats):
        metrics.job_ended(record)
    return (time.perf_counter() - began) / repeats * 1e6


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
    cost_us = job_ended_cost_us()
    per_job_us = 1e6 / mean_off
    print(f"metrics work per job: {cost_us:.1f} us against {per_job_us / 1000:.0f} ms of fleet time per job "
          f"({cost_us / per_job_us:.5%}; the sandbox gauges are read only when scraped)")  # fmt: skip


if __name__ == "__main__":
    main()
