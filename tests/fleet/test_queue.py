"""The shared Celery configuration and the nesting of time limits (pure: no Redis)."""

from __future__ import annotations

import pytest

from sandfleet.core.contracts import JobSpec
from sandfleet.core.errors import InvalidSpecError
from sandfleet.core.queue import celery_config, check_time_limits, job_time_limits, sandbox_timeout_s
from sandfleet.core.redis_keys import FleetKeys, check_id
from sandfleet.core.settings import Settings
from sandfleet.worker.delivery.celery_app import create_app, time_limits, worker_config
from sandfleet.worker.delivery.task import compute_backoff


def test_default_limits_nest_inside_the_visibility_timeout() -> None:
    settings = Settings()
    soft, hard = time_limits(settings)
    assert sandbox_timeout_s() < soft < hard < settings.visibility_timeout_s


def test_a_worker_refuses_limits_that_do_not_nest_and_names_the_numbers() -> None:
    settings = Settings(visibility_timeout_s=600)
    _soft, hard = time_limits(settings)
    with pytest.raises(
        InvalidSpecError, match=rf"hard limit {hard:g} s < visibility timeout 600 s does not hold"
    ):
        worker_config(settings)
    with pytest.raises(InvalidSpecError, match="SANDFLEET_VISIBILITY_TIMEOUT_S"):
        create_app(settings)


def test_limits_grow_with_the_job_and_a_job_too_long_for_the_broker_is_refused() -> None:
    settings = Settings()
    small = JobSpec(question="q", code_action={"exec_timeout": 10, "max_repairs": 0})
    large = JobSpec(question="q", code_action={"exec_timeout": 600, "max_repairs": 5})
    assert (
        job_time_limits(settings, small)[0]
        < job_time_limits(settings)[0]
        < job_time_limits(settings, large)[0]
    )
    with pytest.raises(InvalidSpecError, match="time limits must nest"):
        check_time_limits(settings, large)
    check_time_limits(settings.model_copy(update={"visibility_timeout_s": 24 * 3600}), large)


def test_a_long_sandbox_timeout_stays_below_the_soft_limit() -> None:
    spec = JobSpec(question="q", sandbox={"timeout": 2000})
    soft, hard = job_time_limits(Settings(), spec)
    assert 2000 < soft < hard


def test_only_json_crosses_the_queue_and_nothing_is_lost_on_a_crash() -> None:
    conf = celery_config(Settings(key_prefix="fleet1"))
    assert conf["accept_content"] == ["json"] and conf["task_serializer"] == "json"
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1 and conf["result_backend"] is None
    assert conf["task_default_queue"] == "fleet1"
    worker = worker_config(Settings())
    assert worker["worker_pool"] == "threads" and worker["worker_send_task_events"]
    assert worker["broker_transport_options"]["visibility_timeout"] == Settings().visibility_timeout_s
    assert (worker["task_soft_time_limit"], worker["task_time_limit"]) == time_limits(Settings())


def test_backoff_doubles_up_to_a_cap() -> None:
    assert [compute_backoff(n, 5, 60) for n in range(5)] == [5, 10, 20, 40, 60]


def test_keys_live_under_the_prefix_and_ids_are_checked() -> None:
    keys = FleetKeys("fleet1")
    assert keys.job("a") == "fleet1:job:a" and keys.audit("a") == "fleet1:job:a:audit"
    assert all(k.startswith("fleet1:") for k in (*keys.job_keys("a"), *keys.status_indexes(), keys.rejected))
    assert keys.status_indexes()[0] == "fleet1:jobs:queued"
    with pytest.raises(ValueError, match="job id must be"):
        check_id("a b")


def test_a_tool_loop_jobs_limits_follow_its_wall_time() -> None:
    settings = Settings()
    short = JobSpec(question="q", mode="chat", tool_loop={"wall_timeout": 60})
    long = JobSpec(question="q", mode="shell", tool_loop={"wall_timeout": 3300})
    soft, hard = job_time_limits(settings, short)
    assert 60 < soft < hard and job_time_limits(settings, long)[0] > 3300
    with pytest.raises(InvalidSpecError, match="time limits must nest"):
        check_time_limits(settings, long)  # past the broker's visibility timeout
    # code_action's caps do not stretch a chat job, and the tool loop's do not stretch a program's.
    more_repairs = JobSpec(
        question="q", mode="chat", tool_loop={"wall_timeout": 60}, code_action={"max_repairs": 10}
    )
    assert job_time_limits(settings, short) == job_time_limits(settings, more_repairs)
