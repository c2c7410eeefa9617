"""Shell-mode jobs through the engine: the replay model (real HTTP, real openai client) drives the five
sandbox tools and the job's own tools on one session sandbox, made at the start and destroyed at the
end; a sandbox killed mid-job is reported to the model and the job still ends; the reaper knows
session sandboxes."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandfleet.core.config import SandboxConfig
from sandfleet.core.contracts import AuditKind, JobSpec, JobStatus
from sandfleet.worker.engine import EngineServices, ListAudit, run_job
from sandfleet.worker.llm.scripted.script import parse_script
from sandfleet.worker.llm.scripted.server import ReplayServer
from sandfleet.worker.sandbox.backends import backend_named
from sandfleet.worker.sandbox.docker import reaper
from sandfleet.worker.sandbox.docker.backend import docker_client
from sandfleet.worker.sandbox.docker.labels import LABEL_EXPIRES, LABEL_JOB, LABEL_ROLE, ROLE_SESSION
from sandfleet.worker.sandbox.pool import SandboxPool
from sandfleet.worker.tools.examples.scenario import (
    REFERENCE_ANSWER,
    REFERENCE_QUESTION,
    generate_orders,
    write_reference_data,
)
from sandfleet.worker.tools.registry import ToolRegistry

from .helpers import gone, session_containers, shell_settings

COMPUTE = """\
import csv, json
from collections import defaultdict
totals = defaultdict(float)
for row in csv.DictReader(open("orders.csv")):
    if "2026-07-01" <= row["date"] <= "2026-09-30":
        totals[row["region"]] += int(row["quantity"]) * float(row["unit_price"])
print(json.dumps(dict(sorted(totals.items(), key=lambda kv: -kv[1]))))
"""


@pytest.fixture
def services(docker_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineServices]:
    write_reference_data(tmp_path / "data")
    monkeypatch.setenv("SANDFLEET_DATA_DIR", str(tmp_path / "data"))
    registry = ToolRegistry.from_modules(["sandfleet.worker.tools.examples.orders"])
    with EngineServices(
        shell_settings(model_max_retries=0), SandboxPool(pool_size=0, max_live=1), registry
    ) as s:
        yield s


@pytest.fixture
def replay() -> Iterator[Callable[[list[Any]], ReplayServer]]:
    servers: list[ReplayServer] = []

    def start(responses: list[Any]) -> ReplayServer:
        server = ReplayServer(parse_script({"rules": [{"match": ".", "responses": responses}]}))
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def orders_csv() -> str:
    out = io.StringIO()
    rows = generate_orders()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def shell_job(backend: str, **fields: Any) -> JobSpec:
    return JobSpec(
        question=REFERENCE_QUESTION,
        mode="shell",
        tools=["load_orders"],
        model="openai:replay",
        sandbox={"backend": backend},
        **fields,
    )


def test_a_shell_job_computes_in_its_session_sandbox(
    services: EngineServices, replay: Callable[..., ReplayServer], backend: str
) -> None:
    server = replay(
        [
            call("load_orders"),  # a host tool, as in chat mode
            call("sandbox_write_file", path="orders.csv", content=orders_csv()),
            call("sandbox_write_file", path="q3.py", content=COMPUTE),
            call("sandbox_exec", command="python3 q3.py", timeout=30),
            f"RESULT: {json.dumps(REFERENCE_ANSWER)}",
        ]
    )
    audit = ListAudit()
    job_id = f"shell-{uuid.uuid4().hex[:8]}"
    result = run_job(shell_job(backend), job_id, services=services, audit=audit, base_url=server.base_url)

    assert result.status == JobStatus.SUCCEEDED and result.mode == "shell" and result.tool_calls == 4
    # The sandbox really computed the totals: the command's output, as the model was shown it.
    exec_call = result.turns[3].calls[0]
    assert exec_call.tool == "sandbox_exec" and exec_call.ok
    assert json.loads(exec_call.result["stdout"]) == REFERENCE_ANSWER
    assert result.turns[0].calls[0].result_size > 40_000  # load_orders ran on the host
    session = result.session
    assert session is not None and session.ended == "the job ended"
    assert session.runtime == ("runsc" if backend == "gvisor" else "runc")
    assert gone(session.container_id) and session_containers(job_id) == []
    events = [(kind, data.get("event")) for kind, _, data in audit.events if kind == AuditKind.SESSION]
    assert events == [(AuditKind.SESSION, "started"), (AuditKind.SESSION, "destroyed")]
    system = next(d for k, _, d in audit.events if k == AuditKind.MODEL_CALL)["messages"][0]["content"]
    assert "Linux sandbox of your own" in system and "no network" in system


def test_a_sandbox_killed_mid_job_is_reported_to_the_model_and_the_job_ends(
    services: EngineServices, replay: Callable[..., ReplayServer]
) -> None:
    server = replay(
        [
            call("sandbox_exec", command="sleep 60", timeout=60),
            call("sandbox_exec", command="echo again"),
            "The sandbox died, so I cannot say.\nRESULT: null",
        ]
    )
    job_id = f"shell-{uuid.uuid4().hex[:8]}"

    def kill_when_started() -> None:
        deadline = time.monotonic() + 60
        while not (ids := session_containers(job_id)) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        subprocess.run(["docker", "kill", *ids], capture_output=True, timeout=60)

    killer = threading.Thread(target=kill_when_started)
    killer.start()
    audit = ListAudit()
    result = run_job(shell_job("docker"), job_id, services=services, audit=audit, base_url=server.base_url)
    killer.join()

    assert result.status == JobStatus.SUCCEEDED and result.result is None
    died, again = (turn.calls[0] for turn in result.turns[:2])
    assert died.error_type == "SessionGoneError" and "killed" in died.error
    assert again.error_type == "SessionGoneError" and "Its files are lost" in again.error
    assert "killed" in result.session.ended and session_containers(job_id) == []
    shown = [d["shown"] for k, _, d in audit.events if k == AuditKind.FUNCTION_RESULT]
    assert shown[0].startswith("SessionGoneError: the session sandbox was killed")


def test_a_job_tool_named_like_a_sandbox_tool_is_refused(services: EngineServices) -> None:
    def sandbox_exec(command: str) -> str:
        """A host tool that would shadow the sandbox's."""
        return command

    clashing = EngineServices(services.settings, services.pool, ToolRegistry.from_functions([sandbox_exec]))
    spec = JobSpec(question="q", mode="shell", tools=["sandbox_exec"], model="openai:replay")
    result = run_job(spec, "clash", services=clashing, audit=ListAudit(), base_url="http://127.0.0.1:9/v1")
    assert result.status == JobStatus.REFUSED and "name of a shell-mode sandbox tool" in result.error.message


def test_the_reaper_removes_a_session_past_its_lifetime_whoever_owns_it(docker_engine: Any) -> None:
    """A stuck job's session (its owner, this process, alive) goes once its sandfleet.expires passes."""
    tag = f"reaper-{uuid.uuid4().hex[:8]}"
    past = backend_named().start(
        SandboxConfig(),
        labels={
            LABEL_ROLE: ROLE_SESSION,
            LABEL_JOB: tag,
            LABEL_EXPIRES: f"{time.time() - 1:.0f}",
        },
    )
    future = backend_named().start(
        SandboxConfig(),
        labels={
            LABEL_ROLE: ROLE_SESSION,
            LABEL_JOB: tag,
            LABEL_EXPIRES: f"{time.time() + 600:.0f}",
        },
    )
    client = docker_client()

    class OnlyOurs:  # prune sees only this test's containers on the shared engine
        api = client.api

        class containers:
            @staticmethod
            def list(**kwargs: Any) -> list[Any]:
                return client.containers.list(
                    all=True, filters={"label": f"{LABEL_JOB}={tag}"}, ignore_removed=True
                )

    try:
        report = reaper.prune(client=OnlyOurs)  # type: ignore[arg-type]
        assert report.removed == [past.id] and report.kept == [future.id]
        assert gone(past.id)
    finally:
        past.destroy()
        future.destroy()
