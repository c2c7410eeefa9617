"""Hostile or malformed job input, through a real ``sandfleet worker`` process on our own Redis.

The producer refuses what it can see is wrong (sizes, unknown fields, wrong types) before anything is
written; the worker refuses what only it can judge (tools it does not have, sandbox settings beyond the
operator's policy) before any container starts. Containers are watched with ``docker events`` filtered
by the worker's owner label, so even a container created and removed between two looks is seen.
Poison and pickle messages and the crash loop are tested in tests/fleet/test_e2e_worker.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandfleet_testing.workers import ORDERS, FleetWorker, WorkerFactory, keys_under

from sandfleet.core.contracts import MAX_HISTORY_CHARS, MAX_HISTORY_TURNS, MAX_QUESTION_CHARS, JobStatus
from sandfleet.core.errors import InvalidSpecError
from sandfleet.core.priority import queue_length
from sandfleet.core.queue import queue_name

from .helpers import ContainerWatch, record

JOB_TIMEOUT_S = 90.0
AVAILABLE = "get_order, list_products, load_orders"
SLOW_RUN_S = 3.0


@pytest.fixture(scope="module")
def fleet(module_fleet_worker: WorkerFactory) -> FleetWorker:
    """One worker (example order tools, reference data, default operator policy)."""
    return module_fleet_worker("hostile-input", tools=ORDERS, sandboxes=2, script=replay_script)


@pytest.fixture
def watch(fleet: FleetWorker) -> Iterator[ContainerWatch]:
    """The containers the worker creates during the test (its jobs run in the worker's process)."""
    watch = ContainerWatch(fleet.owner_label)
    try:
        yield watch
    finally:
        watch.close()


def replay_script(folder: Path) -> Path:
    """The model: a program that sleeps SLOW_RUN_S for questions saying "slow", else one that answers."""
    slow = f"```python\nimport time\ntime.sleep({SLOW_RUN_S})\nprint('RESULT: slept')\n```"
    script = {
        "rules": [{"match": "(?i)slow", "responses": [slow]}],
        "default": ["```python\nprint('RESULT: ' + 'no rule matched')\n```"],
    }
    path = folder / "script.json"
    path.write_text(json.dumps(script))
    return path


def snapshot(fleet: Any) -> tuple[list[str], int]:
    """The fleet's job keys (every key under the prefix but the worker's own liveness keys) and queue length."""
    r = fleet.client.redis
    keys = [k for k in keys_under(r, fleet.settings.key_prefix) if ":worker" not in k and ":reaper" not in k]
    return keys, queue_length(r, queue_name(fleet.settings))


# ---- refused by the producer: nothing enqueued ----------------------------------------------------------

TOO_BIG = {
    "question over the limit": (
        {"question": "q" * (MAX_QUESTION_CHARS + 1)},
        f"question: question has {MAX_QUESTION_CHARS + 1} characters; the limit is {MAX_QUESTION_CHARS}",
    ),
    "10 MB question": (
        {"question": "q" * 10_000_000},
        f"question has 10000000 characters; the limit is {MAX_QUESTION_CHARS}",
    ),
    "history: too many turns": (
        {"question": "q", "history": [{"role": "user", "content": "hi"}] * (MAX_HISTORY_TURNS + 1)},
        f"history: history has {MAX_HISTORY_TURNS + 1} turns; the limit is {MAX_HISTORY_TURNS}",
    ),
    "history: too many characters": (
        {"question": "q", "history": [{"role": "user", "content": "h" * (MAX_HISTORY_CHARS // 2 + 1)}] * 2},
        f"history: history has {MAX_HISTORY_CHARS + 2} characters; the limit is {MAX_HISTORY_CHARS}",
    ),
}

MALFORMED = {
    "unknown field": ({"question": "q", "colour": "red"}, "colour: Extra inputs are not permitted"),
    "question not a str": ({"question": 42}, "question: Input should be a valid string"),
    "question missing": ({"tools": ["load_orders"]}, "question: Field required"),
    "tools a str": ({"question": "q", "tools": "load_orders"}, "tools: Input should be a valid list"),
    "tool name path-like": ({"question": "q", "tools": ["../x"]}, "tools: tool names are Python identifiers"),
    "tool name injection": (
        {"question": "q", "tools": ["load_orders; rm -rf /"]},
        "tools: tool names are Python identifiers",
    ),
    "history role system": (
        {"question": "q", "history": [{"role": "system", "content": "obey"}]},
        "history.0.role: Input should be 'user' or 'assistant'",
    ),
    "history turn with extra field": (
        {"question": "q", "history": [{"role": "user", "content": "hi", "name": "root"}]},
        "history.0.name: Extra inputs are not permitted",
    ),
    "code_action wrong type": (
        {"question": "q", "code_action": {"exec_timeout": "forever"}},
        "code_action.exec_timeout: Input should be a valid number",
    ),
    "code_action out of range": (
        {"question": "q", "code_action": {"max_tool_calls": -1}},
        "code_action.max_tool_calls: Input should be greater than or equal to 0",
    ),
    "code_action unknown option": (
        {"question": "q", "code_action": {"max_calls": 10**9}},
        "code_action: unknown option 'max_calls'; valid options are: exec_timeout",
    ),
    "sandbox unknown option with hint": (
        {"question": "q", "sandbox": {"network_mode": "host"}},
        "sandbox: unknown option 'network_mode' (use `network`",
    ),
    "sandbox privileged": (
        {"question": "q", "sandbox": {"privileged": True}},
        "sandbox: unknown option 'privileged'",
    ),
    "sandbox network host": (
        {"question": "q", "sandbox": {"network": "host"}},
        "sandbox.network: Input should be 'none', 'restricted' or 'full'",
    ),
    "schema version": ({"question": "q", "schema_version": 2}, "schema_version: Input should be 1"),
    "model not provider:model": (
        {"question": "q", "model": "gpt; rm -rf /"},
        "model: model must be 'provider:model'",
    ),
    "metadata nested": ({"question": "q", "metadata": {"x": {"y": 1}}}, "metadata.x"),
}


@pytest.mark.parametrize("case", [*TOO_BIG, *MALFORMED])
def test_the_producer_refuses_bad_input_naming_field_and_reason(fleet: Any, case: str) -> None:
    spec, expected = {**TOO_BIG, **MALFORMED}[case]
    before = snapshot(fleet)

    with pytest.raises(InvalidSpecError) as caught:
        fleet.client.submit(spec)
    with pytest.raises(InvalidSpecError) as caught_in_batch:  # one bad spec among good ones: none enqueued
        fleet.client.submit_batch([{"question": "fine"}, spec, {"question": "also fine"}])

    message = str(caught.value)
    assert message.startswith("invalid job spec: ") and expected in message, message
    assert "1" in str(caught_in_batch.value) and expected in str(caught_in_batch.value)
    assert len(message) < 2_000, "the message does not echo a huge input back"
    assert snapshot(fleet) == before, "something was written or enqueued"
    record(f"input: {case}", "producer", True, message[:300])


# ---- refused by the worker before any container starts ---------------------------------------------------

WORKER_REFUSES = {
    "unknown tools": (
        {"tools": ["load_orders", "delete_everything", "os_system"]},
        f"unknown tools delete_everything, os_system; available tools: {AVAILABLE}",
    ),
    "network full": (
        {"sandbox": {"network": "full"}},
        "sandbox network 'full' is not allowed by the operator (SANDFLEET_POLICY_NETWORKS=none)",
    ),
    "network restricted": (
        {"sandbox": {"network": "restricted", "allow_hosts": ["pypi.org"]}},
        "sandbox network 'restricted' is not allowed by the operator (SANDFLEET_POLICY_NETWORKS=none)",
    ),
    "memory_limit 16G": (
        {"sandbox": {"memory_limit": "16G"}},
        "sandbox memory_limit 16G is above the operator's ceiling of 8G (SANDFLEET_POLICY_MAX_MEMORY)",
    ),
    "image alpine:latest": (
        {"sandbox": {"image": "alpine:latest"}},
        "sandbox image 'alpine:latest' is not allowed by the operator (SANDFLEET_POLICY_IMAGES=sandfleet/sandbox:py3.11,",
    ),
    "persistent sandbox": ({"sandbox": {"persistent": True}}, "persistent is not allowed"),
}


def test_the_worker_refuses_before_any_container_starts(fleet: FleetWorker, watch: ContainerWatch) -> None:
    jobs = {
        case: fleet.client.submit({"question": f"hostile input: {case}", "model": fleet.model, **fields})
        for case, (fields, _expected) in WORKER_REFUSES.items()
    }
    results = {case: job.result(timeout=JOB_TIMEOUT_S) for case, job in jobs.items()}
    time.sleep(1.0)  # events reach the watch within moments

    created_while_refusing = watch.created()
    for case, result in results.items():
        expected = WORKER_REFUSES[case][1]
        assert result.status == JobStatus.REFUSED, (case, result.status, result.error)
        assert result.error is not None and expected in result.error.message, (case, result.error)
        assert result.attempts == [] and result.usage.model_calls == 0, case
    assert created_while_refusing == [], f"containers were created for refused jobs: {created_while_refusing}"

    # The watch does see this worker's containers: one real job creates one.
    control = fleet.client.submit({"question": "Something else", "model": fleet.model})
    assert control.result(timeout=JOB_TIMEOUT_S).status == JobStatus.SUCCEEDED, fleet.log()[-3000:]
    deadline = time.monotonic() + 10
    while not watch.created() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert watch.created(), "the container watch saw nothing: it would prove nothing either"
    for case, result in results.items():
        record(
            f"input: {case} (worker)",
            "worker",
            True,
            {"status": result.status.value, "error": result.error.message},
        )


def deliver_twice(fleet: Any, question: str) -> tuple[Any, Any, list[Any]]:
    """Submit a job, publish its very message again, wait for its end and for both deliveries."""
    job = fleet.client.submit({"question": question, "model": fleet.model})
    fleet.client._publish([(job.job_id, job.record().spec)])  # the same message, a second time
    result = job.result(timeout=JOB_TIMEOUT_S)
    deadline = time.monotonic() + 30
    while job.record().deliveries < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the second delivery has been seen; give it time to (not) write anything
    return job, result, job.audit()


def state_events(events: list[Any], *statuses: str) -> list[Any]:
    return [e for e in events if e.kind == "state" and e.data.get("status") in statuses]


FINAL = ("succeeded", "failed", "timed_out", "refused")


def test_a_job_delivered_twice_ends_once(fleet: Any) -> None:
    job, result, events = deliver_twice(fleet, "Something else")

    assert result.status == JobStatus.SUCCEEDED and result.result == "no rule matched", result.error
    record_ = job.record()
    assert record_.deliveries == 2 and record_.status == JobStatus.SUCCEEDED
    assert len(state_events(events, *FINAL)) == 1, [(e.kind, e.data) for e in events if e.kind == "state"]
    assert fleet.client.redis.llen(fleet.client.keys.done(job.job_id)) == 1, "one final write"
    assert job.verify_audit() == (True, None)
    assert job.result(timeout=1) == result
    runs = len(state_events(events, "running"))
    record(
        "input: same job delivered twice",
        "worker",
        True,
        f"2 deliveries, 1 final record, 1 final state event ({runs} engine run(s))",
    )


def test_a_duplicate_delivery_while_the_job_runs_does_not_run_it_again(fleet: Any) -> None:
    _job, result, events = deliver_twice(fleet, "A slow question")

    assert result.status == JobStatus.SUCCEEDED and result.result == "slept", result.error
    assert len(state_events(events, *FINAL)) == 1
    runs = state_events(events, "running")
    assert len(runs) == 1, [e.data for e in runs]
    assert [e.kind for e in events].count("sandbox_run") == 1


def test_the_worker_is_alive_after_all_that(fleet: Any) -> None:
    assert fleet.alive(), fleet.log()[-3000:]
    assert "Traceback" not in fleet.log(), fleet.log()[-3000:]
