"""Network "restricted" end to end: jobs submitted with the Client to a real ``sandfleet worker`` on a
real Redis, the replay model over HTTP, programs in sandboxes under runc and gVisor reaching the test
HTTPS service through the worker host's egress proxy. An allowed name answers; a name not on the
job's list is refused by the proxy, a direct connection to an IP address by the sandbox's packet
filter, and each refusal is in the job's result, its limits and its signed audit chain
(``sandfleet audit --verify`` passes)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from sandbox.helpers import BACKENDS
from sandfleet_testing import skip_or_fail
from sandfleet_testing.wheels import DEBIAN_WHEELS, publish
from sandfleet_testing.workers import JOB_TIMEOUT_S, WorkerFactory

from sandfleet.core.contracts import AuditKind, JobStatus

from .helpers import EgressFleet, audit_verify

FETCH = """\
import json, urllib.request
try:  # the test CA is trusted through SANDFLEET_EGRESS_CA_FILE (SSL_CERT_FILE in the sandbox)
    with urllib.request.urlopen("https://{host}/hello", timeout=20) as reply:
        answer = reply.read().decode()
except Exception as e:  # what a program sees when the proxy refuses
    answer = "refused: " + type(e).__name__ + ": " + str(e)
print("RESULT: " + json.dumps(answer))
"""
DIRECT = """\
import json, socket
try:  # around the proxy, straight to the service's address: the sandbox's packet filter resets it
    socket.create_connection(("{address}", 443), timeout=20).close()
    answer = "connected"
except OSError as e:
    answer = "refused: " + type(e).__name__
print("RESULT: " + json.dumps(answer))
"""
ALLOWED_QUESTION = "Fetch the greeting of the allowed egress test service"
DENIED_QUESTION = "Fetch the greeting of the other egress test service"
DIRECT_QUESTION = "Connect straight to the address of the egress test service"
INSTALL_QUESTION = "Install sfe2epkg from the mirror and say its value"
PACKAGE = "sfe2epkg"


def replay_script(service_address: str) -> dict[str, Any]:
    def program(host: str) -> str:
        return "```python\n" + FETCH.format(host=host) + "```"

    def call(tool: str, **arguments: Any) -> dict[str, Any]:
        return {"tool_calls": [{"name": tool, "arguments": arguments}]}

    install = [
        call("sandbox_install_package", name=f"{PACKAGE}==2.0"),
        call("sandbox_exec", command=f"python3 -c 'import {PACKAGE}; print({PACKAGE}.VALUE)'"),
        'RESULT: "done"',
    ]
    return {
        "rules": [
            {"match": ALLOWED_QUESTION, "responses": [program("api.egress.test")]},
            {"match": DENIED_QUESTION, "responses": [program("other.egress.test")]},
            {
                "match": DIRECT_QUESTION,
                "responses": ["```python\n" + DIRECT.format(address=service_address) + "```"],
            },
            {"match": INSTALL_QUESTION, "system": "Linux sandbox of your own", "responses": install},
        ]
    }


@pytest.fixture(scope="module")
def fleet(
    egress_env: dict[str, Any],
    service: Any,
    module_fleet_worker: WorkerFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> EgressFleet:
    wheelhouse = pip_wheelhouse(
        tmp_path_factory.mktemp("egress-fleet") / "wheelhouse"
    )  # pip alone: the packages come from the mirror
    publish(service.index, PACKAGE, "2.0", "VALUE = 'sfe2epkg from the mirror'\n")
    env = {**egress_env["env"], "SANDFLEET_WHEELHOUSE_DIR": str(wheelhouse)}
    worker = module_fleet_worker("egress-fleet", env=env, script=replay_script(service.address))
    return EgressFleet(worker, worker.settings, worker.model)


def pip_wheelhouse(folder: Path) -> Path:
    pips = sorted(DEBIAN_WHEELS.glob("pip-*.whl"))
    if not pips:
        skip_or_fail(f"no pip wheel in {DEBIAN_WHEELS} (apt-get install python3-pip-whl)")
    folder.mkdir(mode=0o755)
    shutil.copyfile(pips[-1], folder / pips[-1].name)
    return folder


def restricted(backend: str) -> dict[str, Any]:
    return {"backend": backend, "network": "restricted", "allow_hosts": ["api.egress.test"]}


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


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_direct_ip_connection_is_refused_by_the_filter_and_audited(
    fleet: EgressFleet, service: Any, backend: str
) -> None:
    job = fleet.worker.client.submit(DIRECT_QUESTION, model=fleet.model, sandbox=restricted(backend))
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    assert result.result == "refused: ConnectionRefusedError"  # a clean reset, at once
    (denial,) = result.network_denied
    assert (denial.host, denial.port, denial.protocol, denial.count) == (service.address, 443, "tcp", 1)
    assert denial.reason == "a direct connection, not through the proxy (packet filter)"
    assert "network" in result.limits_hit and "network" in result.attempts[0].limits_hit
    events = job.audit()
    (run,) = [e for e in events if e.kind == AuditKind.SANDBOX_RUN]
    assert run.data["network_denied"] == [denial.model_dump(mode="json", exclude_none=True)]
    verified = audit_verify(fleet.settings, job.job_id)
    assert verified.returncode == 0, (verified.stdout, verified.stderr)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shell_job_installs_from_the_private_mirror(fleet: EgressFleet, backend: str) -> None:
    sandbox = {"backend": backend, "network": "restricted", "allow_hosts": ["mirror.egress.test"]}
    job = fleet.worker.client.submit(INSTALL_QUESTION, model=fleet.model, mode="shell", sandbox=sandbox)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    install, run = (turn.calls[0] for turn in result.turns[:2])
    assert install.ok, install.error
    assert install.result.startswith(
        f"installed {PACKAGE}==2.0 from the package index through the egress proxy"
    )
    assert run.ok and run.result["stdout"] == "sfe2epkg from the mirror\n", run.result
    assert result.network_denied == [] and "network" not in result.limits_hit


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shell_job_whose_list_lacks_the_mirror_gets_the_refusal(fleet: EgressFleet, backend: str) -> None:
    sandbox = {"backend": backend, "network": "restricted", "allow_hosts": ["api.egress.test"]}
    job = fleet.worker.client.submit(INSTALL_QUESTION, model=fleet.model, mode="shell", sandbox=sandbox)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    install = result.turns[0].calls[0]
    assert not install.ok and install.error is not None
    assert (
        "the egress proxy refused mirror.egress.test:443 (the name is not in the allow-list)" in install.error
    ), install.error
    assert {(d.host, d.port) for d in result.network_denied} == {("mirror.egress.test", 443)}
    assert result.session is not None and result.session.network_denied == result.network_denied
    assert "network" in result.limits_hit
    verified = audit_verify(fleet.settings, job.job_id)
    assert verified.returncode == 0, (verified.stdout, verified.stderr)
