"""Benchmark: 100 jobs each waiting on a person's approval, on one local worker.

    flock /work/bench.lock .venv/bin/python benchmarks/approvals.py [--jobs 100] [--grace 1]

Every job's program sends one mail (``send_email``, gated by ``SANDFLEET_APPROVAL_TOOLS``), so every
job stops at the gate, waits the grace, and is suspended. Printed:

- containers held after the grace, once every job is suspended: the worker's live containers and
  how many of the suspended runs' own containers still exist (target 0; no warm pool, so every live
  container would belong to a run);
- jobs waiting at once against the worker's job slots (a held slot would cap waiting jobs at it);
- decision-to-running latency: approve the jobs one by one and time each from the decision (the
  request's ``decided_at``) to the job's ``running`` transition (``running_at``), both written by
  this host's clock. Side by side, in the same run: submit-to-running of fresh jobs on the same
  worker (the floor a resumed job cannot beat: a publish and a delivery). Target: p50 under 1 s.

Figures are printed, never asserted. The host may be shared: read the ratio, not the absolute.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from sandfleet.core.contracts import JobStatus
from sandfleet.fleet.local import FleetConfig, LocalFleet

PROGRAM = (
    "from sandfleet_tools import *\n"
    'message = send_email("ana@example.com", "Q3 revenue", body="North America leads.")\n'
    'print("RESULT:", message)\n'
)
TARGET_P50_S = 1.0
SUSPEND_TIMEOUT_S = 600.0
RESULT_TIMEOUT_S = 600.0
BASELINE_JOBS = 20
APPROVE_SPACING_S = 0.05  # between decisions: each is timed on its own, not queued behind the others


def quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def live_containers(owner: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=sandfleet.owner={owner}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def existing(container_ids: list[str]) -> int:
    if not container_ids:
        return 0
    out = subprocess.run(["docker", "ps", "-aq", "--no-trunc"], capture_output=True, text=True, check=True)
    alive = set(out.stdout.split())
    return sum(cid in alive for cid in container_ids)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--grace", type=float, default=1.0, help="SANDFLEET_APPROVAL_GRACE_S (seconds)")
    parser.add_argument("--concurrency", type=int, default=16, help="the worker's job slots")
    parser.add_argument("--sandboxes", type=int, default=4)
    args = parser.parse_args()

    config = FleetConfig(
        workers=1,
        concurrency=args.concurrency,
        sandboxes=args.sandboxes,
        tools="sandfleet.worker.tools.examples.side",
        program=PROGRAM,
        env={
            "SANDFLEET_APPROVAL_TOOLS": "send_email",
            "SANDFLEET_APPROVAL_GRACE_S": str(args.grace),
            "SANDFLEET_POOL_SIZE": "0",
            "SANDFLEET_POOL_FOLLOWS_DEMAND": "false",
        },
    )
    with LocalFleet(config) as fleet, fleet.client() as client:
        owner = fleet.workers[0].owner_label
        began = time.monotonic()
        batch = client.submit_batch(
            [
                {"question": f"mail {i}", "tools": ["send_email"], "model": fleet.model}
                for i in range(args.jobs)
            ]
        )
        peak_waiting = 0
        while True:
            counts = batch.progress().counts
            peak_waiting = max(peak_waiting, counts.get("awaiting_approval", 0))
            if counts.get("awaiting_approval", 0) == args.jobs:
                break
            if time.monotonic() - began > SUSPEND_TIMEOUT_S or batch.progress().finished:
                raise SystemExit(f"not every job was suspended: {counts}")
            time.sleep(0.2)
        suspended_s = time.monotonic() - began
        time.sleep(2.0)  # background removals finish
        held = live_containers(owner)
        runs = [
            e.data["container_id"]
            for job in batch.jobs()
            for e in job.audit()
            if e.kind == "sandbox_run" and e.data.get("container_id")
        ]
        still = existing(runs)

        requests = {r.job_id: r for r in client.approvals(limit=args.jobs * 2)}
        latencies = []
        for job in batch.jobs():
            decided = client.approve(requests[job.job_id].id, by="benchmark")
            while True:
                record = job.record()
                running_at = record.timestamps.get("running", 0.0)
                if record.status != JobStatus.AWAITING_APPROVAL and running_at > (decided.decided_at or 0):
                    latencies.append(running_at - (decided.decided_at or 0))
                    break
                if record.status.is_final:
                    break
                time.sleep(0.005)
            time.sleep(APPROVE_SPACING_S)
        results = batch.wait(timeout=RESULT_TIMEOUT_S)

        baseline = []
        for i in range(BASELINE_JOBS):
            handle = client.submit(f"plain {i}", model=fleet.model)  # no gated tool: runs straight away
            while True:
                record = handle.record()
                if "running" in record.timestamps:
                    baseline.append(record.timestamps["running"] - record.timestamps["queued"])
                    break
                time.sleep(0.005)
            handle.result(timeout=RESULT_TIMEOUT_S)
            time.sleep(APPROVE_SPACING_S)
        mails = len((fleet.data_dir / "outbox.jsonl").read_text().splitlines())

    ok = sum(r.status == JobStatus.SUCCEEDED for r in results)
    print(
        f"{args.jobs} jobs, each waiting on an approval; 1 worker, {args.concurrency} job slots, "
        f"{args.sandboxes} sandboxes, grace {args.grace:g} s (shared host)"
    )
    print(f"  every job suspended after        {suspended_s:8.1f} s")
    print(
        f"  jobs waiting at once             {peak_waiting:8d}   ({peak_waiting / args.concurrency:.1f}x the job slots)"
    )
    print(f"  containers held after the grace  {len(held):8d}   (worker's live containers; target 0)")
    print(f"  suspended runs' containers left  {still:8d}   (of {len(runs)} runs)")
    p50, p95 = statistics.median(latencies), quantile(latencies, 0.95)
    b50, b95 = statistics.median(baseline), quantile(baseline, 0.95)
    print(
        f"  decision -> running (n={len(latencies)})   p50 {p50 * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms   "
        f"max {max(latencies) * 1000:7.1f} ms"
    )
    print(
        f"  submit -> running, fresh jobs (n={len(baseline)}) p50 {b50 * 1000:7.1f} ms   p95 {b95 * 1000:7.1f} ms"
    )
    print(f"  ratio decision/submit at p50     {p50 / b50:8.2f}")
    print(f"  jobs succeeded {ok}/{len(results)}; mails sent {mails} (one per approval)")
    verdict = "meets" if p50 < TARGET_P50_S else "misses"
    print(f"decision-to-running p50 {p50 * 1000:.0f} ms: {verdict} the {TARGET_P50_S * 1000:.0f} ms target")


if __name__ == "__main__":
    main()
