"""A local Flower fleet for the browser tests: ``sandfleet flower`` and ``sandfleet worker`` processes
with basic auth (tests/flower/: the tasks page and the failed-jobs filter)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from sandfleet.core.settings import Settings
from sandfleet.fleet.local_redis import free_port

from .workers import SANDFLEET

AUTH = ("watcher", "flower-test-pw")
START_TIMEOUT_S = 60.0


@dataclass
class Fleet:
    settings: Settings
    flower_url: str
    folder: Path
    processes: dict[str, subprocess.Popen[bytes]]

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")[-3000:]


def wait_started(
    fleet: Fleet, name: str, ready: Callable[[], bool], timeout_s: float = START_TIMEOUT_S
) -> None:
    """Until ``ready()``; fails naming the process (with its log) that exited or never got ready."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if fleet.processes[name].poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{name} did not start:\n{fleet.log(name)}")
        time.sleep(0.1)


def get(url: str, auth: tuple[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url)
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except OSError:
        return 0, b""


def lists_a_worker(flower_url: str, auth: tuple[str, str] = AUTH) -> bool:
    """Flower's worker list (built from the events it received) names a live worker."""
    status, body = get(flower_url + "/workers?json=1", auth)
    return status == 200 and any(w.get("status") for w in json.loads(body or b"{}").get("data", []))


@contextlib.contextmanager
def running_fleet(
    redis_url: str, prefix: str, tmp_path: Path, env: dict[str, str], *, concurrency: int, sandboxes: int
) -> Iterator[Fleet]:
    """``sandfleet flower`` first (it shows only tasks whose events it saw), then ``sandfleet worker``,
    both with ``env`` over the fleet's own settings; stopped, and the fleet's keys deleted, afterwards."""
    settings = Settings(redis_url=redis_url, key_prefix=f"{prefix}{uuid.uuid4().hex[:8]}")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SANDFLEET_", "FLOWER_", "OPENAI_"))},
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
        "SANDFLEET_WORKER_STATE_DIR": str(tmp_path / "worker-state"),
        "SANDFLEET_POOL_SIZE": "0",
        "SANDFLEET_FLOWER_AUTH": f"{AUTH[0]}:{AUTH[1]}",
        **env,
    }
    name = f"{prefix}-{uuid.uuid4().hex[:6]}@%h"
    commands = {
        "flower": [SANDFLEET, "flower", "--port", str(port), "--address", "127.0.0.1"],
        "worker": [SANDFLEET, "worker", "-c", str(concurrency), "-s", str(sandboxes), "-n", name],
    }
    fleet = Fleet(settings, f"http://127.0.0.1:{port}", tmp_path, {})
    try:
        for role, cmd in commands.items():
            with (tmp_path / f"{role}.log").open("wb") as log:
                fleet.processes[role] = subprocess.Popen(
                    cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
        wait_started(fleet, "flower", lambda: get(fleet.flower_url + "/healthcheck")[0] == 200)
        wait_started(fleet, "worker", lambda: "ready." in fleet.log("worker"))
        # Flower names a task only from the task-received event it heard: it must listen before a job
        # is submitted, and a worker it lists (from the worker's heartbeat events) shows that it does.
        wait_started(fleet, "flower", lambda: lists_a_worker(fleet.flower_url))
        yield fleet
    finally:
        for process in fleet.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in fleet.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        r = redis.Redis.from_url(redis_url)
        if keys := list(r.scan_iter(match=f"{settings.key_prefix}*")):
            r.delete(*keys)
        r.close()
