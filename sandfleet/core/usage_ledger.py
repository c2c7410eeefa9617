"""What a job has spent on the model over every delivery, kept in its record (``model_s``,
``model_tokens`` of ``{p}:job:{id}``), so the budgets of ``JobSpec.model_limits`` hold across
transient retries and redeliveries (see sandfleet/worker/llm/bounds.py)."""

from __future__ import annotations

import redis

from sandfleet.core.redis_keys import FleetKeys

MODEL_SECONDS_FIELD = "model_s"
MODEL_TOKENS_FIELD = "model_tokens"


class RedisUsageLedger:
    """A ``UsageLedger`` on the job records: two fields of the job's hash, incremented atomically."""

    def __init__(self, client: redis.Redis, keys: FleetKeys) -> None:
        self._redis = client
        self._keys = keys

    def spent(self, job_id: str) -> tuple[float, int]:
        """``(model seconds, tokens)`` the job spent so far."""
        seconds, tokens = self._redis.hmget(self._keys.job(job_id), [MODEL_SECONDS_FIELD, MODEL_TOKENS_FIELD])
        return float(seconds or 0.0), int(tokens or 0)

    def add(self, job_id: str, seconds: float, tokens: int) -> None:
        key = self._keys.job(job_id)
        pipe = self._redis.pipeline(transaction=True)
        pipe.hincrbyfloat(key, MODEL_SECONDS_FIELD, max(0.0, seconds))
        pipe.hincrby(key, MODEL_TOKENS_FIELD, max(0, tokens))
        pipe.execute()
