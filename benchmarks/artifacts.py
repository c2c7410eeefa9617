"""Artifact round trip: a job writes a 10 MiB file to /workspace/out/, the client holds its bytes; for a
code-action job (its program writes it) and a shell job (its command does, in its session sandbox).

    flock /work/bench.lock .venv/bin/python benchmarks/artifacts.py [--pairs 20] [--mib 10] [--modes code-action,shell]

One local fleet (its own Redis, one worker, warm pool, zero model latency). Per mode, jobs go one at a
time, in pairs, alternating which goes first:
  - WITH: the job writes MIB MiB of random bytes to /workspace/out/data.bin (an artifact);
  - WITHOUT: the same job writes the same bytes to /workspace/scratch.bin (not an artifact).
Both then answer with the size (code-action: the program's RESULT; shell: the scripted model, after
``sandbox_write_file`` of the writer and ``sandbox_exec`` of it). For each job: submit -> verified
result (the client's view); for WITH also the fetch of the artifact's bytes by the client
(``JobHandle.artifact``: read from Redis, SHA-256 checked against the verified record).

The artifact round trip of a pair is (WITH's submit-to-result + its fetch) - WITHOUT's
submit-to-result: everything the artifact adds, from the sandbox's agent reading the file to the
client holding the checked bytes (collection over the agent's channel, hashing, the Redis write,
the audit event, the fetch). The worker's own share (collection: the agent reads the file and sends
it, the host checks and hashes it) is ``artifacts_s`` (code-action: the attempt's timings; shell: the
job's). Both modes share that collection, so their round trips should agree; a shell job itself is
slower (a session sandbox started per job, three model turns). Target (issue 13): under 200 ms on
this host. Printed, not asserted; the host may be shared, so compare the figures of one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fmt, summary_ms

from sandfleet.core.settings import Settings
from sandfleet.fleet.local import FleetConfig, LocalFleet
from sandfleet.producer.client import Client

TARGET_S = 0.200
RESULT_TIMEOUT_S = 120.0
WRITE = """import os
data = os.urandom({size})
with open("{path}", "wb") as f:
    f.write(data)
print("RESULT: " + str(len(data)))
"""


MODES = ("code-action", "shell")
WITH, WITHOUT = "with an artifact", "without"
LABELS = {
    "without": "job, file not an artifact (submit -> result)",
    "with": "job, file as an artifact (submit -> result)",
    "fetch": "client fetch of the artifact (read + SHA-256)",
    "collect": "worker: collection (agent -> host, checked, hashed)",
    "round_trip": "artifact round trip (with + fetch - without)",
}


def shell_rule(question: str, program: str, size: int) -> dict[str, object]:
    """A shell job's script: the writer into the session sandbox, run, then the size as the answer."""

    def call(name: str, **arguments: object) -> dict[str, object]:
        return {"tool_calls": [{"name": name, "arguments": arguments}]}

    return {
        "match": question,
        "system": "Linux sandbox of your own",  # the shell prompt: a code-action job goes on to the next rules
        "responses": [
            call("sandbox_write_file", path="write.py", content=program),
            call("sandbox_exec", command="python3 write.py", timeout=60),
            f"RESULT: {size}",
        ],
    }


def fleet_config(size: int) -> FleetConfig:
    with_file = WRITE.format(size=size, path="/workspace/out/data.bin")
    without = WRITE.format(size=size, path="/workspace/scratch.bin")
    return FleetConfig(
        workers=1,
        concurrency=4,
        sandboxes=2,
        tools="",
        program=without,
        replay_rules=[
            shell_rule(WITH, with_file, size),
            shell_rule(WITHOUT, without, size),
            {"match": "artifact", "responses": [f"```python\n{with_file}```"]},
        ],
        env={"SANDFLEET_POOL_SIZE": "1"},
    )


def one(
    client: Client, model: str, mode: str, question: str, size: int, pause: float
) -> tuple[float, float, float]:
    """One job: submit -> verified result, the fetch of its artifact (if any), the worker's collection."""
    began = time.perf_counter()
    job = client.submit(question, model=model, mode=mode)
    result = job.result(timeout=RESULT_TIMEOUT_S)
    seen = time.perf_counter() - began
    if result.status.value != "succeeded" or result.result != size:
        raise SystemExit(f"{mode} job {job.job_id} {result.status.value}: {result.error}")
    fetch = collect = 0.0
    if result.artifacts:
        began = time.perf_counter()
        data = job.artifact("data.bin")
        fetch = time.perf_counter() - began
        assert len(data) == size
        timings = result.timings if mode == "shell" else result.attempts[-1].timings
        collect = timings["artifacts_s"]
    elif question == WITH:
        raise SystemExit(f"{mode} job {job.job_id} handed back no artifact")
    time.sleep(pause)
    return seen, fetch, collect


def pairs(
    client: Client, model: str, mode: str, size: int, args: argparse.Namespace
) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {k: [] for k in LABELS}
    for index in range(args.warmup_pairs + args.pairs):
        order = (WITH, WITHOUT) if index % 2 == 0 else (WITHOUT, WITH)
        outcome = {question: one(client, model, mode, question, size, args.pause) for question in order}
        if index < args.warmup_pairs:
            continue
        with_s, fetch_s, collect_s = outcome[WITH]
        without_s = outcome[WITHOUT][0]
        samples["with"].append(with_s)
        samples["without"].append(without_s)
        samples["fetch"].append(fetch_s)
        samples["collect"].append(collect_s)
        samples["round_trip"].append(with_s + fetch_s - without_s)
    return samples


def report(mode: str, samples: dict[str, list[float]]) -> None:
    print(f"\n[{mode}]")
    for name, label in LABELS.items():
        print(f"{label:<52} {fmt(summary_ms(samples[name]))}")
    ratio = statistics.median(samples["with"]) / statistics.median(samples["without"])
    trips = sorted(samples["round_trip"])
    p50 = statistics.median(trips)
    print(f"job with / without the artifact, median: {ratio:.2f}x")
    verdict = "meets" if p50 < TARGET_S else "misses"
    # A difference of two noisy jobs: its spread says how far the median can be trusted (it can even
    # come out negative on a busy host with few pairs).
    print(
        f"{mode} artifact round trip p50: {p50 * 1000:.0f} ms, spread over pairs {trips[0] * 1000:.0f}.."
        f"{trips[-1] * 1000:.0f} ms ({verdict} the {TARGET_S * 1000:.0f} ms target)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--mib", type=int, default=10)
    parser.add_argument("--warmup-pairs", type=int, default=2, help="pairs run first and not counted")
    parser.add_argument("--pause", type=float, default=0.3, help="seconds between jobs (the pool refills)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: code-action, shell")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes {' and '.join(MODES)}, got {args.modes!r}")
    size = args.mib * 1024**2
    with (
        LocalFleet(fleet_config(size)) as fleet,
        Client(fleet.redis_url, settings=Settings(redis_url=fleet.redis_url)) as client,
    ):
        results = {mode: pairs(client, fleet.model, mode, size, args) for mode in modes}
    print(
        f"{args.pairs} pairs of jobs per mode, {args.mib} MiB written by each job "
        "(1 worker, warm pool, shared host)"
    )
    for mode, samples in results.items():
        report(mode, samples)
    if len(results) == 2:
        code, shell = (statistics.median(results[m]["round_trip"]) for m in MODES)
        collect = (statistics.median(results[m]["collect"]) for m in MODES)
        print(
            f"\nround trip p50, code-action | shell: {code * 1000:.0f} | {shell * 1000:.0f} ms; "
            "collection p50: {:.1f} | {:.1f} ms".format(*(c * 1000 for c in collect))
        )


if __name__ == "__main__":
    main()
