"""When and how long to wait before calling the model endpoint again: pure functions, no I/O.

Only rate limits (429), server errors (5xx), timeouts and connection errors are worth another try;
any other 4xx means the request itself is wrong and would fail the same way again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sandfleet.core.settings import Settings

HTTP_TOO_MANY_REQUESTS = 429
DEFAULT_BACKOFF_BASE_S = 0.5
DEFAULT_BACKOFF_MAX_S = 20.0
# Each wait is shortened by up to this fraction at random, so clients that failed together
# (one rate limit hits every job on a host) do not all come back at the same instant.
DEFAULT_JITTER_FRACTION = 0.5


def is_retryable_status(status: int) -> bool:
    """Whether an HTTP status from the model endpoint is worth another try (429 and 5xx)."""
    return status == HTTP_TOO_MANY_REQUESTS or 500 <= status <= 599


def compute_backoff(
    attempt: int,
    *,
    base_s: float = DEFAULT_BACKOFF_BASE_S,
    max_s: float = DEFAULT_BACKOFF_MAX_S,
    jitter_fraction: float = DEFAULT_JITTER_FRACTION,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1 for the first failure).

    Exponential (``base_s * 2 ** (attempt - 1)``, capped at ``max_s``), then shortened by a random
    fraction in ``[0, jitter_fraction)``. Pass ``jitter_fraction=0`` for a deterministic figure or an
    ``rng`` seeded for a reproducible one.
    """
    if attempt < 1:
        raise ValueError(f"attempt counts from 1, got {attempt}")
    # min() on the exponent first keeps 2 ** n from growing without bound for absurd attempt numbers.
    exponent = min(attempt - 1, 62)
    delay_s = min(max_s, base_s * 2**exponent)
    draw = (rng or random).random()
    return delay_s * (1.0 - jitter_fraction * draw)


@dataclass(frozen=True)
class RetryPolicy:
    """How many times to call the endpoint and how long to wait between calls.

    Attributes:
        max_retries: further tries after the first one; ``0`` means a single try.
        backoff_base_s: the first wait, in seconds; each later wait doubles.
        backoff_max_s: no wait is longer than this, in seconds.
    """

    max_retries: int = 4
    backoff_base_s: float = DEFAULT_BACKOFF_BASE_S
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S

    @property
    def max_tries(self) -> int:
        """Every call made for one request, the first included."""
        return self.max_retries + 1

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (jittered)."""
        return compute_backoff(attempt, base_s=self.backoff_base_s, max_s=self.backoff_max_s)

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        """The fleet's policy: ``model_max_retries`` retries with the default backoff."""
        return cls(max_retries=max(0, settings.model_max_retries))
