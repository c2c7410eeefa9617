"""Priorities end to end: one worker taking one job at a time, a backlog of batch jobs, and a single
job that overtakes it; the priority is in the record, ``sandfleet jobs`` and the task message Flower shows."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sandfleet.core.contracts import JobStatus
from sandfleet.core.priority import KOMBU_SEP, broker_priority
from sandfleet.core.queue import queue_name
from sandfleet.core.settings import Settings
from sandfleet.producer.client import Client

from .helpers import FleetWorker, WorkerFactory

BACKLOG = 6


def sleeper(folder: Path, seconds: float) -> str:
    source = f"import time\ntime.sleep({seconds})\nprint('RESULT: done')\n"
    path = folder / "sleep.json"
    path.write_text(json.dumps({"rules": [], "default": [f"```python\n{source}```\n"] * 3}))
    return f"replay:{path}"


@pytest.fixture
def fleet(fleet_worker: WorkerFactory) -> FleetWorker:
    return fleet_worker("fleet", concurrency=1, sandboxes=1)


def test_a_single_job_overtakes_a_backlog_of_batch_jobs(fleet: FleetWorker) -> None:
    client = fleet.client
    model = sleeper(fleet.scripts_dir, 1.0)
    batch = client.submit_batch([f"Backlog {i}" for i in range(BACKLOG)], model=model)
    deadline = time.monotonic() + 60
    while batch.progress().counts.get("running", 0) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    urgent = client.submit("Someone waits for this one", model=model)  # priority 5 > the batch's 3
    urgent9 = client.submit("And this one even more", model=model, priority=9)
    batch.wait(timeout=180)
    assert urgent.result(timeout=60).status == JobStatus.SUCCEEDED
    assert urgent9.result(timeout=60).status == JobStatus.SUCCEEDED
    started = {r.job_id: r.timestamps["running"] for r in client.jobs(batch=batch.batch_id)}
    order = sorted(
        [
            *started.items(),
            (urgent.job_id, urgent.record().timestamps["running"]),
            (urgent9.job_id, urgent9.record().timestamps["running"]),
        ],
        key=lambda item: item[1],
    )
    place = [job_id for job_id, _ in order]
    # One batch job was running when they were submitted (and at most one more already taken):
    # both single jobs start before the rest of the backlog, the priority-9 one first.
    assert place.index(urgent9.job_id) < place.index(urgent.job_id) <= 3, place
    assert [r.priority for r in client.jobs(batch=batch.batch_id)] == [3] * BACKLOG
    assert urgent.record().priority == 5 and urgent9.record().priority == 9


def test_the_priority_is_in_the_message_and_its_broker_list(client: Client, settings: Settings) -> None:
    job = client.submit("Urgent", priority=8)
    key = f"{queue_name(settings)}{KOMBU_SEP}{broker_priority(8)}"
    (raw,) = client.redis.lrange(key, 0, -1)
    message = json.loads(raw)
    assert message["headers"]["id"] == job.job_id and message["properties"]["priority"] == broker_priority(8)
    assert message["headers"]["kwargsrepr"] == repr({"job_id": job.job_id, "priority": 8})  # Flower shows it
    assert job.record().spec.priority == 8  # type: ignore[union-attr]


def test_a_priority_out_of_range_is_refused(client: Client) -> None:
    from sandfleet.core.errors import InvalidSpecError

    with pytest.raises(InvalidSpecError, match="priority: Input should be less than or equal to 9"):
        client.submit("Too urgent", priority=10)
