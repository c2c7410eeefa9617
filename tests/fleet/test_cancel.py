"""Cancel end to end: a real ``sandfleet worker`` on a real Redis, jobs in Docker sandboxes, the replay
model over HTTP. Queued jobs never start, running ones lose their sandbox at once, finished ones are
left as they were, and a batch is cancelled whole while it runs; each ends with one signed final record.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from sandfleet_testing import wait_for

from sandfleet.core.cancel import CancelOutcome
from sandfleet.core.contracts import JobStatus
from sandfleet.producer.client import Client, JobHandle

from .helpers import SANDFLEET, FleetWorker, WorkerFactory

ENDED_WITHIN_S = 15.0  # generous: the host is shared; benchmarks/cancel.py measures the latency


def sleeper(folder: Path, seconds: float, *, model_latency_s: float = 0.0) -> str:
    """A replay model whose every answer is a program that sleeps ``seconds`` and then answers."""
    source = f"import time\ntime.sleep({seconds})\nprint('RESULT: slept')\n"
    reply: dict[str, object] = {"text": f"```python\n{source}```\n"}
    if model_latency_s:
        reply["latency"] = model_latency_s
    path = folder / f"sleep-{seconds:g}-{model_latency_s:g}.json"
    path.write_text(json.dumps({"rules": [], "default": [reply] * 3}))
    return f"replay:{path}"


def worker_containers(fleet: FleetWorker) -> list[str]:
    """Ids of the Sandfleet containers the worker owns, by their owner label (docker ps -a)."""
    import docker

    client = docker.from_env()
    try:
        found = client.api.containers(all=True, filters={"label": "sandfleet.owner"})
        prefix = f"{os.uname().nodename}:{fleet.process.pid}:"
        return [
            c["Id"] for c in found if (c.get("Labels") or {}).get("sandfleet.owner", "").startswith(prefix)
        ]
    finally:
        client.close()


def final_events(job: JobHandle) -> list[str]:
    finals = {s.value for s in JobStatus if s.is_final}
    return [e.data["status"] for e in job.audit() if e.kind == "state" and e.data.get("status") in finals]


def assert_cancelled_once(job: JobHandle) -> None:
    result = job.result(timeout=ENDED_WITHIN_S)  # verified against its signed chain
    assert result.status == JobStatus.CANCELLED and result.error is not None
    assert result.error.kind == "cancelled"
    assert final_events(job) == ["cancelled"]
    assert job.verify().holds


@pytest.fixture(scope="module")
def fleet(module_fleet_worker: WorkerFactory) -> FleetWorker:
    return module_fleet_worker("cancel-fleet", concurrency=2, sandboxes=2)


@pytest.fixture
def client(fleet: FleetWorker) -> Client:
    return fleet.client


def cli(fleet: FleetWorker, *args: str) -> subprocess.CompletedProcess[str]:
    settings = fleet.settings
    env = {
        **os.environ,
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
        "SANDFLEET_RETENTION_S": str(settings.retention_s),
    }
    return subprocess.run([SANDFLEET, *args], capture_output=True, text=True, env=env, timeout=120)


def test_a_running_job_is_stopped_its_sandbox_killed_and_recorded_cancelled(
    fleet: FleetWorker, client: Client
) -> None:
    job = client.submit("Sleep for a minute", model=sleeper(fleet.scripts_dir, 60))
    wait_for(lambda: job.status() == JobStatus.RUNNING and worker_containers(fleet), 60, "the job's sandbox")
    [container] = worker_containers(fleet)
    done = cli(fleet, "cancel", job.job_id)
    assert done.returncode == 0, (done.stderr, fleet.log()[-4000:])
    assert f"job {job.job_id} was running: cancel requested" in done.stdout
    assert "it ended cancelled" in done.stdout
    assert_cancelled_once(job)
    assert not worker_containers(fleet)  # no container left: the sandbox was killed, not waited for
    [event] = [e for e in job.audit() if e.kind == "cancel"]
    assert container in event.data["sandboxes_destroyed"] and event.data["by"]
    record = job.record()
    assert record.attempts == 1 and "cancel_requested" in record.timestamps
    kinds = [e.kind for e in job.audit()]
    assert {"model_call", "program", "sandbox_run"} <= set(kinds)  # what it had done is in its audit
    assert kinds[-2:] == ["cancel", "state"]  # the cancel, then the seal
    assert "while it ran" in job.result().error.message  # type: ignore[union-attr]
    assert fleet.alive()


def test_a_model_call_in_flight_is_abandoned(fleet: FleetWorker, client: Client) -> None:
    job = client.submit("Think for a long time", model=sleeper(fleet.scripts_dir, 1, model_latency_s=60))
    wait_for(lambda: job.status() == JobStatus.RUNNING, 60, "the job to run")
    time.sleep(3)  # the replay server is up and the model request on its way (it answers after 60 s)
    began = time.monotonic()
    report = job.cancel()
    assert report.outcome == CancelOutcome.REQUESTED and report.status == "running"
    assert_cancelled_once(job)
    assert time.monotonic() - began < ENDED_WITHIN_S  # not the model's 60 s
    kinds = [e.kind for e in job.audit()]
    assert "model_call" not in kinds and "program" not in kinds
    [event] = [e for e in job.audit() if e.kind == "cancel"]
    assert event.data["model_calls_abandoned"] == 1 and event.data["sandboxes_destroyed"] == []


def test_a_queued_job_cancelled_never_starts(fleet: FleetWorker, client: Client) -> None:
    model = sleeper(fleet.scripts_dir, 60)
    busy = [client.submit(f"Occupy slot {i}", model=model) for i in range(2)]  # concurrency 2: both slots
    wait_for(lambda: all(j.status() == JobStatus.RUNNING for j in busy), 60, "both slots busy")
    waiting = client.submit("Wait in the queue", model=model)
    time.sleep(0.5)
    assert waiting.status() == JobStatus.QUEUED
    report = waiting.cancel()
    assert str(report) == f"job {waiting.job_id} was queued: cancel requested, it will not start"
    assert_cancelled_once(waiting)  # ended by the worker's watcher while its slots were busy
    record = waiting.record()
    assert record.attempts == 0 and "running" not in record.timestamps
    assert [e.data["status"] for e in waiting.audit() if e.kind == "state"] == ["queued", "cancelled"]
    assert "before it started" in waiting.result().error.message  # type: ignore[union-attr]
    for job in busy:
        job.cancel()
    for job in busy:
        assert_cancelled_once(job)
    wait_for(lambda: not worker_containers(fleet), ENDED_WITHIN_S, "no container left")
    # The cancelled job's message is still delivered later: it finds the job ended and does nothing.
    wait_for(lambda: waiting.record().deliveries == 1, 30, "the cancelled job's message")
    assert waiting.record().attempts == 0 and final_events(waiting) == ["cancelled"]


def test_cancelling_a_finished_job_is_a_no_op_with_a_clear_message(
    fleet: FleetWorker, client: Client
) -> None:
    job = client.submit("Answer at once", model=sleeper(fleet.scripts_dir, 0))
    assert job.result(timeout=120).status == JobStatus.SUCCEEDED
    before = job.record()
    report = job.cancel()
    assert report.outcome == CancelOutcome.ENDED
    assert str(report) == f"job {job.job_id} had already ended (succeeded): nothing to cancel"
    done = cli(fleet, "cancel", job.job_id)
    assert done.returncode == 0 and "had already ended (succeeded): nothing to cancel" in done.stdout
    after = job.record()
    assert after.status == JobStatus.SUCCEEDED and after.audit_count == before.audit_count
    assert "cancel_requested" not in after.timestamps
    assert not client.redis.exists(client.keys.cancel(job.job_id))
    missing = cli(fleet, "cancel", "no-such-job")
    assert missing.returncode == 1 and "no record for job(s) no-such-job" in missing.stderr


def test_cancelling_a_batch_while_it_runs(fleet: FleetWorker, client: Client) -> None:
    batch = client.submit_batch([f"Sleep {i}" for i in range(6)], model=sleeper(fleet.scripts_dir, 60))
    wait_for(lambda: batch.progress().counts.get("running") == 2, 60, "two of the batch running")
    done = cli(fleet, "cancel", "--batch", batch.batch_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("was running: cancel requested") == 2
    assert done.stdout.count("was queued: cancel requested, it will not start") == 4
    assert f"batch {batch.batch_id}: 6 jobs (cancelled 6)" in done.stderr
    progress = batch.progress()
    assert progress.total == 6 and progress.finished
    assert {k: v for k, v in progress.counts.items() if v} == {"cancelled": 6}
    for job in batch.jobs():
        assert_cancelled_once(job)
    assert sum(job.record().attempts for job in batch.jobs()) == 2  # only the two that ran had started
    assert not worker_containers(fleet)
    again = batch.cancel()  # every job has ended now: nothing to do
    assert again.requested == 0 and again.ended == 6
    assert str(again) == f"batch {batch.batch_id}: cancel requested for 0 of 6 jobs (6 had already ended)"
