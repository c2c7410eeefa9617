"""Network "restricted" end to end: jobs submitted with the Client to a real ``sandfleet worker`` on a
real Redis, the replay model over HTTP, programs in sandboxes under runc and gVisor reaching the test
HTTPS service through the worker host's egress proxy. An allowed name answers; a name not on the
job's list is refused by the proxy, and the refusal is in the job's result, its limits and its signed
audit chain (``sandfleet audit --verify`` passes)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from fleet.helpers import (
    JOB_TIMEOUT_S,
    SANDFLEET,
    FleetWorker,
    fleet_settings_for,
    keys_under,
    start_worker,
    stop_worker,
)
from sandbox.helpers import BACKENDS

from sandfleet.core.contracts import AuditKind, JobStatus
from sandfleet.core.settings import Settings

pytestmark = [pytest.mark.docker, pytest.mark.redis]

FETCH = """\
import json, urllib.request
try:  # the test CA is trusted through SANDFLEET_EGRESS_CA_FILE (SSL_CERT_FILE in the sandbox)
    with urllib.request.urlopen("https://{host}/hello", timeout=20) as reply:
        answer = reply.read().decode()
except Exception as e:  # what a program sees when the proxy refuses
    answer = "refused: " + type(e).__name__ + ": " + str(e)
print("RESULT: " + json.dumps(answer))
"""
ALLOWED_QUESTION = "Fetch the greeting of the allowed egress test service"
DENIED_QUESTION = "Fetch the greeting of the other egress test service"


@dataclass
class EgressFleet:
    worker: FleetWorker
    settings: Settings
    model: str


def replay_script() -> dict[str, Any]:
    def program(host: str) -> str:
        return "```python\n" + FETCH.format(host=host) + "```"

    return {
        "rules": [
            {"match": ALLOWED_QUESTION, "responses": [program("api.egress.test")]},
            {"match": DENIED_QUESTION, "responses": [program("other.egress.test")]},
        ]
    }


@pytest.fixture(scope="module")
def fleet(
    egress_env: dict[str, Any], service: Any, redis_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EgressFleet]:
    folder = tmp_path_factory.mktemp("egress-fleet")
    script = folder / "replay.json"
    script.write_text(json.dumps(replay_script()))
    settings = fleet_settings_for(redis_server)
    worker = start_worker(settings, folder, env=egress_env["env"])
    yield EgressFleet(worker, settings, f"replay:{script}")
    stop_worker(worker)
    r = redis.Redis.from_url(redis_server, decode_responses=True)
    if leftovers := keys_under(r, settings.key_prefix):
        r.delete(*leftovers)
    r.close()


def restricted(backend: str) -> dict[str, Any]:
    return {"backend": backend, "network": "restricted", "allow_hosts": ["api.egress.test"]}


def audit_verify(settings: Settings, job_id: str) -> subprocess.CompletedProcess[str]:
    """``sandfleet audit JOB --verify`` as a user runs it, with the fleet's Redis and prefix only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")}
    env |= {"SANDFLEET_REDIS_URL": settings.redis_url, "SANDFLEET_KEY_PREFIX": settings.key_prefix}
    return subprocess.run(
        [SANDFLEET, "audit", job_id, "--verify"], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_allowed_name_answers_the_job(fleet: EgressFleet, backend: str) -> None:
    job = fleet.worker.client.submit(ALLOWED_QUESTION, model=fleet.model, sandbox=restricted(backend))
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    assert result.result == "hello from api.egress.test on port 443"
    assert result.network_denied == [] and "network" not in result.limits_hit
    (attempt,) = result.attempts
    assert attempt.runtime == ("runc" if backend == "docker" else "runsc-egress")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_name_off_the_list_is_refused_and_audited(fleet: EgressFleet, backend: str) -> None:
    job = fleet.worker.client.submit(DENIED_QUESTION, model=fleet.model, sandbox=restricted(backend))
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    # The program saw a clean connection error at once (Squid closed the CONNECT before its 200).
    assert result.result.startswith("refused: "), result.result
    assert "Remote end closed connection without response" in result.result
    (denial,) = result.network_denied
    assert (denial.host, denial.port, denial.reason) == (
        "other.egress.test",
        443,
        "the name is not in the allow-list",
    )
    assert "network" in result.limits_hit and "network" in result.attempts[0].limits_hit
    # The refusal is in the signed chain: the run's event and a limit event, and the chain verifies.
    events = job.audit()
    (run,) = [e for e in events if e.kind == AuditKind.SANDBOX_RUN]
    (audited,) = run.data["network_denied"]
    assert audited == denial.model_dump(mode="json", exclude_none=True)
    assert any(e.kind == AuditKind.LIMIT and "network" in e.data["limits"] for e in events)
    verified = audit_verify(fleet.settings, job.job_id)
    assert verified.returncode == 0, (verified.stdout, verified.stderr)
