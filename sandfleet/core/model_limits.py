"""What one job may spend on the model: a contract users write (``JobSpec.model_limits``).

Three bounds, each ``None`` for the worker's default (``Settings.model_*``), and each capped by the
operator's policy (``Settings.policy_max_*``): asking for more is refused before any model call.

- ``max_completion_tokens``: tokens one model reply may have, sent with every request (as
  ``max_completion_tokens`` or ``max_tokens``, ``Settings.model_token_limit_param``), so a rambling
  model stops instead of generating to the end of its context.
- ``max_job_tokens``: prompt + completion tokens over the whole job (every delivery). No model call
  starts once it is spent, and each call's completion is capped to what is left; the job then ends
  ``failed`` (kind ``limit``, ``limits_hit`` ``tokens``).
- ``max_model_time``: seconds the job may spend waiting on the model over every delivery, failed
  tries and backoff included. Each request's timeout is bounded by what is left; when it runs out
  the job ends ``failed`` (kind ``model``, ``limits_hit`` ``model_time``) instead of being retried.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MAX_COMPLETION_TOKENS_CEILING = 1_000_000
MAX_JOB_TOKENS_CEILING = 1_000_000_000
MAX_MODEL_TIME_CEILING_S = 24 * 3600.0


class ModelLimits(BaseModel):
    """Bounds on one job's use of the model; ``None``: the worker's default. Times are seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_completion_tokens: int | None = Field(
        None, ge=1, le=MAX_COMPLETION_TOKENS_CEILING, description="tokens one model reply may have"
    )
    max_job_tokens: int | None = Field(
        None, ge=1, le=MAX_JOB_TOKENS_CEILING, description="prompt + completion tokens over the job"
    )
    max_model_time: float | None = Field(
        None,
        gt=0,
        le=MAX_MODEL_TIME_CEILING_S,
        description="seconds the job may wait on the model, retries and backoff included",
    )
