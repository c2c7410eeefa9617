"""Jobs the worker refuses before any model call or container: unknown tools, forbidden sandboxes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandfleet.core.contracts import JobStatus
from sandfleet.worker.engine import EngineOptions, EngineServices, ListAudit
from sandfleet.worker.tools.registry import ToolRegistry

from .helpers import engine_settings, job, python_block, run


@pytest.fixture
def idle_services() -> Iterator[EngineServices]:
    """Services that have started nothing: no warm pool, so any container would be the job's."""
    registry = ToolRegistry.from_modules(["sandfleet.worker.tools.examples.orders"])
    options = EngineOptions(registry=registry, pool_size=0, max_sandboxes=1)
    with EngineServices.start(engine_settings(), options) as services:
        yield services


@pytest.fixture
def server(replay: Any) -> Any:
    return replay({"default": [python_block("print('RESULT: 1')")]})


def assert_refused_before_any_work(result: Any, audit: ListAudit, services: Any, server: Any) -> str:
    assert result.status == JobStatus.REFUSED
    assert result.error is not None and result.error.kind == "refused"
    assert result.attempts == [] and result.usage.model_calls == 0
    assert server.stats().requests == 0
    assert services.pool.stats()["started_total"] == 0 and services.pool.stats()["peak_live"] == 0
    assert audit.events == [("error", 0, {"kind": "refused", "message": result.error.message})]
    return result.error.message


def test_an_unknown_tool_is_refused(idle_services: EngineServices, server: Any) -> None:
    audit = ListAudit()
    result = run(job("q", tools=["load_orders", "delete_everything"]), idle_services, server, audit)
    message = assert_refused_before_any_work(result, audit, idle_services, server)
    assert message == (
        "unknown tool delete_everything; available tools: get_order, list_products, load_orders"
    )


def test_a_full_network_is_refused_by_the_default_policy(idle_services: EngineServices, server: Any) -> None:
    audit = ListAudit()
    result = run(job("q", sandbox={"network": "full"}), idle_services, server, audit)
    message = assert_refused_before_any_work(result, audit, idle_services, server)
    assert message == "sandbox network 'full' is not allowed by the operator (SANDFLEET_POLICY_NETWORKS=none)"


def test_an_image_outside_the_policy_is_refused(idle_services: EngineServices, server: Any) -> None:
    audit = ListAudit()
    result = run(job("q", sandbox={"image": "python:3.11"}), idle_services, server, audit)
    message = assert_refused_before_any_work(result, audit, idle_services, server)
    assert "image 'python:3.11' is not allowed by the operator" in message


def test_an_unknown_model_provider_is_refused(idle_services: EngineServices) -> None:
    from sandfleet.worker.engine import run_job

    audit = ListAudit()
    spec = job("q").model_copy(update={"model": "acme:big-model"})
    result = run_job(spec, "refused-job", services=idle_services, audit=audit)
    assert result.status == JobStatus.REFUSED and result.error is not None
    assert "unknown model provider 'acme'" in result.error.message
    assert idle_services.pool.stats()["started_total"] == 0
