"""A small fleet for fault tests: real ``sandfleet worker`` processes on a Redis of our own.

Used by tests/reliability and benchmarks/kill_workers.py. Each worker is its own process group, so
kill -9 reaches exactly that worker; everything started here is stopped by ``Fleet.close``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandfleet.core.settings import Settings
from sandfleet.producer.client import Client

SANDFLEET = str(Path(sys.executable).with_name("sandfleet"))
WORKER_START_TIMEOUT_S = 60.0


def sleeper_script(folder: Path, seconds: float) -> Path:
    """A replay-model script: every question gets a program that sleeps, then proves it ran sandboxed."""
    source = (
        "import os, socket, time\n"
        f"time.sleep({seconds})\n"
        "print('RESULT: ' + f'{os.getuid()}@{socket.gethostname()}')\n"
    )
    path = folder / f"sleep-{seconds:g}.json"
    path.write_text(json.dumps({"rules": [], "default": [f"```python\n{source}```\n"] * 3}))
    return path


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class Fleet:
    redis_url: str
    folder: Path
    env: dict[str, str] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)
    prefix: str = field(default_factory=lambda: f"rel{uuid.uuid4().hex[:8]}")

    @property
    def settings(self) -> Settings:
        return Settings(redis_url=self.redis_url, key_prefix=self.prefix)

    def client(self) -> Client:
        return Client(settings=self.settings)

    def start_worker(self, *, concurrency: int = 4, sandboxes: int = 2, wait: bool = True) -> Worker:
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"rel-{uuid.uuid4().hex[:6]}@{os.uname().nodename}"
        env = {
            **os.environ,
            "SANDFLEET_REDIS_URL": self.redis_url,
            "SANDFLEET_KEY_PREFIX": self.prefix,
            "SANDFLEET_WORKER_STATE_DIR": str(self.folder / "worker-state"),
            "SANDFLEET_POOL_SIZE": "0",
            "SANDFLEET_TOOLS": "",
            **self.env,
        }
        log_path = self.folder / f"{name.split('@')[0]}.log"
        with log_path.open("wb") as log:
            cmd = [
                SANDFLEET,
                "worker",
                "--concurrency",
                str(concurrency),
                "--sandboxes",
                str(sandboxes),
                "--hostname",
                name,
                "--loglevel",
                "info",
            ]
            process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        worker = Worker(name, process, log_path)
        self.workers.append(worker)
        if wait:
            self.wait_ready(worker)
        return worker

    def wait_ready(self, worker: Worker) -> None:
        deadline = time.monotonic() + WORKER_START_TIMEOUT_S
        while "ready." not in worker.log():
            if not worker.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"worker {worker.name} did not start:\n{worker.log()[-3000:]}")
            time.sleep(0.1)

    def by_name(self, name: str) -> Worker | None:
        return next((w for w in self.workers if w.name == name), None)

    def kill(self, worker: Worker, sig: int = signal.SIGKILL) -> None:
        os.kill(worker.process.pid, sig)

    def close(self) -> None:
        for worker in self.workers:
            if worker.alive():
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.process.pid, signal.SIGKILL)
                worker.process.wait()


def final_state_events(client: Client, job_id: str) -> int:
    """How many final ``state`` events the job's audit holds (exactly one when nothing ran twice to the end)."""
    finals = {"succeeded", "failed", "timed_out", "refused"}
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


def wait_for(predicate: Any, timeout_s: float, every_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


def kill_round(fleet: Fleet, client: Client, model: str, *, limit_s: float = 60.0) -> dict[str, Any]:
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
