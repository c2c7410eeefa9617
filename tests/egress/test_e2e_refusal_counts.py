"""Refusals past the packet filter's log rate, end to end: a real ``sandfleet worker`` on a real Redis,
the replay model over HTTP, programs in restricted sandboxes under runc and gVisor firing FLOOD direct
connections in a burst (twice the log's burst of 100) at addresses this test run owns
(tests/owned_targets.py), then one IPv6 connection. Every one is refused at once; the log itemises
what its rate lets through, the filter's REJECT counters count them all, and the job's record says
both: ``refused_total`` == FLOOD + 1 == the counts of ``network_denied`` + ``refused_unlisted``, in
the attempt (or session), the JobResult, ``sandfleet result --json``, the signed ``sandbox_run`` or
``session`` event, and ``sandfleet audit --verify`` passes. Nothing reaches the targets.

A shell job suspended for a gated call (``issue_refund``, approved) runs in two session sandboxes: the
refusals of the one destroyed for the wait are carried in its checkpoint, and the result counts both."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
from approvals.helpers import TOOLS, pending_of, wait_for
from sandbox.helpers import BACKENDS
from sandfleet_testing.workers import APPROVERS, JOB_TIMEOUT_S, SANDFLEET, WorkerFactory

from sandfleet.core.contracts import AuditKind, JobResult, JobStatus
from sandfleet.worker.egress.nflog import BURST

from .helpers import EgressFleet, audit_verify

FLOOD = 2 * BURST
PORTS = (22, 80, 443, 8080)
FLOOD_PROGRAM = """\
import json, socket
targets = {targets!r}
refused, other = 0, []
for i in range({flood}):  # a burst: each connect is reset by the sandbox's filter at once
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(tuple(targets[i % len(targets)]))
        other.append("connected")
    except ConnectionRefusedError:
        refused += 1
    except OSError as e:
        other.append(type(e).__name__)
    finally:
        s.close()
v6 = socket.socket(socket.AF_INET6)
v6.settimeout(5)
try:
    v6.connect(({ipv6!r}, 443))
    ipv6 = "connected"
except OSError as e:
    ipv6 = type(e).__name__
finally:
    v6.close()
print("RESULT: " + json.dumps({{"refused": refused, "other": other, "ipv6": ipv6}}))
"""
CODE_QUESTION = "Connect to many addresses directly, then over IPv6"
SHELL_QUESTION = "From a shell, connect to many addresses directly, then over IPv6"
SUSPENDED_QUESTION = "From a shell, knock once, refund, then knock again"
KNOCK_PROGRAM = """\
import socket, sys
s = socket.socket()
s.settimeout(5)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except OSError as e:
    print(type(e).__name__)
"""
IPV6_REASON = "IPv6 is not allowed (packet filter)"
DIRECT_REASON = "a direct connection, not through the proxy (packet filter)"


def flood_program(owned: Any) -> str:
    hosts = (owned.public_v4, owned.public_v4_b, owned.private, owned.link_local)
    targets = [[host, port] for host in hosts for port in PORTS]
    return FLOOD_PROGRAM.format(targets=targets, flood=FLOOD, ipv6=owned.public_v6)


def replay_script(owned: Any) -> dict[str, Any]:
    def call(tool: str, **arguments: Any) -> dict[str, Any]:
        return {"tool_calls": [{"name": tool, "arguments": arguments}]}

    program = flood_program(owned)
    knock = [
        call("sandbox_write_file", path="knock.py", content=KNOCK_PROGRAM),
        call("sandbox_exec", command=f"python3 knock.py {owned.public_v4} 443"),
        call("issue_refund", order_id="N-1", amount=5.0),
        call("sandbox_exec", command=f"python3 knock.py {owned.public_v4_b} 80"),
        'RESULT: "knocked"',
    ]
    shell = [
        call("sandbox_write_file", path="flood.py", content=program),
        call("sandbox_exec", command="python3 flood.py"),
        'RESULT: "done"',
    ]
    return {
        "rules": [
            {"match": SHELL_QUESTION, "system": "Linux sandbox of your own", "responses": shell},
            {"match": SUSPENDED_QUESTION, "responses": knock},
            {"match": CODE_QUESTION, "responses": ["```python\n" + program + "```"]},
        ]
    }


@pytest.fixture(scope="module")
def fleet(
    egress_env: dict[str, Any],
    owned_targets: Any,
    module_fleet_worker: WorkerFactory,
) -> EgressFleet:
    worker = module_fleet_worker(
        "egress-counts-fleet",
        env={
            **egress_env["env"],
            "SANDFLEET_APPROVAL_TOOLS": "issue_refund",
            "SANDFLEET_APPROVAL_GRACE_S": "1",
        },
        script=replay_script(owned_targets),
        tools=TOOLS,  # issue_refund, gated: the suspended shell job's
        approvers=APPROVERS,
    )
    return EgressFleet(worker, worker.settings, worker.model)


def restricted(backend: str) -> dict[str, Any]:
    return {"backend": backend, "network": "restricted", "allow_hosts": ["api.egress.test"]}


def result_json(fleet: EgressFleet, job_id: str) -> dict[str, Any]:
    """``sandfleet result JOB --json`` as a user runs it, with the fleet's Redis and prefix only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")}
    env |= {
        "SANDFLEET_REDIS_URL": fleet.settings.redis_url,
        "SANDFLEET_KEY_PREFIX": fleet.settings.key_prefix,
    }
    done = subprocess.run(
        [SANDFLEET, "result", job_id, "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    return dict(json.loads(done.stdout))


def check_counts(result: JobResult, owned: Any) -> None:
    """Every refusal counted, the listed ones itemised with owned addresses, the IPv6 one among them."""
    listed = sum(d.count for d in result.network_denied)
    assert result.refused_total == FLOOD + 1, (result.refused_total, result.network_denied)
    assert listed + result.refused_unlisted == result.refused_total, (listed, result.refused_unlisted)
    assert listed >= BURST and result.refused_unlisted > 0  # the log's burst itemised, the rest counted
    owned_v4 = {owned.public_v4, owned.public_v4_b, owned.private, owned.link_local}
    direct = [d for d in result.network_denied if d.reason == DIRECT_REASON]
    assert {d.host for d in direct} <= owned_v4 and {d.protocol for d in direct} == {"tcp"}
    (ipv6,) = [d for d in result.network_denied if d.reason == IPV6_REASON]
    assert (ipv6.host, ipv6.port, ipv6.protocol, ipv6.count) == (owned.public_v6, 443, "tcp", 1)
    assert "network" in result.limits_hit


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_burst_past_the_log_rate_is_refused_and_counted_in_the_record(
    fleet: EgressFleet, owned_targets: Any, backend: str
) -> None:
    mark = owned_targets.mark()
    job = fleet.worker.client.submit(CODE_QUESTION, model=fleet.model, sandbox=restricted(backend))
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    assert result.result == {"refused": FLOOD, "other": [], "ipv6": "ConnectionRefusedError"}
    check_counts(result, owned_targets)
    (attempt,) = result.attempts
    assert (attempt.refused_total, attempt.refused_unlisted) == (
        result.refused_total,
        result.refused_unlisted,
    )
    shown = result_json(fleet, job.job_id)
    assert shown["verified"] is True
    assert (shown["refused_total"], shown["refused_unlisted"]) == (FLOOD + 1, result.refused_unlisted)
    (run,) = [e for e in job.audit() if e.kind == AuditKind.SANDBOX_RUN]
    assert (run.data["refused_total"], run.data["refused_unlisted"]) == (FLOOD + 1, result.refused_unlisted)
    assert run.data["network_denied"] == [
        d.model_dump(mode="json", exclude_none=True) for d in attempt.network_denied
    ]
    verified = audit_verify(fleet.settings, job.job_id)
    assert verified.returncode == 0, (verified.stdout, verified.stderr)
    assert owned_targets.arrived_since(mark) == {}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shell_sessions_burst_is_counted_in_its_session_record(
    fleet: EgressFleet, owned_targets: Any, backend: str
) -> None:
    mark = owned_targets.mark()
    job = fleet.worker.client.submit(
        SHELL_QUESTION, model=fleet.model, mode="shell", sandbox=restricted(backend)
    )
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    ran = result.turns[1].calls[0]
    assert ran.ok and json.loads(ran.result["stdout"].split("RESULT: ", 1)[1]) == {
        "refused": FLOOD,
        "other": [],
        "ipv6": "ConnectionRefusedError",
    }, ran.result
    check_counts(result, owned_targets)
    assert result.session is not None
    assert (result.session.refused_total, result.session.refused_unlisted) == (
        result.refused_total,
        result.refused_unlisted,
    )
    destroyed = [e for e in job.audit() if e.kind == AuditKind.SESSION and e.data["event"] == "destroyed"]
    assert [e.data["refused_total"] for e in destroyed] == [FLOOD + 1]
    verified = audit_verify(fleet.settings, job.job_id)
    assert verified.returncode == 0, (verified.stdout, verified.stderr)
    assert owned_targets.arrived_since(mark) == {}


def test_a_suspended_shell_jobs_result_counts_the_refusals_of_every_session(
    fleet: EgressFleet, owned_targets: Any
) -> None:
    """One refusal before the wait (its session destroyed), one after (a fresh session): both in the
    result, the session record and ``sandfleet result --json``; each session's own in its event."""
    mark = owned_targets.mark()
    job = fleet.worker.client.submit(
        SUSPENDED_QUESTION,
        model=fleet.model,
        mode="shell",
        tools=["issue_refund"],
        sandbox=restricted("docker"),
    )
    [request] = wait_for(lambda: pending_of(fleet.worker, job.job_id), what="the gated call's request")
    wait_for(lambda: job.status() == JobStatus.AWAITING_APPROVAL, what="the job to be suspended")
    fleet.worker.client.approve(request.id)
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    knocks = [c.result["stdout"].strip() for t in result.turns for c in t.calls if c.tool == "sandbox_exec"]
    assert knocks == ["ConnectionRefusedError", "ConnectionRefusedError"]
    assert result.refused_total == 2 and result.refused_unlisted == 0, result.network_denied
    assert [(d.host, d.port, d.reason, d.count) for d in result.network_denied] == [
        (owned_targets.public_v4, 443, DIRECT_REASON, 1),
        (owned_targets.public_v4_b, 80, DIRECT_REASON, 1),
    ]
    assert result.session is not None and result.session.refused_total == 2
    assert result.session.network_denied == result.network_denied and "network" in result.limits_hit
    sessions = [e.data for e in job.audit() if e.kind == AuditKind.SESSION]
    destroyed = [s for s in sessions if s["event"] == "destroyed"]
    assert [(s["refused_total"], s["network_denied"][0]["port"]) for s in destroyed] == [(1, 443), (1, 80)]
    shown = result_json(fleet, job.job_id)
    assert shown["verified"] is True and shown["refused_total"] == 2
    verified = audit_verify(fleet.settings, job.job_id)
    assert verified.returncode == 0, (verified.stdout, verified.stderr)
    assert owned_targets.arrived_since(mark) == {}
