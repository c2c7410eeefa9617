"""Bounds on model use, end to end: a real Redis and ``sandfleet worker`` calling, through the real
``openai`` client, a replay server started here (so the test sees every request body it was sent).

- the completion-token limit arrives in every model request (the job's, else the worker's default),
  and a job asking for more than the operator's policy is refused before any model call;
- a job whose token budget is spent fails with kind ``limit`` (``tokens`` in limits_hit, usage kept);
- on a slow endpoint a job fails as ``model`` (``model_time`` in limits_hit) once its model-time
  budget is spent, instead of trying the request 5 times and being retried as transient 5 times more.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandfleet_testing.workers import FleetWorker, WorkerFactory, fleet_settings_for

from sandfleet.core.contracts import ErrorKind, JobMode, JobStatus, Limit
from sandfleet.core.settings import DEFAULT_MODEL_MAX_COMPLETION_TOKENS
from sandfleet.worker.llm.scripted.script import parse_script
from sandfleet.worker.llm.scripted.server import ReplayServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

GOOD = "```python\nprint('RESULT: 42')\n```"
BAD = "```python\nraise ValueError('not yet')\n```"
SLOW_LATENCY_S = 30.0
MODEL_TIME_S = 3.0
SCRIPT = {
    "rules": [
        {"match": "repair once", "responses": [BAD, GOOD]},
        {"match": "slow question", "latency": SLOW_LATENCY_S, "responses": [GOOD]},
        {"match": "chat question", "system": "(?i)tool", "responses": ["RESULT: 7"]},
        {"match": "rambling question", "responses": ["word " * 2000 + "\n" + GOOD]},
    ]
}


@pytest.fixture
def model_server() -> Iterator[ReplayServer]:
    with ReplayServer(parse_script(SCRIPT, source="bounds")) as server:
        yield server


@pytest.fixture
def worker(
    redis_server: str, fleet_worker: WorkerFactory, tmp_path: Path, model_server: ReplayServer
) -> FleetWorker:
    settings = fleet_settings_for(redis_server, worker_state_dir=str(tmp_path / "state"))
    env = {
        "SANDFLEET_MODEL": "openai:replay",
        "SANDFLEET_MODEL_BASE_URL": model_server.base_url,
        "SANDFLEET_TRANSIENT_BACKOFF_S": "0.5",
    }
    return fleet_worker("worker", settings=settings, env=env)


def sent_for(server: ReplayServer, words: str) -> list[dict]:  # type: ignore[type-arg]
    """The request bodies whose user messages contain ``words``."""
    return [
        body
        for body in server.requests()
        if any(m.get("role") == "user" and words in str(m.get("content")) for m in body["messages"])
    ]


def test_completion_token_limit_in_every_request(worker, model_server: ReplayServer) -> None:  # type: ignore[no-untyped-def]
    client = worker.client
    limited = client.submit({"question": "repair once", "model_limits": {"max_completion_tokens": 64}})
    chat = client.submit(
        {"question": "chat question", "mode": "chat", "model_limits": {"max_completion_tokens": 32}}
    )
    default = client.submit({"question": "repair once, default limit"})
    too_much = client.submit({"question": "repair once", "model_limits": {"max_completion_tokens": 10**6}})
    assert limited.result(timeout=120).status == JobStatus.SUCCEEDED
    assert chat.result(timeout=120).status == JobStatus.SUCCEEDED
    assert default.result(timeout=120).status == JobStatus.SUCCEEDED
    refused = too_much.result(timeout=120)
    assert (
        refused.status == JobStatus.REFUSED
        and "max_completion_tokens 1000000 is above" in refused.error.message
    )

    sent = sent_for(model_server, "repair once")
    limited_requests = [b for b in sent if b.get("max_tokens") == 64]
    assert len(limited_requests) == 2  # the first program and the repair
    assert [b.get("max_tokens") for b in sent_for(model_server, "repair once, default limit")] == [
        DEFAULT_MODEL_MAX_COMPLETION_TOKENS
    ] * 2
    chat_sent = sent_for(model_server, "chat question")
    assert chat_sent and all(b.get("max_tokens") == 32 for b in chat_sent)
    assert all("max_tokens" in body for body in model_server.requests())  # every request, no exception
    assert len(model_server.requests()) == 5  # the refused job never called the model


def test_the_limit_cuts_a_rambling_reply(worker, model_server: ReplayServer) -> None:  # type: ignore[no-untyped-def]
    result = worker.client.submit(
        {
            "question": "rambling question",
            "model_limits": {"max_completion_tokens": 100},
            "code_action": {"max_repairs": 0},
        }
    ).result(timeout=120)
    # The server stopped at 100 tokens (as a real one does): the program at the end never came.
    assert result.status == JobStatus.FAILED and result.error.kind == ErrorKind.NO_PROGRAM
    assert result.usage.completion_tokens == 100
    events = worker.client.get(result.job_id).audit()
    assert [e.data.get("finish_reason") for e in events if e.kind == "model_call"] == ["length"]


def test_token_budget_per_job(worker, model_server: ReplayServer) -> None:  # type: ignore[no-untyped-def]
    result = worker.client.submit(
        {"question": "repair once", "model_limits": {"max_job_tokens": 50}, "code_action": {"max_repairs": 3}}
    ).result(timeout=120)
    assert result.status == JobStatus.FAILED
    assert result.error.kind == ErrorKind.LIMIT and "max_job_tokens" in result.error.message
    assert Limit.TOKENS in result.limits_hit
    assert result.usage.model_calls == 1 and result.usage.prompt_tokens > 50  # the call that spent it
    assert len(sent_for(model_server, "repair once")) == 1  # no second request was sent


def test_slow_endpoint_fails_within_the_model_time_budget(worker, model_server: ReplayServer) -> None:  # type: ignore[no-untyped-def]
    began = time.monotonic()
    job = worker.client.submit(
        {"question": "slow question", "model_limits": {"max_model_time": MODEL_TIME_S}}
    )
    result = job.result(timeout=120)
    took = time.monotonic() - began
    assert result.status == JobStatus.FAILED, result
    assert result.error.kind == ErrorKind.MODEL and "model-time budget" in result.error.message
    assert Limit.MODEL_TIME in result.limits_hit
    # One request, cut at the budget: no retries of the request, no transient retries of the job.
    assert len(sent_for(model_server, "slow question")) == 1
    record = job.record()
    assert record.deliveries == 1 and record.attempts == 1
    assert took < SLOW_LATENCY_S  # it did not even wait for the one slow reply
    assert (
        MODEL_TIME_S
        <= float(worker.client.redis.hget(f"{worker.settings.key_prefix}:job:{job.job_id}", "model_s"))
        < MODEL_TIME_S + 2
    )


def test_every_result_names_its_mode(worker) -> None:  # type: ignore[no-untyped-def]
    """Issue 23: a code-action job's result said ``mode: null`` (answered, failed and refused alike)."""
    client = worker.client
    answered = client.submit({"question": "repair once"})
    failed = client.submit(
        {
            "question": "rambling question",
            "code_action": {"max_repairs": 0},
            "model_limits": {"max_completion_tokens": 100},
        }
    )
    refused = client.submit({"question": "repair once", "model_limits": {"max_completion_tokens": 10**6}})
    chat = client.submit({"question": "chat question", "mode": "chat"})
    results = [handle.result(timeout=120) for handle in (answered, failed, refused, chat)]
    assert [r.status for r in results] == [
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.REFUSED,
        JobStatus.SUCCEEDED,
    ]
    assert [r.mode for r in results] == [JobMode.CODE_ACTION] * 3 + [JobMode.CHAT]
    assert client.get(answered.job_id).result().mode == JobMode.CODE_ACTION  # as stored, read back
