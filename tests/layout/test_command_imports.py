"""Which heavy packages each ``sandfleet`` command loads, run for real in a fresh interpreter.

A command's start-up is its imports: the MCP SDK alone cost ``sandfleet run`` ~2 s with no MCP server
configured (issue 25), pydantic and redis cost ``--help`` hundreds of ms before (issue 12). Each case
runs the command as the console script does and records, as the interpreter exits, the top-level
packages in ``sys.modules``; a package a command does not use must not be among them. What a command
really needs (the Docker SDK for a sandbox, redis for a job) is allowed, so this fails on a new
import nobody meant, not on the work itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

THIN_CLIENT = "sandfleet.worker.sandbox.docker.engine_api"
# What the worker extra and the producer's heavier layers bring (import names).
HEAVY = {
    "mcp",
    "mcp_types",
    "openai",
    "httpx",
    "anyio",
    "docker",
    "requests",
    "urllib3",
    "celery",
    "kombu",
    "pydantic",
    "pydantic_settings",
    "redis",
    "cryptography",
    "jsonschema",
    "re2",
    "prometheus_client",
    "psutil",
    # Sandfleet's own heavy layer a run with network "none" does not use: the egress gateway (the
    # settings, the proxy, the filter); its refusal counts are in sandfleet/worker/egress/refusals.py.
    "sandfleet.worker.egress.gateway",
    # The thin engine client: only commands that run a sandbox load it (and they then need no SDK).
    THIN_CLIENT,
}
# Runs the command as `sandfleet ARGS...` would and prints, at exit, the heavy packages (top-level
# names) and heavy modules (dotted names) it loaded.
PROBE = (
    "import atexit, json, sys\n"
    "heavy = set(json.loads(sys.argv[1]))\n"
    "atexit.register(lambda: print('LOADED=' + json.dumps(sorted(({m.split('.')[0] for m in sys.modules} | set(sys.modules)) & heavy)),"
    " file=sys.stderr))\n"
    "from sandfleet.cli import main\n"
    "main(sys.argv[2:], prog_name='sandfleet')\n"
)
WORKER_ONLY = {"mcp", "mcp_types", "openai", "httpx", "anyio", "docker", "requests", "jsonschema", "re2"}
NO_TASKS = {"celery", "kombu", "prometheus_client", "psutil"}  # the worker process's own


def loaded_by(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> set[str]:
    """The heavy packages `sandfleet ARGS...` had loaded when it exited (its exit code is not checked:
    a failing command's imports are guarded as well)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(sorted(HEAVY)), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
    lines = [line for line in done.stderr.splitlines() if line.startswith("LOADED=")]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    return set(json.loads(lines[-1].removeprefix("LOADED=")))


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["submit", "--help"],
        ["result", "--help"],
        ["sandbox", "run", "--help"],
        ["jobs", "--help"],
    ],
)
def test_help_loads_no_heavy_package(args: list[str], tmp_path: Path) -> None:
    assert loaded_by(args, tmp_path) == set()


@pytest.mark.parametrize(
    ("args", "celery"),
    [(["submit", "what is 2 + 2?"], {"celery", "kombu"}), (["result", "job-that-does-not-exist"], set())],
)
def test_producer_commands_load_no_worker_package(
    args: list[str], celery: set[str], tmp_path: Path, redis_server: str
) -> None:
    """``submit`` enqueues through Celery's ``send_task``; ``result`` reads Redis and needs no Celery."""
    env = {"SANDFLEET_REDIS_URL": redis_server, "SANDFLEET_KEY_PREFIX": f"cli-imports-{tmp_path.name}"}
    loaded = loaded_by(args, tmp_path, env)
    assert "redis" in loaded  # the command really ran (it talked to Redis)
    assert loaded & (WORKER_ONLY | NO_TASKS) == celery


def test_sandbox_run_loads_only_pydantic_and_the_thin_client(tmp_path: Path, docker_engine: Any) -> None:
    """A local engine is reached without the Docker SDK, requests and urllib3 (~60 ms, issue 25)."""
    loaded = loaded_by(["sandbox", "run", "--", "true"], tmp_path)
    assert THIN_CLIENT in loaded  # the command really ran a sandbox
    assert loaded == {THIN_CLIENT, "pydantic"}


def test_run_without_mcp_servers_loads_no_mcp_or_docker_sdk(tmp_path: Path, docker_engine: Any) -> None:
    program = tmp_path / "prog.py"
    program.write_text('print("RESULT: 1")\n')
    env = {"SANDFLEET_MCP_CONFIG": "", "SANDFLEET_TOOLS": ""}
    loaded = loaded_by(["run", str(program)], tmp_path, env)
    assert THIN_CLIENT in loaded  # the program really ran
    assert loaded == {THIN_CLIENT, "pydantic", "pydantic_settings"}


def test_sandbox_run_on_an_engine_over_tcp_uses_the_sdk(tmp_path: Path, docker_engine: Any) -> None:
    """Only unix sockets are the thin client's: any other DOCKER_HOST goes through the SDK (which here
    finds no engine: nothing listens on the discard port)."""
    loaded = loaded_by(["sandbox", "run", "--", "true"], tmp_path, {"DOCKER_HOST": "tcp://127.0.0.1:9"})
    assert {"docker", "requests"} <= loaded


# Runs `sandfleet worker ARGS...` until it is ready (its WorkerState started: signing key, heartbeat,
# recovery sweeps), then prints the heavy packages loaded by then and stops the worker (SIGTERM: a
# warm shutdown). What the first job loads (the engine, the model client, the MCP SDK) is not counted.
WORKER_PROBE = (
    "import json, os, signal, sys\n"
    "heavy = set(json.loads(sys.argv[1]))\n"
    "from sandfleet.worker.delivery import state\n"
    "start = state.WorkerState.start\n"
    "def ready(self, name):\n"
    "    start(self, name)\n"
    "    loaded = ({m.split('.')[0] for m in sys.modules} | set(sys.modules)) & heavy\n"
    "    print('LOADED=' + json.dumps(sorted(loaded)), file=sys.stderr, flush=True)\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "state.WorkerState.start = ready\n"
    "from sandfleet.cli import main\n"
    "main(sys.argv[2:], prog_name='sandfleet')\n"
)
# What a worker with no MCP config, no metrics port and no job yet must not pay for: the job's own
# layers (model client, MCP SDK, egress gateway), the metrics, and Celery's command line with its
# plugins (Flower with tornado, click-repl with prompt_toolkit; issue 25).
WORKER_UNUSED = {
    "mcp",
    "mcp_types",
    "openai",
    "httpx",
    "anyio",
    "jsonschema",
    "re2",
    "prometheus_client",
    "flower",
    "tornado",
    "prompt_toolkit",
    "click_repl",
    "pygments",
    "matplotlib",
    "pandas",
    "numpy",
    "sandfleet.worker.mcp",
    "sandfleet.worker.egress.gateway",
}


def worker_loaded(cwd: Path, redis_url: str, env: dict[str, str]) -> set[str]:
    """The packages of WORKER_UNUSED a real ``sandfleet worker`` had loaded once ready."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")},
        "SANDFLEET_REDIS_URL": redis_url,
        "SANDFLEET_KEY_PREFIX": f"worker-imports-{cwd.name}",
        "SANDFLEET_WORKER_STATE_DIR": str(cwd / "worker-state"),
        "SANDFLEET_POOL_SIZE": "0",
        **env,
    }
    args = [sys.executable, "-c", WORKER_PROBE, json.dumps(sorted(WORKER_UNUSED)), "worker", "-c", "1"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    lines = [line for line in done.stderr.splitlines() if "LOADED=" in line]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    return set(json.loads(lines[-1].partition("LOADED=")[2]))


def test_worker_start_up_loads_no_unused_package(tmp_path: Path, redis_server: str) -> None:
    """A worker pays at start-up only for what it uses before its first job."""
    assert worker_loaded(tmp_path, redis_server, {}) == set()


def test_worker_with_a_metrics_port_loads_prometheus_client(tmp_path: Path, redis_server: str) -> None:
    """The metrics are still there when asked for (and the probe above can see a package loaded)."""
    from sandfleet.fleet.local_redis import free_port

    loaded = worker_loaded(tmp_path, redis_server, {"SANDFLEET_METRICS_PORT": str(free_port())})
    assert loaded == {"prometheus_client"}
