"""The fleet end to end: a real ``sandfleet worker`` process on a real Redis, driven through the Client.

The first tests need no sandbox (the worker refuses, stops or discards before the engine runs); the
``engine`` tests run real jobs in Docker with the replay model answering over HTTP.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import uuid

import pytest
from sandfleet_testing import wait_for

from sandfleet.core.contracts import JobSpec, JobStatus
from sandfleet.core.queue import TASK_NAME, queue_name

from .helpers import JOB_TIMEOUT_S, ORDERS, SANDFLEET, FleetWorker, WorkerFactory, replay_script


@pytest.fixture(scope="module")
def fleet(module_fleet_worker: WorkerFactory) -> FleetWorker:
    """A worker with no tools, for the cases decided before the engine runs (a valid job that races
    them does reach the engine, hence the engine)."""
    return module_fleet_worker("fleet")


def send_raw(fleet: FleetWorker, job_id: str, spec: object) -> None:
    """Publish a message as the producer would, but without its validation and without a record."""
    app = fleet.client.app
    app.send_task(TASK_NAME, args=[job_id, spec], task_id=job_id, queue=queue_name(fleet.settings))


# ---- decided before the engine runs -------------------------------------------------------------
def test_an_invalid_spec_that_skipped_the_producer_is_recorded_refused(fleet: FleetWorker) -> None:
    job = fleet.client.submit("A fine question")
    send_raw(fleet, job.job_id, {"question": "", "colour": "red"})  # a second, forged message
    result = job.result(timeout=JOB_TIMEOUT_S)
    # One of the two messages ended the job; the other found it ended. Exactly one final record.
    record = job.record()
    assert record.deliveries == 2 and record.status == result.status
    finals = [e for e in job.audit() if e.kind == "state" and e.data["status"] not in ("queued", "running")]
    assert len(finals) == 1 and job.verify_audit() == (True, None)


def test_a_job_that_keeps_killing_its_worker_is_stopped(fleet: FleetWorker) -> None:
    settings = fleet.settings
    r = fleet.client.redis
    spec = JobSpec(question="I crash workers")
    job_id = str(uuid.uuid4())
    # The record as the producer writes it, then three earlier deliveries that each died with their worker.
    fleet.client._record_queued([(job_id, spec)])
    r.hset(fleet.client.keys.deliveries(job_id), "0", settings.max_deliveries)
    fleet.client._publish([(job_id, spec)])
    result = fleet.client.get(job_id).result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.FAILED and result.error.kind == "crash_loop"
    assert result.error.message == "stopped after 3 deliveries: the job killed its worker each time"


def test_a_message_without_a_record_is_discarded_and_recorded(fleet: FleetWorker) -> None:
    job_id = str(uuid.uuid4())
    send_raw(fleet, job_id, {"question": "who wrote me?"})
    r = fleet.client.redis
    rejected = fleet.client.keys.rejected

    def noted() -> bool:
        return any(json.loads(f["details"]).get("job_id") == job_id for _i, f in r.xrange(rejected))

    wait_for(noted, what="the rejected entry")
    assert not r.exists(fleet.client.keys.job(job_id))


def test_poison_messages_do_not_kill_the_worker(fleet: FleetWorker) -> None:
    r = fleet.client.redis
    queue = queue_name(fleet.settings)
    # Not JSON at all, straight onto the queue.
    r.lpush(queue, b"\x80\x04not json at all")
    # A well-formed envelope whose body is a pickle: refused by accept_content=["json"].
    body = pickle.dumps(((str(uuid.uuid4()), {"question": "q"}), {}, {}))
    poison_id = str(uuid.uuid4())
    envelope = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "binary",
        "content-type": "application/x-python-serialize",
        "headers": {
            "lang": "py",
            "task": TASK_NAME,
            "id": poison_id,
            "retries": 0,
            "argsrepr": "",
            "kwargsrepr": "",
        },
        "properties": {
            "correlation_id": poison_id,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
            "priority": 0,
        },
    }
    r.lpush(queue, json.dumps(envelope))
    # An unknown task name.
    fleet.client.app.send_task("sandfleet.no_such_task", args=[1], queue=queue)
    rejected = fleet.client.keys.rejected

    def reasons() -> list[str]:
        return [f["reason"] for _i, f in r.xrange(rejected)]

    wait_for(
        lambda: {"not a kombu JSON message", "invalid message", "unknown task"} <= set(reasons()),
        what="records",
    )
    assert r.llen(queue) == 0
    # The worker is alive and still takes jobs.
    job_id = str(uuid.uuid4())
    fleet.client._record_queued([(job_id, JobSpec(question="after the poison"))])
    send_raw(fleet, job_id, {"question": ""})
    assert fleet.client.get(job_id).result(timeout=JOB_TIMEOUT_S).status == JobStatus.REFUSED
    assert fleet.alive(), fleet.log()[-3000:]


# ---- real jobs: Docker sandboxes, the example tools, the replay model over HTTP ----------------
@pytest.fixture(scope="module")
def engine_fleet(module_fleet_worker: WorkerFactory) -> FleetWorker:
    """A worker with the example order tools and the reference data, running jobs in Docker."""
    pytest.importorskip("sandfleet.worker.engine", reason="the engine (worker/engine) is not there yet")
    return module_fleet_worker("engine-fleet", tools=ORDERS, sandboxes=2, script=replay_script)


def test_the_reference_question_through_the_fleet(engine_fleet: FleetWorker) -> None:
    from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_QUESTION

    job = engine_fleet.client.submit(REFERENCE_QUESTION, tools=["load_orders"], model=engine_fleet.model)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, engine_fleet.log()[-3000:])
    assert result.result == REFERENCE_ANSWER and list(result.result) == list(REFERENCE_ANSWER)
    record = job.record()
    assert (record.attempts, record.deliveries) == (1, 1)
    assert {"queued", "running", "succeeded"} <= set(record.timestamps)
    kinds = [e.kind for e in job.audit()]
    assert kinds[:2] == ["state", "state"] and kinds[-1] == "state"
    assert {"model_call", "program", "sandbox_run", "tool_call"} <= set(kinds)
    [run] = [e for e in job.audit() if e.kind == "sandbox_run"]
    assert run.data["forked"] is True and run.data["warm"] in (True, False)
    assert job.verify_audit() == (True, None)


def test_submit_wait_on_the_command_line_prints_the_payload(engine_fleet: FleetWorker) -> None:
    from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_QUESTION

    settings = engine_fleet.settings
    env = {
        **os.environ,
        "SANDFLEET_REDIS_URL": settings.redis_url,
        "SANDFLEET_KEY_PREFIX": settings.key_prefix,
    }
    model = engine_fleet.model
    cmd = [SANDFLEET, "submit", REFERENCE_QUESTION, "--tools", "load_orders", "--model", model, "--wait"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == REFERENCE_ANSWER


def test_a_batch_through_the_fleet(engine_fleet: FleetWorker) -> None:
    from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_QUESTION

    model = engine_fleet.model
    specs = [{"question": REFERENCE_QUESTION, "tools": ["load_orders"], "model": model} for _ in range(4)]
    specs.append({"question": "Something else", "model": model})
    batch = engine_fleet.client.submit_batch(specs)
    seen: list[int] = []
    results = batch.wait(timeout=JOB_TIMEOUT_S * 2, on_progress=lambda p: seen.append(p.done))
    assert seen[-1] == 5 and batch.progress().finished
    assert [r.result for r in results[:4]] == [REFERENCE_ANSWER] * 4
    assert results[4].status == JobStatus.SUCCEEDED and results[4].result == "no rule matched"
