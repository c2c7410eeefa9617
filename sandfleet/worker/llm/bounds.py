"""A job's bounds on the model (``JobSpec.model_limits``), enforced around its model client.

:func:`resolve_limits` turns the job's limits and the worker's settings into the numbers in force
(refusing a job that asks for more than the operator's policy allows); :class:`BoundedModelClient`
wraps the job's ``ModelClient`` and, on every call:

- sends the completion-token limit (capped to what is left of the job's token budget);
- refuses to start a call once the token budget is spent (``TokenBudgetError``);
- gives the call only the model time that is left (``budget_s``: each try's timeout is bounded by
  it and no retry starts past it), and refuses to start once none is left (``ModelTimeBudgetError``).

Model time and tokens count over every delivery of the job: a :class:`UsageLedger` keeps them (in
the job's record in the fleet, :class:`MemoryLedger` for one process), so a job on a slow endpoint
that is retried as transient does not start each delivery with a fresh budget.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from sandfleet.core.errors import ModelError, ModelTimeBudgetError, PolicyViolationError, TokenBudgetError
from sandfleet.core.model_limits import ModelLimits
from sandfleet.core.settings import Settings
from sandfleet.core.vocabulary import ErrorKind, Limit
from sandfleet.worker.llm.client import ModelClient, ModelReply


@dataclass(frozen=True)
class LimitsInForce:
    """The numbers one job runs with: tokens per reply, tokens per job (None: no budget), seconds."""

    max_completion_tokens: int
    max_job_tokens: int | None
    max_model_time_s: float


def resolve_limits(limits: ModelLimits, settings: Settings) -> LimitsInForce:
    """The job's limits, its unset ones from the settings.

    Raises:
        PolicyViolationError: the job asks for more than the operator's policy allows (named).
    """
    problems: list[str] = []
    completion = _bounded(
        "max_completion_tokens", limits.max_completion_tokens, settings.model_max_completion_tokens,
        settings.policy_max_completion_tokens, problems,
    )  # fmt: skip
    job_tokens = _bounded(
        "max_job_tokens", limits.max_job_tokens, settings.model_max_job_tokens, settings.policy_max_job_tokens,
        problems,
    )  # fmt: skip
    model_time = _bounded(
        "max_model_time", limits.max_model_time, settings.model_time_budget_s, settings.policy_max_model_time_s,
        problems, unit=" s",
    )  # fmt: skip
    if problems:
        raise PolicyViolationError("model_limits: " + "; ".join(problems))
    assert completion is not None and model_time is not None  # their defaults are never None
    return LimitsInForce(completion, job_tokens, model_time)


def _bounded(name: str, asked: Any, default: Any, policy: Any, problems: list[str], unit: str = "") -> Any:
    """The value in force: what the job asked (refused past the policy), else the worker's default
    capped by the policy (an operator's lower policy never refuses jobs that asked for nothing)."""
    if asked is not None:
        if policy is not None and asked > policy:
            problems.append(f"{name} {_text(asked)}{unit} is above the policy's {_text(policy)}{unit}")
        return asked
    if default is None:
        return policy
    return default if policy is None else min(default, policy)


def _text(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def budget_outcome(error: ModelError) -> tuple[ErrorKind, Limit | None]:
    """How a model error ends the job: a spent token budget is a limit (kind ``limit``, ``tokens``),
    spent model time fails as ``model`` with ``model_time`` hit, any other refusal is kind ``model``."""
    if isinstance(error, TokenBudgetError):
        return ErrorKind.LIMIT, Limit.TOKENS
    if isinstance(error, ModelTimeBudgetError):
        return ErrorKind.MODEL, Limit.MODEL_TIME
    return ErrorKind.MODEL, None


class UsageLedger(Protocol):
    """What a job has spent on the model so far, over every delivery."""

    def spent(self, job_id: str) -> tuple[float, int]:
        """``(model seconds, tokens)`` spent by the job so far."""
        ...

    def add(self, job_id: str, seconds: float, tokens: int) -> None: ...


class MemoryLedger:
    """A ledger in this process's memory (``sandfleet ask``, tests): it forgets on exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spent: dict[str, tuple[float, int]] = {}

    def spent(self, job_id: str) -> tuple[float, int]:
        with self._lock:
            return self._spent.get(job_id, (0.0, 0))

    def add(self, job_id: str, seconds: float, tokens: int) -> None:
        with self._lock:
            s, t = self._spent.get(job_id, (0.0, 0))
            self._spent[job_id] = (s + seconds, t + tokens)


class BoundedModelClient:
    """A ``ModelClient`` that enforces one job's :class:`LimitsInForce` (one instance per job run)."""

    def __init__(
        self,
        inner: ModelClient,
        limits: LimitsInForce,
        job_id: str,
        ledger: UsageLedger,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = inner.name
        self.inner = inner
        self.limits = limits
        self.job_id = job_id
        self.ledger = ledger
        self.clock = clock

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        timeout_s: float | None = None,
        max_completion_tokens: int | None = None,
        budget_s: float | None = None,
    ) -> ModelReply:
        """The inner client's reply, within the job's bounds.

        Raises:
            TokenBudgetError: the job's token budget is spent; no request was sent.
            ModelTimeBudgetError: the job's model time is spent (before or during this call).
            ModelUnavailableError, ModelError: as the inner client.
        """
        spent_s, spent_tokens = self.ledger.spent(self.job_id)
        left_s = self.limits.max_model_time_s - spent_s
        if left_s <= 0:
            raise ModelTimeBudgetError(
                f"the job spent its model-time budget of {self.limits.max_model_time_s:g} s "
                f"({spent_s:.1f} s waiting on model {self.name})"
            )
        cap = min(
            max_completion_tokens or self.limits.max_completion_tokens, self.limits.max_completion_tokens
        )
        budget = self.limits.max_job_tokens
        if budget is not None:
            if spent_tokens >= budget:
                raise TokenBudgetError(
                    f"the job used {spent_tokens} tokens of its budget of {budget} (max_job_tokens): "
                    "no further model call"
                )
            cap = min(cap, budget - spent_tokens)
        started = self.clock()
        tokens = 0
        try:
            reply = self.inner.complete(
                messages,
                tools=tools,
                timeout_s=timeout_s,
                max_completion_tokens=cap,
                budget_s=min(left_s, budget_s) if budget_s is not None else left_s,
            )
            tokens = reply.prompt_tokens + reply.completion_tokens
            return reply
        finally:
            self.ledger.add(self.job_id, self.clock() - started, tokens)
