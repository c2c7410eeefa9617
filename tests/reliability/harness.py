"""Fault-test helpers over the one local-fleet helper (:class:`sandfleet.fleet.local.LocalFleet`):
real ``sandfleet worker`` processes on the test's Redis, each its own process group, so kill -9
reaches exactly that worker; everything started is stopped by ``LocalFleet.stop``.

Used by tests/reliability and benchmarks/kill_workers.py.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

# wait_for here is sandfleet_testing.wait_until (True or False), not sandfleet_testing.wait_for (which fails)
from sandfleet_testing import wait_until as wait_for

from sandfleet.fleet.local import FleetConfig, LocalFleet
from sandfleet.producer.client import Client


def sleeper_script(folder: Path, seconds: float) -> Path:
    """A replay-model script: every question gets a program that sleeps, then proves it ran sandboxed.
    ``folder``: where the workers accept scripts from (``LocalFleet.scripts_dir``)."""
    folder.mkdir(parents=True, exist_ok=True)
    source = (
        "import os, socket, time\n"
        f"time.sleep({seconds})\n"
        "print('RESULT: ' + f'{os.getuid()}@{socket.gethostname()}')\n"
    )
    path = folder / f"sleep-{seconds:g}.json"
    path.write_text(json.dumps({"rules": [], "default": [f"```python\n{source}```\n"] * 3}))
    return path


def reliability_fleet(redis_url: str, folder: Path, **env: str) -> LocalFleet:
    """Workers (started one by one by the test) on the test's Redis, under a fresh key prefix."""
    config = FleetConfig(
        workers=0,
        concurrency=4,
        sandboxes=2,
        tools="",
        loglevel="info",
        env={"SANDFLEET_POOL_SIZE": "0", **env},
    )
    prefix = f"rel{uuid.uuid4().hex[:8]}"
    return LocalFleet(config, folder, redis_url=redis_url, key_prefix=prefix)


def final_state_events(client: Client, job_id: str) -> int:
    """How many final ``state`` events the job's audit holds (exactly one when nothing ran twice to the end)."""
    finals = {"succeeded", "failed", "timed_out", "refused", "cancelled"}
    return sum(1 for e in client.get(job_id).audit() if e.kind == "state" and e.data.get("status") in finals)


def containers_of(pid: int) -> list[str]:
    """Ids of Sandfleet containers owned by process ``pid`` on this host (by their owner label)."""
    import docker

    client = docker.from_env()
    try:
        found = client.api.containers(all=True, filters={"label": "sandfleet.owner"})
        host = os.uname().nodename
        return [
            c["Id"]
            for c in found
            if (c.get("Labels") or {}).get("sandfleet.owner", "").startswith(f"{host}:{pid}:")
        ]
    finally:
        client.close()


def running_on(client: Client, job_id: str) -> str | None:
    """The worker name the job's record says it runs on, while it runs."""
    record: Any = client.get(job_id).record()
    if record.status.value != "running":
        return None
    return getattr(record, "worker", None) or None


def kill_round(fleet: LocalFleet, client: Client, model: str, *, limit_s: float = 60.0) -> dict[str, Any]:
    """Submit one sleeping job, kill -9 the worker running it, and measure what follows.

    Returns a dict: job_id, lost (no final success within ``limit_s`` + the job's own time),
    redelivered_s (kill -> running on another worker), reaped_s (kill -> the dead worker's containers
    gone), final_records, deliveries, result. A replacement worker is started right after the kill.
    """
    job = client.submit("Sleep, then answer.", model=model)
    if not wait_for(lambda: running_on(client, job.job_id) is not None, 60):
        raise RuntimeError(f"job {job.job_id} never started")
    victim = fleet.by_name(running_on(client, job.job_id) or "")
    assert victim is not None
    wait_for(lambda: containers_of(victim.process.pid), 20)
    killed_at = time.monotonic()
    fleet.kill(victim)
    victim.process.wait()
    fleet.start_worker(wait=False)  # keep two live workers for the next round
    out: dict[str, Any] = {"job_id": job.job_id, "victim": victim.name}
    redelivered = wait_for(
        lambda: (
            (running_on(client, job.job_id) or victim.name) != victim.name
            or client.get(job.job_id).status().is_final
        ),
        limit_s,
        0.05,
    )
    out["redelivered_s"] = time.monotonic() - killed_at if redelivered else None
    try:
        result = job.result(timeout=limit_s + 30)
        out["lost"] = result.status.value != "succeeded"
        out["result"] = result.result
        out["status"] = result.status.value
    except TimeoutError:
        out["lost"], out["status"] = True, "no final record"
    out["final_records"] = final_state_events(client, job.job_id)
    out["deliveries"] = job.record().deliveries
    reaped = wait_for(lambda: not containers_of(victim.process.pid), limit_s, 0.5)
    out["reaped_s"] = time.monotonic() - killed_at if reaped else None
    return out


def note_figure(name: str, value: Any) -> None:
    """Merge one measured figure into artifacts/reliability-results.json (for SECURITY.md)."""
    path = Path(__file__).resolve().parents[2] / "artifacts" / "reliability-results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[name] = value
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def outcome_of(client: Client, job_id: str, timeout_s: float) -> str:
    """The job's final status, or "lost" when its record is gone or it never ends in time."""
    from sandfleet.core.errors import JobNotFoundError

    try:
        return client.get(job_id).result(timeout=timeout_s).status.value
    except JobNotFoundError:
        return "lost (record gone)"
    except TimeoutError:
        record = client.get(job_id).record()
        return f"lost (still {record.status.value}, deliveries {record.deliveries})"
