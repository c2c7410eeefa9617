"""Prometheus metrics of a real worker, scraped over HTTP, against what the jobs' records say ran.

A real Redis and ``sandfleet worker`` with ``SANDFLEET_METRICS_PORT`` set; a replay model over HTTP;
Docker sandboxes. Three reference jobs call the orders tool and succeed; two jobs' programs fail and
are repaired once, then fail. Then ``/metrics`` is read with ``prometheus_client``'s own parser and
every figure is compared with the sum over the final records; ``sandfleet loadtest``'s summary of the
same scrape is checked too.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from sandfleet_testing.workers import ORDERS, FleetWorker, WorkerFactory, fleet_settings_for

from sandfleet.core.contracts import JobStatus
from sandfleet.fleet.demo import demo_replay_script
from sandfleet.fleet.loadtest.scrape import format_metrics, scrape, summarize
from sandfleet.worker.tools.examples.scenario import REFERENCE_QUESTION

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BAD_PROGRAM = "```python\nraise ValueError('the data is not there')\n```"


@pytest.fixture
def worker(redis_server: str, fleet_worker: WorkerFactory, tmp_path: Path) -> tuple[FleetWorker, str]:
    settings = fleet_settings_for(redis_server, worker_state_dir=str(tmp_path / "state"))
    script = demo_replay_script()
    script["rules"].insert(0, {"match": "bad question", "responses": [BAD_PROGRAM]})  # type: ignore[union-attr]
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(script))
    started = fleet_worker(
        "worker", settings=settings, tools=ORDERS, metrics=True, env={"SANDFLEET_MODEL": f"replay:{path}"}
    )
    return started, started.metrics_url


def test_metrics_match_what_ran(worker) -> None:  # type: ignore[no-untyped-def]
    fleet_worker, url = worker
    client = fleet_worker.client
    with urllib.request.urlopen(url, timeout=5) as response:  # served before any job
        assert response.status == 200 and b"sandfleet_sandboxes_live" in response.read()
    specs = [{"question": REFERENCE_QUESTION, "tools": ["load_orders"]} for _ in range(3)]
    specs += [{"question": f"bad question {i}", "code_action": {"max_repairs": 1}} for i in range(2)]
    batch = client.submit_batch(specs)
    results = batch.wait(timeout=240)
    assert [r.status for r in results].count(JobStatus.SUCCEEDED) == 3, [r.error for r in results]
    assert [r.status for r in results].count(JobStatus.FAILED) == 2

    samples = scrape(url)
    assert samples["sandfleet_jobs_total{mode=code-action,status=succeeded}"] == 3
    assert samples["sandfleet_jobs_total{mode=code-action,status=failed}"] == 2
    calls = [c for r in results for a in r.attempts for c in a.tool_calls]
    assert calls and samples["sandfleet_tool_calls_total{outcome=ok,tool=load_orders}"] == len(calls)
    assert samples["sandfleet_tool_call_seconds_count"] == len(calls)
    assert samples["sandfleet_repairs_total"] == sum(r.repairs for r in results) == 2
    assert samples["sandfleet_model_calls_total"] == sum(r.usage.model_calls for r in results) == 7
    assert samples["sandfleet_model_tokens_total{kind=prompt}"] == sum(r.usage.prompt_tokens for r in results)
    assert samples["sandfleet_model_tokens_total{kind=completion}"] == sum(
        r.usage.completion_tokens for r in results
    )
    for phase in ("queue_wait", "model", "acquire", "run", "tool_calls", "total"):
        assert samples[f"sandfleet_job_phase_seconds_count{{phase={phase}}}"] == 5, phase
    model_s = sum(r.timings["model_s"] for r in results)
    assert samples["sandfleet_job_phase_seconds_sum{phase=model}"] == pytest.approx(model_s)
    programs = sum(1 for r in results for a in r.attempts if a.program)
    assert programs == 7
    assert samples["sandfleet_sandbox_creations_total{runtime=runc}"] >= programs  # one fresh container each
    assert samples.get("sandfleet_sandbox_failures_total{runtime=runc}", 0) == 0
    assert 0 <= samples["sandfleet_sandboxes_live"] <= 2  # the worker's --sandboxes
    assert not any(k.startswith("sandfleet_limits_hit_total") for k in samples)

    summary = summarize(samples)
    assert summary["jobs"] == {"mode=code-action,status=failed": 2, "mode=code-action,status=succeeded": 3}
    text = format_metrics(summary)
    assert "status=succeeded 3" in text and "created runtime=runc" in text
