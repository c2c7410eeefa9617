"""Completion webhooks when the worker dies: from a worker killed after its job's seal to the POST
received (sent by another, live worker from the outbox), beside the normal seal-to-POST time.

    flock /work/bench.lock .venv/bin/python benchmarks/webhook_outbox.py --rounds 5

Starts its own redis-server and two real ``sandfleet worker`` processes (Docker sandboxes, replay
model). Each round:

- normal: a job whose webhook goes to a live HTTP receiver; seal (the record's ``succeeded_at``) to
  the POST received;
- killed: a job whose webhook goes to a port nothing listens on yet, so the worker's tries are
  refused; once its final record is written, the worker that wrote it is kill -9'd and the receiver
  comes up on that port; kill to the POST received (the other worker's sweep sends it once the dead
  one's heartbeat lapses), and seal to POST. A replacement worker is started after each kill.

The workers retry for minutes (20 retries), so the POST comes from the outbox because the worker
died, not because it gave up. Prints p50 and the spread; writes artifacts/webhook-outbox.json.
Target (issue 26): kill to POST under 30 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the harness imports sandfleet_testing, as the tests do

from sandfleet.fleet.local import LocalFleet  # noqa: E402
from sandfleet.fleet.local_redis import RedisServer, free_port  # noqa: E402
from sandfleet.producer.client import Client  # noqa: E402
from tests.outcomes.webhook_receiver import OutboxReceiver  # noqa: E402
from tests.reliability.harness import reliability_fleet, sleeper_script  # noqa: E402

TARGET_S = 30.0
ENV = {
    "SANDFLEET_WEBHOOK_SECRET": "benchmark-webhook-secret",
    "SANDFLEET_POLICY_WEBHOOK_HOSTS": "127.0.0.1",
    "SANDFLEET_WEBHOOK_RETRIES": "20",
    "SANDFLEET_WEBHOOK_BACKOFF_S": "1",
    "SANDFLEET_WEBHOOK_TIMEOUT_S": "2",
}


def first_post(receiver: OutboxReceiver, timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not receiver.posts:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no POST within {timeout_s:g} s")
        time.sleep(0.01)
    return receiver.posts[0]


def normal_round(client: Client, model: str) -> float:
    """Seal to POST received (s), with the receiver up all along."""
    receiver = OutboxReceiver()
    try:
        job = client.submit({"question": "answer", "model": model, "webhook": f"{receiver.url}/jobs"})
        job.result(timeout=120)
        post = first_post(receiver)
        return float(post["at"] - job.record().timestamps["succeeded"])
    finally:
        receiver.close()


def killed_round(fleet: LocalFleet, client: Client, model: str) -> dict[str, float]:
    """Kill the worker that sealed the job before its POST got through; kill (and seal) to POST (s)."""
    port = free_port()
    job = client.submit({"question": "answer", "model": model, "webhook": f"http://127.0.0.1:{port}/jobs"})
    job.result(timeout=120)
    record = job.record()
    victim = fleet.by_name(record.worker or "")
    if victim is None:
        raise RuntimeError(f"job {job.job_id} was finished by {record.worker!r}, not one of ours")
    fleet.kill(victim)
    killed_at = time.time()
    victim.process.wait()
    receiver = OutboxReceiver(port)
    try:
        post = first_post(receiver)
    finally:
        receiver.close()
    fleet.start_worker()  # two live workers for the next round
    return {
        "kill_to_post_s": post["at"] - killed_at,
        "seal_to_post_s": post["at"] - record.timestamps["succeeded"],
    }


def spread(values: list[float], unit: float, suffix: str) -> str:
    scaled = [v * unit for v in values]
    return (
        f"p50 {statistics.median(scaled):.1f} {suffix} "
        f"(min {min(scaled):.1f}, max {max(scaled):.1f}, n={len(scaled)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=REPO / "artifacts" / "webhook-outbox.json")
    args = parser.parse_args()
    normal: list[float] = []
    killed: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="sf-outbox-") as tmp:
        folder = Path(tmp)
        server = RedisServer(folder / "redis").start()
        fleet = reliability_fleet(server.url, folder / "fleet", **ENV)
        try:
            fleet.start_worker()
            fleet.start_worker()
            model = f"replay:{sleeper_script(fleet.scripts_dir, 0)}"
            with fleet.client() as client:
                for i in range(args.rounds):
                    normal.append(normal_round(client, model))
                    killed.append(killed_round(fleet, client, model))
                    print(
                        f"round {i + 1}: normal seal -> POST {normal[-1] * 1000:.0f} ms; killed: "
                        f"kill -> POST {killed[-1]['kill_to_post_s']:.1f} s, "
                        f"seal -> POST {killed[-1]['seal_to_post_s']:.1f} s",
                        flush=True,
                    )
        finally:
            fleet.stop()
            server.stop()
    kill_to_post = [r["kill_to_post_s"] for r in killed]
    print(f"seal -> POST received, normal:         {spread(normal, 1000, 'ms')}")
    print(f"seal -> POST received, worker killed:  {spread([r['seal_to_post_s'] for r in killed], 1, 's')}")
    print(f"kill -> POST received (outbox):        {spread(kill_to_post, 1, 's')}")
    within = statistics.median(kill_to_post) < TARGET_S
    print(f"target kill -> POST under {TARGET_S:g} s (p50): {'met' if within else 'MISSED'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"normal_seal_to_post_s": normal, "killed": killed}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
