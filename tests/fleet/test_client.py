"""The producer against a real Redis: what submit writes and enqueues, what it refuses, how it fails."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from sandfleet.core.contracts import JobResult, JobSpec, JobStatus
from sandfleet.core.errors import InvalidSpecError, JobNotFoundError, QueueUnavailableError
from sandfleet.core.priority import priority_lists, queue_length
from sandfleet.core.queue import TASK_NAME, make_app, queue_name
from sandfleet.core.settings import Settings
from sandfleet.core.store import JobStore
from sandfleet.producer.client import Client

from .helpers import fleet_settings_for, free_port, keys_under


def queued_messages(r: redis.Redis, settings: Settings) -> list[dict]:
    return [json.loads(m) for key in priority_lists(queue_name(settings)) for m in r.lrange(key, 0, -1)]


def test_submit_records_the_job_and_enqueues_it_by_task_name(
    client: Client, raw_redis: redis.Redis, settings: Settings
) -> None:
    job = client.submit("Revenue per region?", tools=["load_orders"], sandbox={"memory_limit": "512M"})
    (message,) = queued_messages(raw_redis, settings)
    assert message["headers"]["task"] == TASK_NAME and message["headers"]["id"] == job.job_id
    assert message["content-type"] == "application/json"
    assert "Revenue per region?" in message["headers"]["argsrepr"]
    assert job.job_id in message["headers"]["kwargsrepr"]
    record = job.record()
    assert record.status == JobStatus.QUEUED and record.spec.tools == ["load_orders"]
    assert record.spec.sandbox == {"memory_limit": 512 * 1024**2}
    assert [e.kind for e in job.audit()] == ["state"] and job.verify_audit() == (True, None)
    assert client.get(job.job_id).status() == JobStatus.QUEUED
    assert [r.job_id for r in client.jobs(status="queued")] == [job.job_id]


def test_the_message_carries_the_spec_as_json_and_nested_time_limits(
    client: Client, raw_redis: redis.Redis, settings: Settings
) -> None:
    spec = JobSpec(question="q", code_action={"exec_timeout": 30})
    job = client.submit(spec)
    (message,) = queued_messages(raw_redis, settings)
    import base64

    args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    stored = spec.model_copy(update={"priority": 5})  # a single job's default priority, written in
    assert args == [job.job_id, stored.model_dump(mode="json")] and kwargs == {}
    soft, hard = message["headers"]["timelimit"][1], message["headers"]["timelimit"][0]
    assert 30 < soft < hard < settings.visibility_timeout_s


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"question": ""}, "question: question is empty"),
        ({"question": "q", "tols": ["x"]}, "tols"),
        ({"question": "q", "sandbox": {"network_mode": "host"}}, "use `network`"),
        ({"question": "q", "model": "gpt"}, "model: model must be 'provider:model'"),
        ({"question": "q", "code_action": {"exec_timeout": 3600, "max_repairs": 10}}, "visibility timeout"),
    ],
)
def test_a_bad_spec_is_refused_with_field_and_reason_and_nothing_is_written(
    client: Client, raw_redis: redis.Redis, settings: Settings, fields: dict, named: str
) -> None:
    with pytest.raises(InvalidSpecError, match=named.replace("(", r"\(").replace("`", "`")):
        client.submit(fields)
    assert keys_under(raw_redis, settings.key_prefix) == []


def test_a_batch_with_one_bad_spec_enqueues_nothing(
    client: Client, raw_redis: redis.Redis, settings: Settings
) -> None:
    specs = [{"question": "fine"}, {"question": "fine too"}, {"question": "bad", "tools": ["no way"]}]
    with pytest.raises(InvalidSpecError, match=r"spec 2: tools: tool names are Python identifiers"):
        client.submit_batch(specs)
    assert keys_under(raw_redis, settings.key_prefix) == []


def test_a_batch_is_recorded_enqueued_and_counted(
    client: Client, raw_redis: redis.Redis, settings: Settings
) -> None:
    batch = client.submit_batch([f"question {i}" for i in range(10)], batch_id="b-1")
    assert len(queued_messages(raw_redis, settings)) == 10
    progress = batch.progress()
    assert (progress.total, progress.counts["queued"], progress.done) == (10, 10, 0)
    assert [r.job_id for r in client.jobs(batch="b-1")] == batch.job_ids
    assert all(r.spec.batch_id == "b-1" for r in client.jobs(batch="b-1"))
    assert client.batch("b-1").job_ids == batch.job_ids
    assert batch.results() == [None] * 10


def test_batch_wait_reports_progress_until_every_job_ends(client: Client, store: JobStore) -> None:
    batch = client.submit_batch(["a", "b", "c"])
    seen: list[int] = []

    def finish_slowly() -> None:
        for job_id in batch.job_ids:
            time.sleep(0.05)
            store.mark_running(job_id, "w")
            store.finish(job_id, JobResult(job_id=job_id, status=JobStatus.SUCCEEDED, result=job_id))

    worker = threading.Thread(target=finish_slowly)
    worker.start()
    results = batch.wait(timeout=10, on_progress=lambda p: seen.append(p.done))
    worker.join()
    assert [r.result for r in results] == batch.job_ids
    assert seen[0] == 0 and seen[-1] == 3 and seen == sorted(seen)


def test_result_wakes_up_when_the_final_record_is_written(client: Client, store: JobStore) -> None:
    job = client.submit("Wait for me")
    waiters: list[JobResult] = []
    threads = [threading.Thread(target=lambda: waiters.append(job.result(timeout=10))) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    started = time.monotonic()
    store.finish(job.job_id, JobResult(job_id=job.job_id, status=JobStatus.SUCCEEDED, result=[1, 2]))
    for t in threads:
        t.join()
    assert time.monotonic() - started < 1.0  # woken by the done list, not by a poll
    assert [w.result for w in waiters] == [[1, 2]] * 3


def test_result_times_out_naming_the_job(client: Client) -> None:
    job = client.submit("Nobody runs me")
    with pytest.raises(TimeoutError, match=rf"job {job.job_id} has not ended after 0.2 s \(it is queued\)"):
        job.result(timeout=0.2)


def test_unknown_jobs_are_not_found(client: Client) -> None:
    with pytest.raises(JobNotFoundError, match="no record for job 'nope'"):
        client.get("nope")
    with pytest.raises(JobNotFoundError):
        client.get("../../etc")


def test_submit_fails_clearly_when_redis_is_down() -> None:
    settings = fleet_settings_for(f"redis://127.0.0.1:{free_port()}/0")
    with (
        Client(settings=settings) as client,
        pytest.raises(QueueUnavailableError, match="cannot reach Redis"),
    ):
        client.submit("Anyone there?")


def test_submit_fails_clearly_when_redis_is_full_and_nothing_is_half_written(
    redis_factory: Callable[..., Any],
) -> None:
    server = redis_factory("--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction")
    settings = fleet_settings_for(server.url)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    with Client(settings=settings) as client:
        kept = client.submit("Queued before Redis filled up")
        r.config_set("maxmemory", r.info("memory")["used_memory"] + 1024)
        with pytest.raises(
            QueueUnavailableError, match=r"is full \(OOM command not allowed.*; nothing was enqueued"
        ):
            client.submit("x" * 10_000)
        with pytest.raises(QueueUnavailableError, match=r"is full.*; nothing was enqueued"):
            client.submit_batch(["y" * 5000 for _ in range(5)])
        r.config_set("maxmemory", 0)
        assert (
            queue_length(r, queue_name(settings)) == 1
        )  # nothing queued was evicted, nothing new was half-written
        assert r.zcard(client.keys.all_jobs) == 1 and kept.status() == JobStatus.QUEUED
    r.close()


def test_a_failed_publish_withdraws_the_record(
    client: Client, raw_redis: redis.Redis, settings: Settings
) -> None:
    dead_broker = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    client._app = make_app(dead_broker)  # records reach Redis, messages cannot
    with pytest.raises(QueueUnavailableError, match="nothing was enqueued"):
        client.submit("Lost in the post")
    assert keys_under(raw_redis, settings.key_prefix) == []
