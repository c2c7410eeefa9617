"""Flower, started by ``sandfleet flower``, seen in a real headless browser (Debian's chromium).

A real Redis, a real ``sandfleet worker`` process (orders tools, replay model over HTTP, Docker
sandboxes) and ``sandfleet flower`` on a free localhost port, with basic auth. One reference job runs
through the fleet; then chromium loads the tasks page (filled by JavaScript from /tasks/datatable),
and the test reads the DOM it rendered and keeps a screenshot in artifacts/flower-tasks.png.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandfleet_testing.flower import AUTH, Fleet, get, running_fleet

from sandfleet.core.contracts import JobStatus
from sandfleet.fleet.demo import demo_replay_script
from sandfleet.producer.client import Client
from sandfleet.worker.tools.examples.scenario import (
    REFERENCE_ANSWER,
    REFERENCE_QUESTION,
    write_reference_data,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

IN_CI = bool(os.environ.get("CI"))
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
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
