"""Flower tells the truth about jobs: in a real browser (Debian's chromium driven by selenium through
Debian's chromium-driver), after a batch in which some jobs fail, Flower's "Failed" filter lists
exactly the jobs that did not succeed, and its result and exception columns show each job's own
status, error kind and message, and RESULT preview.

A real Redis, a real ``sandfleet worker`` (replay model over HTTP, Docker sandboxes) and a real
``sandfleet flower`` with basic auth. The batch: jobs whose program prints a RESULT (succeeded), jobs
whose program raises with no repair allowed (failed, kind ``program``) and a job naming a tool the
worker lacks (refused). Afterwards every message was acknowledged once (Ignore acks like a return).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sandfleet_testing.flower import AUTH, Fleet, get, running_fleet

from sandfleet.core.contracts import JobSpec, JobStatus
from sandfleet.producer.client import Client

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

GOOD = 3
BAD = 2
BROWSER_WAIT_S = 30.0
SCRIPT = {
    "rules": [
        {"match": "good question", "responses": ["```python\nprint('RESULT: {\"answer\": 42}')\n```"]},
        {"match": "bad question", "responses": ["```python\nraise ValueError('the data is not there')\n```"]},
    ]
}


@pytest.fixture
def selenium_driver(skip_or_fail, tmp_path: Path) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """Headless chromium through chromedriver (Debian's chromium and chromium-driver packages)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        skip_or_fail("chromium and chromium-driver are not installed (deploy/bootstrap.sh installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1600,1000", f"--user-data-dir={tmp_path / 'chrome-profile'}"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def fleet(redis_server: str, docker_engine, tmp_path: Path) -> Iterator[Fleet]:  # type: ignore[no-untyped-def]
    """Flower and a worker answering from SCRIPT."""
    script = tmp_path / "replay.json"
    script.write_text(json.dumps(SCRIPT))
    env = {"SANDFLEET_MODEL": f"replay:{script}"}
    with running_fleet(redis_server, "tfo", tmp_path, env, concurrency=4, sandboxes=2) as made:
        yield made


def api_tasks(fleet: Fleet) -> dict[str, dict]:  # type: ignore[type-arg]
    status, body = get(f"{fleet.flower_url}/api/tasks", AUTH)
    assert status == 200
    return json.loads(body or b"{}")


def rows_shown(driver) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """uuid -> the row's text, of the rows the tasks table shows now (read in one script, so a redraw
    of the table between two reads cannot leave a stale element)."""
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('#tasks-table tbody tr[id]'))"
        ".map(function (row) { return [row.id, row.innerText]; });"
    )
    return {row_id: text for row_id, text in rows}


def test_failed_filter_lists_exactly_the_failed_jobs(fleet: Fleet, selenium_driver) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    specs = [JobSpec(question=f"good question {i}", code_action={"max_repairs": 0}) for i in range(GOOD)]
    specs += [JobSpec(question=f"bad question {i}", code_action={"max_repairs": 0}) for i in range(BAD)]
    specs.append(JobSpec(question="good question, no such tool", tools=["no_such_tool"]))
    with Client(settings=fleet.settings) as client:
        batch = client.submit_batch(specs)
        batch.wait(timeout=180)
        results = {job.job_id: job.result(timeout=10) for job in batch.jobs()}
    failed = {job_id for job_id, r in results.items() if r.status != JobStatus.SUCCEEDED}
    succeeded = set(results) - failed
    assert len(succeeded) == GOOD and len(failed) == BAD + 1, {j: r.status for j, r in results.items()}
    assert {r.status for r in results.values() if r.job_id in failed} == {JobStatus.FAILED, JobStatus.REFUSED}

    # Flower's own API: FAILURE for exactly the jobs that did not succeed, with their outcome.
    deadline = time.monotonic() + 30
    while True:
        tasks = api_tasks(fleet)
        states = {job_id: tasks.get(job_id, {}).get("state") for job_id in results}
        if all(s in ("SUCCESS", "FAILURE") for s in states.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert {j for j, s in states.items() if s == "FAILURE"} == failed, states
    assert {j for j, s in states.items() if s == "SUCCESS"} == succeeded, states
    for job_id in failed:
        task, result = tasks[job_id], results[job_id]
        assert result.error is not None
        assert task["exception"].startswith(f"{result.status.value} ({result.error.kind.value}): ")
        assert json.loads(task["result"])["error"].startswith(result.error.kind.value)
    for job_id in succeeded:
        assert "42" in tasks[job_id]["result"] and "succeeded" in tasks[job_id]["result"]

    # The browser: the tasks page, then the Failed filter button.
    page = fleet.flower_url.replace("http://", f"http://{AUTH[0]}:{AUTH[1]}@") + "/tasks"
    selenium_driver.get(page)
    wait = WebDriverWait(selenium_driver, BROWSER_WAIT_S)
    wait.until(lambda d: set(results) <= set(rows_shown(d)))
    every_row = rows_shown(selenium_driver)
    for job_id in succeeded:
        assert "SUCCESS" in every_row[job_id] and "42" in every_row[job_id]
    selenium_driver.find_element(By.CSS_SELECTOR, '.task-state-filter[data-task-state="FAILURE"]').click()
    wait.until(lambda d: set(rows_shown(d)) == failed)
    failed_rows = rows_shown(selenium_driver)
    for job_id in failed:
        result = results[job_id]
        assert result.error is not None
        assert "FAILURE" in failed_rows[job_id]
        assert result.error.kind.value in failed_rows[job_id]
        assert result.error.message[:40] in failed_rows[job_id], failed_rows[job_id]  # its message
    shot = Path(__file__).resolve().parents[2] / "artifacts" / "flower-failed-filter.png"
    shot.parent.mkdir(exist_ok=True)
    selenium_driver.save_screenshot(str(shot))

    # Exactly once: every message acknowledged (nothing unacked or queued), one delivery per job.
    r = redis.Redis.from_url(fleet.settings.redis_url, decode_responses=True)
    try:
        assert r.llen(fleet.settings.key_prefix) == 0
        assert r.hlen("unacked") == 0 or not any(
            job_id in v for v in r.hvals("unacked") for job_id in results
        )
        for job_id in results:
            record = r.hgetall(f"{fleet.settings.key_prefix}:job:{job_id}")
            assert record["deliveries"] == "1", (job_id, record.get("deliveries"))
    finally:
        r.close()
