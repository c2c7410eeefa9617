"""Pure parts of the outcome features: webhook signatures, model limits against policy, what Flower is
told, and the Grafana dashboard naming only metrics a worker serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from sandfleet.core.contracts import ErrorInfo, ErrorKind, JobResult, JobSpec, JobStatus
from sandfleet.core.errors import PolicyViolationError
from sandfleet.core.model_limits import ModelLimits
from sandfleet.core.records import JobRecord
from sandfleet.core.settings import Settings
from sandfleet.core.webhook_signing import sign, verify_signature
from sandfleet.core.webhook_url import webhook_host_allowed
from sandfleet.worker.delivery.flower_report import flower_outcome
from sandfleet.worker.llm.bounds import resolve_limits
from sandfleet.worker.metrics import WorkerMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "sandfleet-workers.json"


def test_signature_round_trip_and_refusals() -> None:
    body = b'{"job_id":"j1"}'
    signature = sign("s3cret", 1_000, body)
    assert verify_signature("s3cret", signature, "1000", body, now=1_010) == 1_000
    with pytest.raises(ValueError, match="does not match"):
        verify_signature("other", signature, "1000", body, now=1_010)
    with pytest.raises(ValueError, match="away from now"):
        verify_signature("s3cret", signature, "1000", body, now=1_000 + 3600)
    with pytest.raises(ValueError, match="malformed"):
        verify_signature("s3cret", "abc", "1000", body, now=1_000)


def test_the_same_scheme_as_the_approval_webhook() -> None:
    from sandfleet.worker.approval.webhook import signature as approval_signature

    assert sign("k", 1234, b"{}") == approval_signature("k", "1234", b"{}")


def test_model_limits_against_the_policy() -> None:
    settings = Settings(
        policy_max_completion_tokens=1000, policy_max_job_tokens=5000, policy_max_model_time_s=60
    )
    limits = resolve_limits(
        ModelLimits(max_completion_tokens=500),
        settings.model_copy(update={"model_max_completion_tokens": 800}),
    )
    assert (limits.max_completion_tokens, limits.max_job_tokens) == (500, 5000)  # the policy's budget applies
    with pytest.raises(PolicyViolationError, match="max_completion_tokens 2000 is above the policy's 1000"):
        resolve_limits(ModelLimits(max_completion_tokens=2000), settings)
    with pytest.raises(PolicyViolationError, match="max_model_time 120 s"):
        resolve_limits(ModelLimits(max_model_time=120), settings)
    with pytest.raises(ValueError, match="webhook must be an http"):
        JobSpec(question="q", webhook="file:///etc/passwd")


def test_flower_is_told_the_jobs_own_outcome() -> None:
    failed = JobRecord(
        job_id="j1",
        status=JobStatus.TIMED_OUT,
        result=JobResult(
            job_id="j1",
            status=JobStatus.TIMED_OUT,
            error=ErrorInfo(kind=ErrorKind.TIMEOUT, message="ran out"),
        ),
    )
    outcome = flower_outcome("j1", failed)
    assert outcome.failed and outcome.exception == "timed_out (timeout): ran out"
    ok = JobRecord(
        job_id="j2",
        status=JobStatus.SUCCEEDED,
        result=JobResult(job_id="j2", status=JobStatus.SUCCEEDED, result={"a": "x" * 500}),
    )
    outcome = flower_outcome("j2", ok)
    assert (
        not outcome.failed
        and outcome.summary["status"] == "succeeded"
        and len(outcome.summary["result"]) == 200
    )
    assert not flower_outcome("j3", None).failed


def test_the_dashboard_names_only_served_metrics() -> None:
    served = generate_latest(
        WorkerMetrics(lambda: {"started_by_runtime": {"runc": 1}, "failed_by_runtime": {"runc": 1}}).registry
    ).decode()
    names = set(re.findall(r"^# TYPE (\S+) (\S+)", served, re.M))
    exposed = set()
    for name, kind in names:
        exposed |= (
            {name, f"{name}_total"}
            if kind == "counter"
            else {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        )
    dashboard = json.loads(DASHBOARD.read_text())
    used = {
        m
        for p in dashboard["panels"]
        for t in p["targets"]
        for m in re.findall(r"sandfleet_[a-z_]+", t["expr"])
    }
    assert used and used <= exposed, used - exposed


def test_webhook_hosts_policy() -> None:
    allowed = ["hooks.example.com", "*.corp.example:8443", "127.0.0.1:9000"]
    assert webhook_host_allowed("https://hooks.example.com/x", allowed)
    assert webhook_host_allowed("https://ci.corp.example:8443/x", allowed)
    assert not webhook_host_allowed("https://ci.corp.example/x", allowed)  # port 443, not 8443
    assert not webhook_host_allowed(
        "https://corp.example:8443/x", allowed
    )  # the suffix itself is not a subdomain
    assert webhook_host_allowed("http://127.0.0.1:9000/", allowed)
    assert not webhook_host_allowed("http://127.0.0.1:6379/", allowed)  # the worker's Redis, say
    assert not webhook_host_allowed("http://169.254.169.254/latest/meta-data", allowed)
    assert not webhook_host_allowed("https://hooks.example.com/x", [])  # empty: nothing
