"""Flower, started by ``sandfleet flower``, seen in a real headless browser (Debian's chromium).

A real Redis, a real ``sandfleet worker`` process (orders tools, replay model over HTTP, Docker
sandboxes) and ``sandfleet flower`` on a free localhost port, with basic auth. One reference job runs
through the fleet; then chromium loads the tasks page (filled by JavaScript from /tasks/datatable),
and the test reads the DOM it rendered and keeps a screenshot in artifacts/flower-tasks.png.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from sandfleet.core.contracts import JobStatus
from sandfleet.core.settings import Settings
from sandfleet.fleet.demo import demo_replay_script
from sandfleet.fleet.local_redis import free_port
from sandfleet.producer.client import Client
from sandfleet.worker.tools.examples.scenario import (
    REFERENCE_ANSWER,
    REFERENCE_QUESTION,
    write_reference_data,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

IN_CI = bool(os.environ.get("CI"))
SANDFLEET = str(Path(sys.executable).with_name("sandfleet"))
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
AUTH = ("watcher", "flower-test-pw")
START_TIMEOUT_S = 60.0
JOB_TIMEOUT_S = 120.0
BROWSER_TIMEOUT_S = 90.0
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,900",
    "--virtual-time-budget=5000",  # let the page's JavaScript fetch and draw the table first
]


@pytest.fixture
def chromium(skip_or_fail) -> str:  # type: ignore[no-untyped-def]
    """The chromium binary; installed from apt when missing and running as root (CI starts fresh)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
            subprocess.run(cmd, env=env, capture_output=True, timeout=900, check=False)
        found = shutil.which("chromium")
    if found is None:
        skip_or_fail("chromium is not installed (apt-get install chromium)")
    return found


@dataclass
class Fleet:
    settings: Settings
    flower_url: str
    folder: Path
    processes: dict[str, subprocess.Popen[bytes]]

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")[-3000:]


def wait_until(fleet: Fleet, name: str, ready, timeout_s: float = START_TIMEOUT_S) -> None:  # type: ignore[no-untyped-def]
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
        wait_until(fleet, "flower", lambda: get(fleet.flower_url + "/healthcheck")[0] == 200)
        wait_until(fleet, "worker", lambda: "ready." in fleet.log("worker"))
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


@pytest.fixture
def fleet(redis_server: str, docker_engine, tmp_path: Path) -> Iterator[Fleet]:  # type: ignore[no-untyped-def]
    """Flower and a worker with the orders tools."""
    script = tmp_path / "replay.json"
    script.write_text(json.dumps(demo_replay_script()))
    write_reference_data(tmp_path / "data")
    env = {
        "SANDFLEET_TOOLS": "sandfleet.worker.tools.examples.orders",
        "SANDFLEET_DATA_DIR": str(tmp_path / "data"),
        "SANDFLEET_MODEL": f"replay:{script}",
    }
    with running_fleet(redis_server, "tf", tmp_path, env, concurrency=2, sandboxes=1) as made:
        yield made


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=BROWSER_TIMEOUT_S,
        check=False,
    )


def test_tasks_page_lists_the_finished_job(chromium: str, fleet: Fleet, tmp_path: Path) -> None:
    with Client(settings=fleet.settings) as client:
        job = client.submit(REFERENCE_QUESTION, tools=["load_orders"])
        result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == REFERENCE_ANSWER

    # Flower asks for the password even on localhost when one is set.
    assert get(fleet.flower_url + "/tasks")[0] == 401
    # Its API sees the task finish (events arrive a moment after the record is written).
    deadline = time.monotonic() + 20
    while True:
        status, body = get(f"{fleet.flower_url}/api/tasks", AUTH)
        task = json.loads(body or b"{}").get(job.job_id, {})
        if task.get("state") == "SUCCESS" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert status == 200 and task.get("name") == "sandfleet.run_job" and task.get("state") == "SUCCESS", task
    assert task["uuid"] == job.job_id and "revenue per region in Q3 2026" in task["args"]
    assert task["args"].startswith("['code-action', ")  # the job's mode comes first

    page = fleet.flower_url.replace("http://", f"http://{AUTH[0]}:{AUTH[1]}@") + "/tasks"
    dom = run_chromium(chromium, tmp_path / "profile-dom", "--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "sandfleet.run_job" in html, html[-3000:]
    assert job.job_id in html  # the uuid column is the job id
    assert "revenue per region in Q3 2026" in html  # the args column: the mode, then the question
    assert "code-action" in html
    assert "SUCCESS" in html

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "flower-tasks.png"
    shot.unlink(missing_ok=True)
    done = run_chromium(chromium, tmp_path / "profile-shot", f"--screenshot={shot}", page)
    assert done.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, done.stderr[-2000:]
    if IN_CI:
        print(f"screenshot: {shot}")
