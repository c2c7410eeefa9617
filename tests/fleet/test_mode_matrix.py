"""The mode x feature matrix (issue 26, point 7): the cells no other module tests through a real worker.

One real ``sandfleet worker`` on the test Redis for the whole module, the replay model over HTTP
through the real openai client, jobs submitted with the Client and read back from the records, the
audit chain and the ``sandfleet`` commands. The worker serves the example orders tool, the tests' lab
MCP server over stdio (tests/mcp_tools/servers/lab.py) and a policy that allows network "restricted"
(no egress proxy is needed: no restricted sandbox starts here).

Cells tested here: an MCP tool in every mode; cancel in the tool-calling modes (chat, shell) while
the model call is in flight; verify and replay of chat and shell jobs (verified, tampering caught,
``replay`` says why there is nothing to re-run); the network and artifact options of a chat job,
which runs no sandbox (recorded, never a container; refused alike when beyond the policy). The
matrix itself, and the other cells' tests, are in docs/modes.md ("Every feature in every mode").
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import pytest
from mcp_tools.helpers import LAB, stdio, write_config

from sandfleet.core.contracts import AuditKind, JobStatus
from sandfleet.core.errors import UnverifiedResultError
from sandfleet.core.settings import Settings
from sandfleet.fleet.demo import REFERENCE_CHAT_TOTALS, TOOL_LOOP_PROMPT, demo_replay_script
from sandfleet.producer.client import Client, JobHandle
from sandfleet.worker.tools.examples.scenario import REFERENCE_QUESTION, write_reference_data

from .helpers import JOB_TIMEOUT_S, ORDERS, SANDFLEET, FleetWorker, WorkerFactory

MODES = ("code-action", "shell", "chat")
TOOL_LOOP_MODES = ("shell", "chat")
SHELL_SYSTEM = "Linux sandbox of your own"  # a regex over shell mode's system prompt
ENDED_WITHIN_S = 15.0  # a cancelled job's end, generous on a shared host (benchmarks/cancel.py measures it)
ALLOWED_HOST = "api.matrix.test"  # in the worker's SANDFLEET_POLICY_ALLOW_HOSTS; nothing answers there

MCP_QUESTION = "What is the mean of two and four, by the lab server?"
SLOW_QUESTION = "Think for a long time before answering"
COUNT_QUESTION = "Count to three in writing"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """A scripted reply asking for one function call."""
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def block(source: str) -> str:
    return f"```python\n{source.strip()}\n```"


def matrix_script() -> dict[str, Any]:
    """The replay model's answers: each question in each mode (shell first: its system prompt also
    matches the tool-calling loop's regex), then the demo's reference rules (chat and code-action)."""
    mcp_program = block("""
import json
from sandfleet_tools import lab__stats
print("RESULT: " + json.dumps(lab__stats([2, 4])["mean"]))
""")
    count_command = "printf '1\\n2\\n3\\n' > out/three.txt && wc -l < out/three.txt"
    slow = [{"text": "RESULT: too late", "latency": 60}]
    rules = [
        {
            "match": MCP_QUESTION,
            "system": SHELL_SYSTEM,
            "responses": [
                call("lab__stats", numbers=[2, 4]),
                call("sandbox_exec", command="python3 -c 'print((2 + 4) / 2)'"),
                "RESULT: 3.0",
            ],
        },
        {
            "match": MCP_QUESTION,
            "system": TOOL_LOOP_PROMPT,
            "responses": [call("lab__stats", numbers=[2, 4]), "RESULT: 3.0"],
        },
        {"match": MCP_QUESTION, "responses": [mcp_program]},
        {"match": SLOW_QUESTION, "responses": slow},
        {
            "match": COUNT_QUESTION,
            "system": SHELL_SYSTEM,
            "responses": [call("sandbox_exec", command=count_command), "RESULT: 3"],
        },
        *demo_replay_script()["rules"],
    ]
    return {"rules": rules, "default": ["RESULT: no rule matched"]}


@dataclass
class MatrixFleet:
    worker: FleetWorker
    model: str  # replay:FILE

    @property
    def client(self) -> Client:
        return self.worker.client

    @property
    def settings(self) -> Settings:
        return self.worker.settings


@pytest.fixture(scope="module")
def fleet(module_fleet_worker: WorkerFactory, tmp_path_factory: pytest.TempPathFactory) -> MatrixFleet:
    folder = tmp_path_factory.mktemp("matrix")  # the lab MCP server's reference data and config
    write_reference_data(folder / "data")
    config = write_config(folder, {"lab": stdio(LAB, "--data", str(folder / "data"))})
    env = {
        "SANDFLEET_MCP_CONFIG": str(config),
        "SANDFLEET_POLICY_NETWORKS": "none,restricted",
        "SANDFLEET_POLICY_ALLOW_HOSTS": ALLOWED_HOST,
    }
    worker = module_fleet_worker(
        "matrix", tools=ORDERS, env=env, concurrency=4, sandboxes=2, script=matrix_script()
    )
    return MatrixFleet(worker, worker.model)


def cli(fleet: MatrixFleet, *args: str) -> subprocess.CompletedProcess[str]:
    """``sandfleet ARGS`` as a user runs it, with the fleet's Redis and key prefix only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")}
    env |= {
        "SANDFLEET_REDIS_URL": fleet.settings.redis_url,
        "SANDFLEET_KEY_PREFIX": fleet.settings.key_prefix,
    }
    return subprocess.run([SANDFLEET, *args], env=env, capture_output=True, text=True, timeout=120)


def job_containers(job_id: str) -> list[str]:
    """Every container (running or not) labelled as the job's."""
    listed = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=sandfleet.job={job_id}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return listed.stdout.split()


def succeeded(fleet: MatrixFleet, job: JobHandle) -> Any:
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.SUCCEEDED, (result.error, fleet.worker.log()[-3000:])
    return result


# ---- MCP tool ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_an_mcp_servers_tool_answers_a_job_in_every_mode(fleet: MatrixFleet, mode: str) -> None:
    """The lab server's ``stats`` tool, named ``lab__stats``, is offered to the job and called on the
    host: from the sandboxed program (code-action), or as a function call of the tool-calling loop
    (shell, beside the sandbox tools; chat)."""
    job = fleet.client.submit(MCP_QUESTION, tools=["lab__stats"], model=fleet.model, mode=mode)
    result = succeeded(fleet, job)
    assert result.mode == mode and result.result == 3.0
    events = job.audit()
    if mode == "code-action":
        [tool_call] = [e for e in events if e.kind == AuditKind.TOOL_CALL]
        assert tool_call.data["tool"] == "lab__stats" and tool_call.data["ok"]
        assert tool_call.data["result"]["mean"] == 3.0
    else:
        calls = [c for turn in result.turns for c in turn.calls]
        assert calls[0].tool == "lab__stats" and calls[0].ok and calls[0].result["mean"] == 3.0
        [shown] = [
            e for e in events if e.kind == AuditKind.FUNCTION_RESULT and e.data["tool"] == "lab__stats"
        ]
        assert json.loads(shown.data["shown"])["mean"] == 3.0
    if mode == "shell":  # the MCP call ran beside the sandbox tools of the job's session
        assert [c.tool for c in calls] == ["lab__stats", "sandbox_exec"] and calls[1].ok
        [ran] = [
            e for e in events if e.kind == AuditKind.FUNCTION_RESULT and e.data["tool"] == "sandbox_exec"
        ]
        assert json.loads(ran.data["shown"])["stdout"].strip() == "3.0"  # computed in the session sandbox
        assert result.session is not None and result.session.ended == "the job ended"
    assert job.verify_audit() == (True, None)


# ---- cancel -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", TOOL_LOOP_MODES)
def test_a_tool_loop_job_is_cancelled_while_its_model_call_is_in_flight(
    fleet: MatrixFleet, mode: str
) -> None:
    """The model answers after 60 s; the cancel abandons the call and the job ends cancelled at once,
    with one signed final record (a shell job's session sandbox destroyed with it)."""
    job = fleet.client.submit(SLOW_QUESTION, model=fleet.model, mode=mode)
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while job.status() != JobStatus.RUNNING or (mode == "shell" and not job_containers(job.job_id)):
        assert time.monotonic() < deadline, f"the job never ran: {job.status()}"
        time.sleep(0.1)
    time.sleep(1.0)  # the model request on its way (answered after 60 s)
    began = time.monotonic()
    done = cli(fleet, "cancel", job.job_id)
    assert done.returncode == 0, (done.stdout, done.stderr, fleet.worker.log()[-3000:])
    assert f"job {job.job_id} was running: cancel requested" in done.stdout
    result = job.result(timeout=ENDED_WITHIN_S)  # verified against its chain
    assert time.monotonic() - began < ENDED_WITHIN_S
    assert result.status == JobStatus.CANCELLED and result.error is not None
    assert result.error.kind == "cancelled" and result.result is None
    finals = [
        e.data["status"]
        for e in job.audit()
        if e.kind == AuditKind.STATE and e.data["status"] not in ("queued", "running")
    ]
    assert finals == ["cancelled"]
    [event] = [e for e in job.audit() if e.kind == AuditKind.CANCEL]
    assert event.data["by"]
    if mode == "shell":
        assert job_containers(job.job_id) == []  # the session sandbox went with the job
    assert job.verify().holds
    assert fleet.worker.alive()


# ---- verify and replay ------------------------------------------------------------------------------


def tool_loop_job(fleet: MatrixFleet, mode: str) -> JobHandle:
    """A chat job on the reference question (the scripted chat agent's answer, from ``load_orders``),
    or a shell job that writes a file in its session sandbox (an artifact the chain commits to)."""
    if mode == "chat":
        return fleet.client.submit(REFERENCE_QUESTION, tools=["load_orders"], model=fleet.model, mode=mode)
    return fleet.client.submit(COUNT_QUESTION, model=fleet.model, mode=mode)


@pytest.mark.parametrize("mode", TOOL_LOOP_MODES)
def test_a_tool_loop_job_verifies_and_replay_says_there_is_no_program_to_rerun(
    fleet: MatrixFleet, mode: str
) -> None:
    job = tool_loop_job(fleet, mode)
    result = succeeded(fleet, job)
    assert result.result == (REFERENCE_CHAT_TOTALS if mode == "chat" else 3)
    if mode == "shell":
        assert [a.name for a in result.artifacts] == ["three.txt"] and job.artifact(
            "three.txt"
        ) == b"1\n2\n3\n"

    audited = cli(fleet, "audit", job.job_id, "--verify")
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert job.verify().verified and job.verify_audit() == (True, None)

    replayed = cli(fleet, "replay", job.job_id, "--json")
    outcome = json.loads(replayed.stdout)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr  # nothing failed: verified only
    assert outcome["state"] == "skipped" and outcome["verified"] is True and outcome["match"] is False
    assert f"a {mode} job has no program to re-run" in outcome["reason"]
    assert "verified only" in outcome["reason"]
    assert outcome["served"] == result.result
    shown = cli(fleet, "replay", job.job_id)
    assert shown.returncode == 0 and shown.stdout.startswith(f"skipped: a {mode} job has no program"), (
        shown.stdout
    )


@pytest.mark.parametrize("mode", TOOL_LOOP_MODES)
def test_a_forged_tool_loop_result_is_caught_by_verify_replay_and_the_client(
    fleet: MatrixFleet, mode: str
) -> None:
    job = tool_loop_job(fleet, mode)
    succeeded(fleet, job)
    r, key = fleet.client.redis, fleet.client.keys.job(job.job_id)
    original = r.hget(key, "result")
    assert original is not None
    forged = json.loads(original)
    forged["result"] = "a forged answer"
    r.hset(key, "result", json.dumps(forged))
    try:
        audited = cli(fleet, "audit", job.job_id, "--verify")
        replayed = cli(fleet, "replay", job.job_id, "--json")
        with pytest.raises(UnverifiedResultError, match=job.job_id):
            job.result(timeout=5)
    finally:
        r.hset(key, "result", original)
    assert audited.returncode == 1 and "field 'result'" in audited.stdout + audited.stderr, audited
    assert replayed.returncode == 1 and json.loads(replayed.stdout)["state"] == "unverified", replayed
    assert job.verify().verified  # restored


# ---- restricted network and artifacts: options of a sandbox, which a chat job does not have -----------


def test_a_chat_job_asking_for_a_restricted_network_runs_no_sandbox_and_records_the_option(
    fleet: MatrixFleet,
) -> None:
    """Chat runs no model code and no sandbox: its tools run on the worker host, as they do for a
    code-action job, and a sandbox's network never governed them. The option is checked against the
    operator's policy as in every mode, kept in the signed spec, and nothing is filtered or refused."""
    sandbox = {"network": "restricted", "allow_hosts": [ALLOWED_HOST]}
    job = fleet.client.submit(
        REFERENCE_QUESTION, tools=["load_orders"], model=fleet.model, mode="chat", sandbox=sandbox
    )
    result = succeeded(fleet, job)
    assert result.result == REFERENCE_CHAT_TOTALS and result.tool_calls == 1
    spec = job.record().spec
    assert spec is not None and spec.sandbox_config.network == "restricted"
    assert list(spec.sandbox_config.allow_hosts) == [ALLOWED_HOST]
    assert result.session is None and result.network_denied == [] and "network" not in result.limits_hit
    kinds = {e.kind for e in job.audit()}
    assert AuditKind.SESSION not in kinds and AuditKind.SANDBOX_RUN not in kinds
    assert job_containers(job.job_id) == []
    assert job.verify_audit() == (True, None)  # entry 0 commits to the spec, the option in it


@pytest.mark.parametrize("mode", MODES)
def test_a_network_beyond_the_operators_policy_is_refused_alike_in_every_mode(
    fleet: MatrixFleet, mode: str
) -> None:
    job = fleet.client.submit(
        REFERENCE_QUESTION, tools=["load_orders"], model=fleet.model, mode=mode, sandbox={"network": "full"}
    )
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.REFUSED and result.error is not None, result
    assert "sandbox network 'full' is not allowed" in result.error.message
    assert "SANDFLEET_POLICY_NETWORKS" in result.error.message
    kinds = [e.kind for e in job.audit()]
    assert AuditKind.MODEL_CALL not in kinds and AuditKind.SESSION not in kinds  # refused before anything ran
    wider = {"network": "restricted", "allow_hosts": ["elsewhere.matrix.test"]}
    job = fleet.client.submit(
        REFERENCE_QUESTION, tools=["load_orders"], model=fleet.model, mode=mode, sandbox=wider
    )
    result = job.result(timeout=JOB_TIMEOUT_S)
    assert result.status == JobStatus.REFUSED and result.error is not None, result
    assert "sandbox allow_hosts elsewhere.matrix.test is not allowed by the operator" in result.error.message


def test_a_chat_job_makes_no_files_and_its_artifact_caps_are_recorded(fleet: MatrixFleet) -> None:
    """Chat has no /workspace/out/ to collect: no artifacts, no artifacts event, the caps kept in the spec."""
    job = fleet.client.submit(
        REFERENCE_QUESTION,
        tools=["load_orders"],
        model=fleet.model,
        mode="chat",
        artifacts={"max_file_bytes": 1000},
    )
    result = succeeded(fleet, job)
    assert result.artifacts == [] and result.artifacts_skipped == [] and "artifacts" not in result.limits_hit
    spec = job.record().spec
    assert spec is not None and spec.artifacts.max_file_bytes == 1000
    assert AuditKind.ARTIFACTS not in {e.kind for e in job.audit()}
    listed = cli(fleet, "artifacts", job.job_id)
    assert listed.returncode == 0 and listed.stdout == "", listed
    assert f"job {job.job_id} has no artifacts" in listed.stderr
