"""Backoff and retryability: pure functions, no fakes."""

from __future__ import annotations

import random

import pytest

from sandfleet.core.settings import Settings
from sandfleet.worker.llm.retry import RetryPolicy, compute_backoff, is_retryable_status


def test_backoff_doubles_from_the_base_without_jitter() -> None:
    delays = [compute_backoff(n, base_s=0.5, max_s=100, jitter_fraction=0) for n in range(1, 6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_backoff_is_capped() -> None:
    assert compute_backoff(30, base_s=0.5, max_s=20, jitter_fraction=0) == 20
    assert compute_backoff(10_000, base_s=0.5, max_s=20, jitter_fraction=0) == 20


def test_jitter_only_shortens_and_stays_within_its_fraction() -> None:
    rng = random.Random(7)
    for attempt in range(1, 8):
        full = compute_backoff(attempt, base_s=0.5, max_s=20, jitter_fraction=0)
        for _ in range(50):
            delay = compute_backoff(attempt, base_s=0.5, max_s=20, jitter_fraction=0.5, rng=rng)
            assert full * 0.5 <= delay <= full


def test_jitter_spreads_clients_apart() -> None:
    rng = random.Random(1)
    delays = {compute_backoff(3, rng=rng) for _ in range(20)}
    assert len(delays) > 10


def test_seeded_backoff_is_reproducible() -> None:
    assert compute_backoff(4, rng=random.Random(3)) == compute_backoff(4, rng=random.Random(3))


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        compute_backoff(0)


@pytest.mark.parametrize("status", [429, 500, 502, 503, 599])
def test_rate_limits_and_server_errors_are_retried(status: int) -> None:
    assert is_retryable_status(status)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 408, 409, 422, 200])
def test_other_statuses_are_not_retried(status: int) -> None:
    assert not is_retryable_status(status)


def test_policy_counts_the_first_try_plus_the_retries() -> None:
    assert RetryPolicy(max_retries=0).max_tries == 1
    assert RetryPolicy(max_retries=4).max_tries == 5


def test_policy_from_settings_uses_model_max_retries() -> None:
    settings = Settings(model_api_key=None, model_base_url=None, model_max_retries=3)
    assert RetryPolicy.from_settings(settings).max_retries == 3
    negative = Settings(model_api_key=None, model_base_url=None, model_max_retries=-1)
    assert RetryPolicy.from_settings(negative).max_tries == 1


def test_policy_delay_stays_under_its_cap() -> None:
    policy = RetryPolicy(max_retries=3, backoff_base_s=0.01, backoff_max_s=0.02)
    assert all(0 < policy.delay_s(n) <= 0.02 for n in range(1, 10))
