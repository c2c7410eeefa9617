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
- signed vs unsigned decisions, side by side on the same worker: the jobs are approved alternately
  with an approver key (signed, checked against the worker's approvers file before the call runs)
  and unsigned (the worker allows both here, ``SANDFLEET_APPROVAL_ALLOW_UNSIGNED``); for each, the
  approver's side (``client.approve``: reading the request and signing), decision -> running, and
  decision -> the approved call's ``executed`` event (the worker's check of the signature included).

- shell and chat jobs (``--loop-jobs`` of each): the model's tool loop asks for ``send_email`` (a shell
  job writes a file to /workspace first); after the grace each job is suspended, a shell job's
  /workspace saved to the artifact store and its session destroyed. Printed per mode: containers held
  while every job waits (target 0), decision -> running p50, and for shell decision -> the session
  restored in a fresh sandbox (the ``restored`` session event: the session start and the workspace
  restore included; target under 1 s).

Figures are printed, never asserted. The host may be shared: read the ratio, not the absolute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet.core.approvers import ApproversFile, make_approver_key, public_half_path, read_public_key
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
    parser.add_argument("--loop-jobs", type=int, default=10, help="shell jobs and chat jobs (each) that wait")
    parser.add_argument(
        "--baseline-jobs", type=int, default=20, help="fresh jobs timed submit -> running, one at a time"
    )
    args = parser.parse_args()

    keys = Path(tempfile.mkdtemp(prefix="sandfleet-bench-approvers-"))
    approver = make_approver_key(keys / "ana.pem")
    approvers = ApproversFile(keys / "approvers.json")
    approvers.add("ana", *read_public_key(public_half_path(keys / "ana.pem")))
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
            "SANDFLEET_APPROVERS_FILE": str(approvers.path),
            "SANDFLEET_APPROVAL_ALLOW_UNSIGNED": "true",  # both kinds, side by side on one worker
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
        figures: dict[bool, Figures] = {True: Figures(), False: Figures()}
        for i, job in enumerate(batch.jobs()):
            signed = i % 2 == 1
            began_approve = time.perf_counter()
            decided = client.approve(
                requests[job.job_id].id, by="benchmark", key=approver if signed else None, unsigned=not signed
            )
            figures[signed].approve.append(time.perf_counter() - began_approve)
            running = wait_running(job, decided.decided_at or 0.0)
            if running is not None:
                figures[signed].running.append(running)
            time.sleep(APPROVE_SPACING_S)
        results = batch.wait(timeout=RESULT_TIMEOUT_S)
        for i, job in enumerate(batch.jobs()):
            executed = executed_after(job, requests[job.job_id].id)
            if executed is not None:
                figures[i % 2 == 1].executed.append(executed)
        latencies = figures[True].running + figures[False].running

        baseline = []
        for i in range(args.baseline_jobs):
            handle = client.submit(f"plain {i}", model=fleet.model)  # no gated tool: runs straight away
            while True:
                record = handle.record()
                if "running" in record.timestamps:
                    baseline.append(record.timestamps["running"] - record.timestamps["queued"])
                    break
                time.sleep(0.005)
            handle.result(timeout=RESULT_TIMEOUT_S)
            time.sleep(APPROVE_SPACING_S)
        loops = {
            mode: loop_mode(fleet, client, owner, approver, mode, args.loop_jobs)
            for mode in ("shell", "chat")
        }
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
    for signed in (False, True):
        print(figures[signed].line("signed  " if signed else "unsigned"))
    on, off = figures[True], figures[False]
    print(
        f"  signed/unsigned at p50: decision -> running {ms(on.running, 0.5) / ms(off.running, 0.5):.2f}, "
        f"decision -> call ran {ms(on.executed, 0.5) / ms(off.executed, 0.5):.2f}"
    )
    print(f"  jobs succeeded {ok}/{len(results)}; mails sent {mails} (one per approval)")
    for mode, loop in loops.items():
        print(loop.line(mode))
    shell_p50 = ms(loops["shell"].restored, 0.5)
    print(
        f"loop modes: containers held while waiting shell {loops['shell'].held}, chat {loops['chat'].held} "
        f"(target 0); decision-to-running p50 shell {ms(loops['shell'].running, 0.5):.0f} ms "
        f"(to the session restored {shell_p50:.0f} ms: "
        f"{'meets' if shell_p50 < TARGET_P50_S * 1000 else 'misses'} the {TARGET_P50_S * 1000:.0f} ms target), "
        f"chat {ms(loops['chat'].running, 0.5):.0f} ms"
    )
    verdict = "meets" if p50 < TARGET_P50_S else "misses"
    print(f"decision-to-running p50 {p50 * 1000:.0f} ms: {verdict} the {TARGET_P50_S * 1000:.0f} ms target")
    print(
        f"decision-to-running p50 signed {ms(on.running, 0.5):.0f} ms, unsigned {ms(off.running, 0.5):.0f} ms"
    )


@dataclass
class Figures:
    """Seconds measured for one kind of decision."""

    approve: list[float] = field(default_factory=list)  # client.approve(): read, sign, the Lua step
    running: list[float] = field(default_factory=list)  # decided_at -> running_at
    executed: list[float] = field(default_factory=list)  # decided_at -> the `executed` event

    def line(self, name: str) -> str:
        return (
            f"  {name} (n={len(self.running)})  approve() p50 {ms(self.approve, 0.5):6.1f} ms   "
            f"decision -> running p50 {ms(self.running, 0.5):6.1f} ms p95 {ms(self.running, 0.95):6.1f} ms   "
            f"decision -> call ran p50 {ms(self.executed, 0.5):6.1f} ms p95 {ms(self.executed, 0.95):6.1f} ms"
        )


@dataclass
class LoopFigures:
    """One tool-loop mode's waiting jobs: containers held, seconds from decision to running (restored)."""

    jobs: int = 0
    held: int = 0
    succeeded: int = 0
    running: list[float] = field(default_factory=list)
    restored: list[float] = field(default_factory=list)  # shell: decided_at -> the `restored` event

    def line(self, mode: str) -> str:
        restored = (
            f"   decision -> session restored p50 {ms(self.restored, 0.5):6.1f} ms p95 {ms(self.restored, 0.95):6.1f} ms"
            if mode == "shell"
            else ""
        )
        return (
            f"  {mode:5s} jobs (n={self.jobs})  containers held while waiting {self.held}   "
            f"decision -> running p50 {ms(self.running, 0.5):6.1f} ms p95 {ms(self.running, 0.95):6.1f} ms"
            f"{restored}   succeeded {self.succeeded}/{self.jobs}"
        )


def loop_script(mode: str) -> dict[str, Any]:
    """The replay script of the tool-loop jobs: (shell) write a file, mail, answer."""
    mail = {
        "name": "send_email",
        "arguments": {"to": "ana@example.com", "subject": "Q3", "body": "NA leads."},
    }
    responses: list[Any] = [{"tool_calls": [mail]}, 'Sent.\nRESULT: "sent"']
    if mode == "shell":
        note = {
            "name": "sandbox_write_file",
            "arguments": {"path": "notes.txt", "content": "before the wait"},
        }
        responses.insert(0, {"tool_calls": [note]})
    return {"rules": [{"match": f"{mode} mail", "responses": responses}]}


def loop_mode(fleet: LocalFleet, client: Any, owner: str, approver: Any, mode: str, jobs: int) -> LoopFigures:
    """``jobs`` shell or chat jobs, each suspended at its gated call, then approved one by one."""
    figures = LoopFigures(jobs=jobs)
    if jobs <= 0:
        return figures
    script = fleet.scripts_dir / f"bench-{mode}.json"
    script.write_text(json.dumps(loop_script(mode)))
    handles = [
        client.submit(f"{mode} mail {i}", tools=["send_email"], mode=mode, model=f"replay:{script}")
        for i in range(jobs)
    ]
    began = time.monotonic()
    while not all(h.status() == JobStatus.AWAITING_APPROVAL for h in handles):
        if time.monotonic() - began > SUSPEND_TIMEOUT_S or any(h.status().is_final for h in handles):
            raise SystemExit(f"not every {mode} job was suspended: {[h.status().value for h in handles]}")
        time.sleep(0.2)
    time.sleep(2.0)  # background removals finish
    figures.held = len(live_containers(owner))
    requests = {r.job_id: r for r in client.approvals(limit=jobs * 4) if r.status == "pending"}
    for handle in handles:
        decided = client.approve(requests[handle.job_id].id, by="benchmark", key=approver)
        running = wait_running(handle, decided.decided_at or 0.0)
        if running is not None:
            figures.running.append(running)
        result = handle.result(timeout=RESULT_TIMEOUT_S)
        figures.succeeded += result.status == JobStatus.SUCCEEDED
        restored = next(
            (e.ts for e in handle.audit() if e.kind == "session" and e.data.get("event") == "restored"), None
        )
        if restored is not None and decided.decided_at:
            figures.restored.append(float(restored - decided.decided_at))
        time.sleep(APPROVE_SPACING_S)
    return figures


def ms(samples: list[float], q: float) -> float:
    return quantile(samples, q) * 1000 if samples else float("nan")


def wait_running(job: Any, decided_at: float) -> float | None:
    """Seconds from the decision to the job's next ``running`` transition (None if it ended first)."""
    while True:
        record = job.record()
        running_at = record.timestamps.get("running", 0.0)
        if record.status != JobStatus.AWAITING_APPROVAL and running_at > decided_at:
            return float(running_at - decided_at)
        if record.status.is_final:
            return None
        time.sleep(0.005)


def executed_after(job: Any, request_id: str) -> float | None:
    """Seconds from the decision to the worker's ``executed`` event of the approved call (its chain)."""
    events = job.audit()
    decided = next(
        (e.data.get("at") for e in events if e.kind == "approval" and e.data.get("event") == "approved"), None
    )
    ran = next((e.ts for e in events if e.kind == "approval" and e.data.get("event") == "executed"), None)
    if decided is None or ran is None:
        return None
    return float(ran - decided)


if __name__ == "__main__":
    main()
