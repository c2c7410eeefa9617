"""Model endpoint failures through the engine: retried, raised as transient, or a failed job."""

from __future__ import annotations

from typing import Any

import pytest

from sandfleet.core.contracts import JobStatus
from sandfleet.core.errors import ModelUnavailableError
from sandfleet.worker.engine import ListAudit

from .helpers import job, python_block, run


def test_a_rate_limit_then_a_reply_is_retried_and_succeeds(engine_services: Any, replay: Any) -> None:
    server = replay(
        {"rules": [{"match": "seven", "fail_first": 1, "fail_status": 429,
                    "responses": [python_block("print('RESULT: 7')")]}]}
    )  # fmt: skip
    audit = ListAudit()
    result = run(job("what is seven?"), engine_services, server, audit)

    assert result.status == JobStatus.SUCCEEDED, result.error
    assert result.result == 7 and result.repairs == 0
    assert result.usage.model_calls == 1  # one answered call, after one retried HTTP request
    assert server.stats().requests == 2
    [call] = [data for kind, _n, data in audit.events if kind == "model_call"]
    assert call["tries"] == 2


def test_a_server_error_on_every_try_raises_model_unavailable(engine_services: Any, replay: Any) -> None:
    server = replay({"default": [{"status": 500, "error": "the model is down"}]})
    audit = ListAudit()
    with pytest.raises(
        ModelUnavailableError, match=r"unavailable after 2 tries: HTTP 500: the model is down"
    ):
        run(job("anything"), engine_services, server, audit)

    assert server.stats().requests == 2  # model_max_retries is 1 in these settings
    assert not [kind for kind, _n, _data in audit.events if kind == "sandbox_run"]


def test_a_refused_request_fails_the_job_without_retrying(engine_services: Any, replay: Any) -> None:
    server = replay({"default": [{"status": 400, "error": "context length exceeded"}]})
    result = run(job("anything"), engine_services, server)

    assert result.status == JobStatus.FAILED
    assert result.error is not None and result.error.kind == "model"
    assert "HTTP 400: context length exceeded" in result.error.message
    assert server.stats().requests == 1 and result.attempts == []
