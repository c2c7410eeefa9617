"""One delivery of ``sandfleet.run_job`` (``sandfleet.worker.delivery.run.Delivery``) against a real Redis.

The engine is passed in as a function, so the bookkeeping around it is tested on its own: retries on
transient failures, the last try, crash loops, duplicates. Real engine runs are in test_e2e_worker.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandfleet.core.audit import RedisAuditSink
from sandfleet.core.cancel import CancelRequest, CancelRequests
from sandfleet.core.contracts import ErrorKind, JobResult, JobSpec, JobStatus
from sandfleet.core.errors import ModelUnavailableError, SandboxUnavailableError
from sandfleet.core.store import JobStore
from sandfleet.producer.client import Client
from sandfleet.worker.cancel.scope import RunningScopes, raise_if_cancelled
from sandfleet.worker.cancel.watcher import CancelWatcher
from sandfleet.worker.delivery.run import Delivery, DeliveryServices, JobRunner, Message


def run_delivery(
    store: JobStore, job_id: str, spec: Any, *, run: JobRunner, **message: Any
) -> JobStatus | None:
    """One delivery of ``job_id``'s message (``message``: the Message's other fields) by ``store``'s worker."""
    return Delivery(DeliveryServices(store, run), Message(job_id, spec, **message)).run()


def never_run(spec: JobSpec, job_id: str, audit: RedisAuditSink) -> JobResult:
    raise AssertionError("the engine must not run")


def docker_down(spec: JobSpec, job_id: str, audit: RedisAuditSink) -> JobResult:
    raise SandboxUnavailableError("cannot reach the Docker engine: is the Docker daemon running?")


def test_a_transient_failure_requeues_the_job_for_a_retry(client: Client, store: JobStore) -> None:
    job = client.submit("Docker is down")
    spec = job.record().spec.model_dump(mode="json")
    with pytest.raises(SandboxUnavailableError):
        run_delivery(store, job.job_id, spec, run=docker_down, retries=0, last_try=False)
    record = job.record()
    assert record.status == JobStatus.QUEUED and record.attempts == 1
    assert job.audit()[-1].data["status"] == "queued" and job.audit()[-1].data["retry"] == 1


def test_after_the_last_retry_the_job_fails_with_sandbox_unavailable(client: Client, store: JobStore) -> None:
    job = client.submit("Docker stays down")
    spec = job.record().spec.model_dump(mode="json")
    status = run_delivery(store, job.job_id, spec, run=docker_down, retries=5, last_try=True)
    assert status == JobStatus.FAILED
    result = job.result(timeout=1)
    assert result.error.kind == ErrorKind.SANDBOX_UNAVAILABLE
    assert result.error.message.startswith("sandbox unavailable: cannot reach the Docker engine")
    assert job.verify_audit() == (True, None)


def test_a_model_outage_is_named_as_such(client: Client, store: JobStore) -> None:
    def model_down(spec: JobSpec, job_id: str, audit: RedisAuditSink) -> JobResult:
        raise ModelUnavailableError("429 after 5 tries")

    job = client.submit("The model is rate-limited")
    run_delivery(store, job.job_id, job.record().spec.model_dump(mode="json"), run=model_down, last_try=True)
    assert job.result(timeout=1).error.message.startswith("model unavailable: 429 after 5 tries")


def test_an_engine_bug_fails_the_job_once(client: Client, store: JobStore) -> None:
    def broken(spec: JobSpec, job_id: str, audit: RedisAuditSink) -> JobResult:
        raise ZeroDivisionError("division by zero")

    job = client.submit("Hit a bug")
    run_delivery(store, job.job_id, job.record().spec.model_dump(mode="json"), run=broken)
    error = job.result(timeout=1).error
    assert (error.kind, error.message) == ("internal_error", "ZeroDivisionError: division by zero")


def test_the_engine_result_becomes_the_final_record(client: Client, store: JobStore) -> None:
    def answer(spec: JobSpec, job_id: str, audit: RedisAuditSink) -> JobResult:
        audit.emit("program", {"code": "print('RESULT: 42')"}, attempt=1)
        return JobResult(job_id=job_id, status=JobStatus.SUCCEEDED, result=42)

    job = client.submit("Answer")
    assert (
        run_delivery(store, job.job_id, job.record().spec.model_dump(mode="json"), run=answer)
        == JobStatus.SUCCEEDED
    )
    assert job.result(timeout=1).result == 42
    assert [e.kind for e in job.audit()] == ["state", "state", "program", "state"]
    # The same message again (a duplicate delivery): nothing runs, nothing changes.
    assert run_delivery(store, job.job_id, job.record().spec.model_dump(mode="json"), run=never_run) is None
    assert job.record().deliveries == 2 and len(job.audit()) == 4


def test_a_crash_loop_is_stopped_after_max_deliveries(client: Client, store: JobStore) -> None:
    job = client.submit("I kill my worker")
    spec = job.record().spec.model_dump(mode="json")
    for _ in range(store.settings.max_deliveries):  # three deliveries whose worker died mid-job
        store.count_delivery(job.job_id, retry=0)
        store.mark_running(job.job_id, "doomed")
    assert run_delivery(store, job.job_id, spec, run=never_run) == JobStatus.FAILED
    record = job.record()
    assert record.result.error.message == "stopped after 3 deliveries: the job killed its worker each time"
    assert (record.deliveries, record.attempts) == (4, 3)


def test_an_invalid_spec_is_refused_without_running(client: Client, store: JobStore) -> None:
    job = client.submit("Fine at submit time")
    assert (
        run_delivery(store, job.job_id, {"question": "q", "tools": "not a list"}, run=never_run)
        == JobStatus.REFUSED
    )
    assert job.result(timeout=1).error.message.startswith("invalid job spec: tools: ")


def test_a_second_delivery_of_a_job_running_in_this_process_is_dropped(
    client: Client, store: JobStore
) -> None:
    """Two deliveries of one job in one worker can both read it queued before either marks it running
    (seen as two ``running`` events under load): the one that is not first here is dropped."""
    job = client.submit("Delivered twice at once")
    spec = job.record().spec.model_dump(mode="json")
    assert run_delivery(store, job.job_id, spec, run=never_run, running_here=True) is None
    record = job.record()
    assert record.status == JobStatus.QUEUED and record.deliveries == 1  # counted, not run


def test_a_message_without_record_or_with_a_bad_id_is_discarded(store: JobStore) -> None:
    assert run_delivery(store, "no-record", {"question": "q"}, run=never_run) is None
    assert run_delivery(store, "bad id!", {"question": "q"}, run=never_run) is None
    reasons = [fields["reason"] for _id, fields in store.redis.xrange(store.keys.rejected)]
    assert reasons == ["no job record", "bad job id"]


def test_the_worker_refuses_to_start_when_time_limits_do_not_nest(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SANDFLEET_VISIBILITY_TIMEOUT_S": "600",
        "SANDFLEET_REDIS_URL": "redis://127.0.0.1:1/0",
    }
    sandfleet = str(Path(sys.executable).with_name("sandfleet"))
    done = subprocess.run(
        [sandfleet, "worker"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 1
    assert (
        "refusing to start: time limits must nest" in done.stderr
        and "visibility timeout 600 s" in done.stderr
    )


def test_a_cancel_just_after_the_one_look_still_stops_the_job_before_its_program(
    client: Client, store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delivery looks at the cancel key once, with its cancel token already open: a request made
    right after that look is heard by the cancel watcher, which cancels the token, and the program's
    run refuses to start (as ProgramRuntime does before every run). The job ends cancelled, unrun."""
    job = client.submit("Cancel me just after the look")
    requests = CancelRequests(store.redis, store.keys, store.settings.retention_s)
    scopes = RunningScopes()
    watcher = CancelWatcher(store, requests, scopes, end_queued=lambda *_: pytest.fail("ended as queued"))
    look = CancelRequests.requested

    def look_then_cancel(self: CancelRequests, job_id: str) -> CancelRequest | None:
        found = look(self, job_id)
        if self is not requests:  # the delivery's own look: the request lands just after it
            assert found is None and scopes.tokens(job_id)
            requests.request(job_id, "tester")
            watcher.handle(job_id)  # what the watcher does when it hears the request
            watcher.stop()  # waits for the token's cancel
        return found

    monkeypatch.setattr(CancelRequests, "requested", look_then_cancel)
    ran: list[str] = []

    def program(spec: JobSpec, job_id: str, audit: RedisAuditSink) -> JobResult:
        raise_if_cancelled("the program's run")
        ran.append(job_id)
        return JobResult(job_id=job_id, status=JobStatus.SUCCEEDED, result=1)

    services = DeliveryServices(store, program, scopes=scopes)
    spec = job.record().spec.model_dump(mode="json")
    assert Delivery(services, Message(job.job_id, spec)).run() == JobStatus.CANCELLED
    assert ran == [] and job.record().result.error.kind == ErrorKind.CANCELLED
    assert [e.kind for e in job.audit()][-2:] == ["cancel", "state"] and job.verify().verified
