"""The Celery configuration both sides share, and the time limits that must nest inside it.

Producers build an app from :func:`make_app` and enqueue by task name (``send_task``), so they never
import worker code; workers add their own settings on top (``sandfleet/worker/delivery/celery_app.py``). Celery keeps
no results: every outcome lives in the fleet's own records (:mod:`sandfleet.core.redis_keys`).

Time limits nest, outermost last::

    sandbox timeout  <  soft limit  <  hard limit  <  broker visibility timeout

A job still running when the visibility timeout passes would be handed to a second worker, so a
configuration (or a job) that breaks this order is refused before anything is enqueued or run.

Redis failures on either side read the same way (:func:`describe_redis_error`): unreachable, full
(``OOM command not allowed`` under ``maxmemory-policy noeviction``), or refusing the credentials.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, overload

import redis

from sandfleet.core.config import CodeActionSettings, SandboxConfig
from sandfleet.core.contracts import JobSpec
from sandfleet.core.errors import InvalidSpecError, QueueUnavailableError
from sandfleet.core.priority import BROKER_PRIORITY_OPTIONS
from sandfleet.core.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

TASK_NAME = "sandfleet.run_job"
APP_NAME = "sandfleet"

BROKER_CONNECT_TIMEOUT_S = 5.0
# Per attempt: waiting for a sandbox slot and starting the container.
SANDBOX_START_ALLOWANCE_S = 30.0
# Between the job's own worst case and the soft limit.
SOFT_LIMIT_MARGIN_S = 60.0
# Between the soft and the hard limit: time to write the failed record after the soft limit.
HARD_LIMIT_GRACE_S = 60.0

_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0.0, "interval_step": 0.2, "interval_max": 0.5}


def queue_name(settings: Settings) -> str:
    """The broker queue of the fleet: its key prefix (``sandfleet``), so fleets sharing a Redis stay apart."""
    return settings.key_prefix


def celery_config(settings: Settings) -> dict[str, Any]:
    """Settings every fleet process shares: JSON only, late acks, no result backend. The broker URL
    is translated from the fleet's forms (sentinel://, rediss://) by core/redis_connect.py."""
    from sandfleet.core.redis_connect import broker_options

    broker = broker_options(settings)
    tls = {"broker_use_ssl": broker["broker_use_ssl"]} if "broker_use_ssl" in broker else {}
    return {
        **tls,
        "broker_url": broker["broker_url"],
        "broker_connection_timeout": BROKER_CONNECT_TIMEOUT_S,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": settings.visibility_timeout_s,
            "socket_connect_timeout": BROKER_CONNECT_TIMEOUT_S,
            **BROKER_PRIORITY_OPTIONS,
            **broker["transport_options"],
        },
        "task_serializer": "json",
        "accept_content": ["json"],
        "event_serializer": "json",
        "result_serializer": "json",
        "result_accept_content": ["json"],
        "result_backend": None,
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_default_queue": queue_name(settings),
        "task_routes": {TASK_NAME: {"queue": queue_name(settings)}},
        "task_send_sent_event": True,
        "worker_send_task_events": True,
        "task_publish_retry_policy": _PUBLISH_RETRY_POLICY,
        "enable_utc": True,
    }


AppT = TypeVar("AppT", bound="Celery")


@overload
def make_app(settings: Settings, *, main: str = APP_NAME) -> Celery: ...
@overload
def make_app(settings: Settings, *, main: str = APP_NAME, app_class: type[AppT]) -> AppT: ...
def make_app(settings: Settings, *, main: str = APP_NAME, app_class: type[Any] | None = None) -> Any:
    """A Celery app (of ``app_class``, default Celery) with the shared configuration. Registers no tasks."""
    from celery import Celery

    app = (app_class or Celery)(main, set_as_current=False)
    app.conf.update(celery_config(settings))
    return app


def sandbox_timeout_s(spec: JobSpec | None = None) -> float:
    """The wall timeout of one of the job's containers, in seconds."""
    return (spec.sandbox_config if spec is not None else SandboxConfig()).timeout


def job_time_limits(settings: Settings, spec: JobSpec | None = None) -> tuple[float, float]:
    """``(soft, hard)`` time limits in seconds for a job (the defaults when ``spec`` is None).

    The worst case of one attempt is a model call with every retry, a sandbox start and a program
    run to its timeout; a job makes ``max_repairs + 1`` attempts. A shell or chat job stops itself at
    its ``tool_loop.wall_timeout``; one model call in flight, with its retries, may run past it.
    """
    code: CodeActionSettings = spec.code_action if spec is not None else CodeActionSettings()
    sandbox_s = sandbox_timeout_s(spec)
    model_call_s = settings.model_request_timeout_s * (settings.model_max_retries + 1)
    if spec is not None and spec.mode.uses_tool_loop:
        loop_s = spec.tool_loop.wall_timeout + model_call_s + SANDBOX_START_ALLOWANCE_S
        soft = max(loop_s, sandbox_s) + SOFT_LIMIT_MARGIN_S
        return soft, soft + HARD_LIMIT_GRACE_S
    attempt_s = min(code.exec_timeout, sandbox_s) + model_call_s + SANDBOX_START_ALLOWANCE_S
    soft = max((code.max_repairs + 1) * attempt_s, sandbox_s) + SOFT_LIMIT_MARGIN_S
    return soft, soft + HARD_LIMIT_GRACE_S


def check_time_limits(settings: Settings, spec: JobSpec | None = None) -> tuple[float, float]:
    """The job's ``(soft, hard)`` limits, or InvalidSpecError when they do not nest (numbers named)."""
    soft, hard = job_time_limits(settings, spec)
    sandbox_s = sandbox_timeout_s(spec)
    visibility_s = float(settings.visibility_timeout_s)
    if not sandbox_s < soft < hard < visibility_s:
        raise InvalidSpecError(
            f"time limits must nest: sandbox timeout {sandbox_s:g} s < soft limit {soft:g} s < "
            f"hard limit {hard:g} s < visibility timeout {visibility_s:g} s does not hold; "
            f"raise SANDFLEET_VISIBILITY_TIMEOUT_S above {hard:g} or lower exec_timeout / max_repairs / "
            f"the sandbox timeout"
        )
    return soft, hard


@contextmanager
def redis_errors(url: str) -> Iterator[None]:
    """Redis failures inside become QueueUnavailableError with a message that says what to check."""
    try:
        yield
    except redis.RedisError as e:
        raise QueueUnavailableError(describe_redis_error(url, e)) from e


def describe_redis_error(url: str, error: BaseException) -> str:
    """What went wrong with Redis, in words that say what to check."""
    text = str(error).rstrip(".")
    where = redact_url(url)
    if type(error).__name__ == "OutOfMemoryError" or "OOM" in text or "maxmemory" in text:
        return (
            f"Redis at {where} is full (OOM command not allowed: maxmemory reached with noeviction) and "
            f"refuses new jobs: {text}. Free memory or raise maxmemory"
        )
    if type(error).__name__ == "NoPermissionError" or text.startswith("NOPERM") or "NOPERM" in text:
        creds = url.partition("://")[2].rpartition("@")[0]
        user = creds.split(":", 1)[0] if ":" in creds else creds
        return (
            f"Redis at {where} refused the command for user {user or 'default'!r} (ACL, NOPERM: this "
            f"role may not do that): {text}. Use a URL with a user whose ACL allows it (deploy/redis-acl.conf: "
            "auditors read only; producers submit; workers run jobs)"
        )
    # redis-py raises AuthenticationError with the server's words minus the NOAUTH/WRONGPASS code (and,
    # speaking RESP3, "HELLO must be called ... authenticated" when no password was given): match the type.
    auth_error = any(c.__name__ == "AuthenticationError" for c in type(error).__mro__)
    if auth_error or "NOAUTH" in text or "WRONGPASS" in text or "invalid password" in text:
        given = "@" in url.partition("://")[2]
        advice = (
            "Check the password in SANDFLEET_REDIS_URL"
            if given
            else "Put the password in SANDFLEET_REDIS_URL: redis://:PASSWORD@host:port/0"
        )
        reason = "wrong password" if given else "it requires a password and none was given"
        return f"Redis at {where} refused the credentials (authentication failed: {reason}): {text}. {advice}"
    return (
        f"cannot reach Redis at {where}: {text}. Is redis-server running, and is SANDFLEET_REDIS_URL right?"
    )


def redact_url(url: str) -> str:
    """The URL without its password (nor a sentinel URL's ``sentinel_password``)."""
    url = re.sub(r"(sentinel_password=)[^&]*", r"\1***", url)
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        creds, _, host = rest.rpartition("@")
        user = creds.split(":", 1)[0]
        return f"{scheme}{sep}{user + ':' if user else ''}***@{host}"
    return url
