"""Cancel latency: from the cancel request to the running job's container gone, and to its final record.

    flock /work/bench.lock .venv/bin/python benchmarks/cancel.py --rounds 30

Starts its own redis-server and one real ``sandfleet worker`` (Docker sandboxes, replay model). Each
round submits a job whose program sleeps 60 s, waits until its container runs (then the worker's only
container), and times ``JobHandle.cancel()`` (the request: one Lua script and a pub/sub message; the
CLI adds its interpreter start) to: the container unknown to Docker (polled every 10 ms), and the
job's record final (``cancelled``). With ``--busy N`` another N jobs sleep in sandboxes meanwhile, so
the worker is not idle. Prints p50/p95 and writes artifacts/cancel.json. Target: p95 to container
gone under 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the harness imports sandfleet_testing, as the tests do

from benchmarks._common import fmt, summary_ms, wait_until  # noqa: E402
from sandfleet.fleet.local_redis import RedisServer  # noqa: E402
from tests.reliability.harness import reliability_fleet, sleeper_script  # noqa: E402

POLL_S = 0.01


def owned_containers(docker_client: object, pid: int) -> set[str]:
    """Ids of the Sandfleet containers owned by process ``pid`` (their owner label)."""
    prefix = f"{os.uname().nodename}:{pid}:"
    found = docker_client.api.containers(all=True, filters={"label": "sandfleet.owner"})  # type: ignore[attr-defined]
    return {c["Id"] for c in found if (c.get("Labels") or {}).get("sandfleet.owner", "").startswith(prefix)}


def gone(docker_client: object, container_id: str) -> bool:
    import docker.errors

    try:
        docker_client.containers.get(container_id)  # type: ignore[attr-defined]
    except docker.errors.NotFound:
        return True
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--busy", type=int, default=1, help="other jobs sleeping in sandboxes meanwhile")
    parser.add_argument("--out", type=Path, default=REPO / "artifacts" / "cancel.json")
    args = parser.parse_args()
    import docker

    docker_client = docker.from_env()
    to_gone: list[float] = []
    to_final: list[float] = []
    with tempfile.TemporaryDirectory(prefix="sf-cancel-") as tmp:
        folder = Path(tmp)
        server = RedisServer(folder / "redis").start()
        fleet = reliability_fleet(server.url, folder / "fleet")
        try:
            worker = fleet.start_worker(concurrency=args.busy + 1, sandboxes=args.busy + 1)
            pid = worker.process.pid
            model = f"replay:{sleeper_script(fleet.scripts_dir, 60)}"
            with fleet.client() as client:
                busy = [client.submit(f"Keep busy {i}", model=model) for i in range(args.busy)]
                if not wait_until(lambda: len(owned_containers(docker_client, pid)) >= args.busy, 120, 0.1):
                    raise RuntimeError("the busy jobs never got their sandboxes")
                for number in range(1, args.rounds + 1):
                    before = owned_containers(docker_client, pid)
                    job = client.submit(f"Sleep, then be cancelled ({number})", model=model)
                    if not wait_until(lambda b=before: owned_containers(docker_client, pid) - b, 120, 0.02):
                        raise RuntimeError(f"round {number}: the job's sandbox never started")
                    [container] = owned_containers(docker_client, pid) - before
                    began = time.monotonic()
                    job.cancel()
                    wait_until(lambda c=container: gone(docker_client, c), 30, POLL_S)
                    to_gone.append(time.monotonic() - began)
                    wait_until(lambda j=job: j.status().is_final, 30, POLL_S)
                    to_final.append(time.monotonic() - began)
                    status = job.status().value
                    print(
                        f"round {number:2d}: container gone {to_gone[-1] * 1000:7.1f} ms, "
                        f"final record ({status}) {to_final[-1] * 1000:7.1f} ms",
                        flush=True,
                    )
                for job in busy:
                    job.cancel()
                wait_until(lambda: all(j.status().is_final for j in busy), 30, 0.05)
        finally:
            fleet.stop()
            server.stop()
            docker_client.close()
    report = {
        "rounds": args.rounds,
        "busy_jobs": args.busy,
        "cancel_to_container_gone_ms": summary_ms(to_gone),
        "cancel_to_final_record_ms": summary_ms(to_final),
        "target": "p95 cancel -> container gone under 1000 ms",
    }
    print(f"cancel -> container gone:  {fmt(report['cancel_to_container_gone_ms'])}")
    print(f"cancel -> final record:    {fmt(report['cancel_to_final_record_ms'])}")
    p95 = report["cancel_to_container_gone_ms"]["p95"]
    print(f"target p95 < 1000 ms: {'met' if p95 < 1000 else 'NOT met'} ({p95:.0f} ms)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
