"""Benchmark 4: the same jobs across several worker processes; nothing lost, nothing done twice.

    .venv/bin/python benchmarks/several_workers.py [--jobs 1000] [--workers 3] [--sandboxes 2]

``--workers`` local worker processes, each with its own ``--sandboxes`` slots, share one queue; the
model answers after ``--latency`` s, the program is trivial, all jobs are submitted at once. Then,
against Redis, before the fleet stops: every job of the batch has a record in a final state, exactly
one final-record guard, exactly one "done" signal, exactly one final state event in its audit
stream, and its delivery and attempt counts; the broker queue and kombu's unacked hash are empty.
Printed: how the work spread, and any job that breaks a count.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

from sandfleet.core.priority import queue_length
from sandfleet.core.queue import queue_name
from sandfleet.core.settings import Settings
from sandfleet.fleet.loadtest.churn import TRIVIAL_PROGRAM
from sandfleet.fleet.loadtest.driver import run_load
from sandfleet.fleet.loadtest.report import build_report
from sandfleet.fleet.loadtest.sampler import FleetSampler
from sandfleet.fleet.loadtest.session import LoadTestOptions, make_plan
from sandfleet.fleet.local import FleetConfig, LocalFleet
from sandfleet.producer.client import Client

FINAL = {"succeeded", "failed", "refused", "timed_out"}
CHUNK = 200


def check_jobs(client: Client, batch_id: str) -> dict[str, Counter]:
    """Per-job counts read from Redis: final states, guards, done signals, final audit events."""
    keys = client.keys
    job_ids = client.reader.batch_job_ids(batch_id)
    tallies: dict[str, Counter] = {
        name: Counter() for name in ("status", "guards", "done", "final_events", "deliveries", "attempts")
    }
    for start in range(0, len(job_ids), CHUNK):
        chunk = job_ids[start : start + CHUNK]
        pipe = client.redis.pipeline(transaction=False)
        for job_id in chunk:
            pipe.hmget(keys.job(job_id), ["status", "deliveries", "attempts", "result"])
            pipe.exists(keys.final_guard(job_id))
            pipe.llen(keys.done(job_id))
            pipe.xrange(keys.audit(job_id))
        replies = pipe.execute()
        for i in range(len(chunk)):
            (status, deliveries, attempts, result), guard, done, audit = replies[4 * i : 4 * i + 4]
            final_events = sum(
                1
                for _id, fields in audit
                if json.loads(fields["event"]).get("kind") == "state"
                and json.loads(fields["event"])["data"].get("status") in FINAL
            )
            tallies["status"][status if result else f"{status} (no result)"] += 1
            tallies["guards"][guard] += 1
            tallies["done"][done] += 1
            tallies["final_events"][final_events] += 1
            tallies["deliveries"][int(deliveries or 0)] += 1
            tallies["attempts"][int(attempts or 0)] += 1
    tallies["records"] = Counter({"jobs in the batch": len(job_ids)})
    return tallies


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--sandboxes", type=int, default=2, help="slots per worker")
    parser.add_argument("--concurrency", type=int, default=48, help="jobs in flight per worker")
    parser.add_argument("--latency", type=float, default=2.0, help="model seconds per answer")
    args = parser.parse_args()

    config = FleetConfig(
        workers=args.workers,
        concurrency=args.concurrency,
        sandboxes=args.sandboxes,
        tools="",
        program=TRIVIAL_PROGRAM,
        model_latency_s=args.latency,
    )
    with LocalFleet(config) as fleet:
        settings = Settings(redis_url=fleet.redis_url)
        with Client(fleet.redis_url, settings=settings) as client:
            opts = LoadTestOptions(jobs=args.jobs, tools_module="", program=TRIVIAL_PROGRAM, warmup=0)
            sampler = FleetSampler(owners=fleet.owner_labels(), worker_pids=fleet.worker_pids())
            data = run_load(client, make_plan(opts, fleet.model, warmup=0), sampler=sampler)
            tallies = check_jobs(client, data.batch_id)
            queue_left = queue_length(client.redis, queue_name(settings))
            unacked_left = client.redis.hlen("unacked")
        report = build_report(data, {"local": True, "redis_url": fleet.redis_url, "workers": args.workers})

    print(
        f"{args.jobs} jobs, {args.workers} workers x {args.sandboxes} slots, model latency {args.latency:g} s"
    )
    print(f"throughput {report['throughput_jobs_per_s']:.2f} jobs/s, wall {report['wall_s']:.1f} s")
    print(
        "jobs per worker: "
        + ", ".join(f"{w.split('@')[0]} {n}" for w, n in report["jobs_per_worker"].items())
    )
    for name, counter in tallies.items():
        print(f"{name:<13}" + ", ".join(f"{k}: {v}" for k, v in sorted(counter.items(), key=str)))
    print(f"broker queue left: {queue_left}, unacked left: {unacked_left}")
    ok = (
        tallies["records"]["jobs in the batch"] == args.jobs
        and tallies["guards"] == Counter({1: args.jobs})
        and tallies["done"] == Counter({1: args.jobs})
        and tallies["final_events"] == Counter({1: args.jobs})
        and sum(v for k, v in tallies["status"].items() if k in FINAL) == args.jobs
        and queue_left == 0
    )
    print(
        "every job: one final record, one done signal, one final audit event; none lost"
        if ok
        else "COUNTS DO NOT HOLD: see above"
    )
    rss = report["worker_rss_bytes"]
    if rss:
        print(f"worker RSS peak in all: {rss['peak_total'] / 1024**2:.0f} MiB")


if __name__ == "__main__":
    main()
