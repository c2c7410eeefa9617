"""What the engine tests share: settings, tool modules, programs as the model would write them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from sandfleet_testing import skip_or_fail as skip_or_fail

from sandfleet.core.contracts import JobResult, JobSpec
from sandfleet.core.settings import Settings

IN_CI = bool(os.environ.get("CI"))
HERE = Path(__file__).resolve().parent
INJECTED_TOOLS = str(HERE / "injected_tools.py")
TOOL_MODULES = [
    "sandfleet.worker.tools.examples.orders",
    "sandfleet.worker.tools.examples.files",
    "sandfleet.worker.tools.examples.side",
    INJECTED_TOOLS,
]
# The replay server answers "openai:<anything>" at its base URL; the id sent is "replay".
REPLAY_MODEL = "openai:replay"


def owner_label(pid: int | None = None) -> str:
    """The ``sandfleet.owner`` label value of containers started by process ``pid`` (default: this one)."""
    from sandfleet.worker.sandbox.docker.spec import Owner, process_start_ticks

    if pid is None:
        return Owner.current().label()
    return Owner(socket.gethostname(), pid, process_start_ticks(pid) or 0).label()


def containers_of_this_process() -> list[str]:
    """Names of existing containers this test process started (other people's runs share the engine)."""
    proc = subprocess.run(
        [
            "docker",
            "ps",
            "-a",
            "--filter",
            f"label=sandfleet.owner={owner_label()}",
            "--format",
            "{{.Names}}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return proc.stdout.split()


def engine_settings(**overrides: Any) -> Settings:
    """Settings built explicitly: no key, no base URL, one model retry, the default operator policy."""
    fields: dict[str, Any] = {
        "model_api_key": None,
        "model_base_url": None,
        "model_request_timeout_s": 10.0,
        "model_max_retries": 1,
        "pool_size": 0,
        "max_sandboxes": 2,
        "policy_networks": "none",
    }
    fields.update(overrides)
    return Settings(**fields)


def python_block(source: str, prose: str = "Here is the program.") -> str:
    """A model reply: a line of prose, then the program in one ```python block."""
    return f"{prose}\n\n```python\n{textwrap.dedent(source).strip()}\n```\n"


def job(question: str, *, tools: list[str] | None = None, **fields: Any) -> JobSpec:
    """A JobSpec for the replay model; ``code_action`` may be given as a dict."""
    return JobSpec(question=question, tools=tools or [], model=REPLAY_MODEL, **fields)


def run(spec: JobSpec, services: Any, server: Any, audit: Any = None, job_id: str = "test-job") -> JobResult:
    """``run_job`` against a replay server, through the real openai client."""
    from sandfleet.worker.engine import NullAudit, run_job

    return run_job(spec, job_id, services=services, audit=audit or NullAudit(), base_url=server.base_url)


def model_requests(audit: Any) -> list[list[dict[str, str]]]:
    """The messages of each model call as the audit recorded them (the first call: all of them)."""
    return [data["messages"] for kind, _attempt, data in audit.events if kind == "model_call"]


SANDFLEET = Path(sys.executable).parent / "sandfleet"
CLI_TIMEOUT_S = 120.0
EVENTS_SETTLE_S = 0.5


def sandfleet_ask(
    *args: str, env: dict[str, str], verbose: bool = False, timeout: float = CLI_TIMEOUT_S
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """Run ``sandfleet [-vv] ask ARGS`` in a subprocess; return it and the containers it created.

    The containers are the engine's create events, watched live while the command runs (the engine's
    event backlog is short), kept when their owner label (host:pid:start) names the command's process:
    other people's runs on a shared engine do not count.
    """
    watcher = subprocess.Popen(
        [
            "docker", "events", "--filter", "type=container", "--filter", "event=create",
            "--filter", "label=sandfleet.role", "--format", "{{json .}}",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        time.sleep(EVENTS_SETTLE_S)  # the subscription is in place before the command starts
        process = subprocess.Popen(
            [str(SANDFLEET), *(["-vv"] if verbose else []), "ask", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
        time.sleep(EVENTS_SETTLE_S)  # events of the command's last moments arrive
    finally:
        watcher.terminate()
        events, _ = watcher.communicate(timeout=10)
    completed = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    prefix = f"{socket.gethostname()}:{process.pid}:"
    found = [json.loads(line) for line in events.splitlines() if line.strip()]
    created = [e for e in found if e["Actor"]["Attributes"].get("sandfleet.owner", "").startswith(prefix)]
    return completed, created


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any model key or endpoint, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "SANDFLEET_"))}
    env.update(extra)
    return env
