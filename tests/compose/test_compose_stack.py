"""docker-compose.yml: the file is valid and safe as written, and the stack, built from the local Debian
base with no registry, runs the reference scenario for real.

The stack test builds the images (minutes the first time; Docker's layer cache makes later runs fast),
brings the stack up under a project name of its own with Redis and Flower published on free localhost
ports, submits the reference question through the producer Client, checks the exact totals (under runc,
and under gVisor when the engine has runsc), Redis's durability settings and Flower's auth, then takes
the stack down with its volumes. Images are kept (tag ``test``) as the cache for the next run.

Environment it honours: SANDFLEET_BASE_IMAGE (default: the local base), SANDFLEET_BUILD_NETWORK
(``host`` where Docker's default bridge is unusable), SANDFLEET_EXTRA_CA_CERTS (default: the host's
/usr/local/share/ca-certificates/*.crt, for a TLS-inspecting proxy).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import yaml
from sandfleet_testing import skip_or_fail, wait_until
from sandfleet_testing.flower import get, lists_a_worker

from sandfleet.core.contracts import JobStatus
from sandfleet.core.settings import Settings
from sandfleet.fleet.local_redis import free_port
from sandfleet.producer.client import Client
from sandfleet.worker.tools.examples.scenario import REFERENCE_ANSWER, REFERENCE_QUESTION

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
REDIS_PASSWORD = "compose-test-pw"
FLOWER_AUTH = ("admin", "compose-test-flower")
IMAGE_TAG = "test"
UP_TIMEOUT_S = 1500  # a cold build downloads Debian packages and wheels
JOB_TIMEOUT_S = 180
PASSED_THROUGH = ("SANDFLEET_BASE_IMAGE", "SANDFLEET_BUILD_NETWORK", "SANDFLEET_EXTRA_CA_CERTS")


@pytest.fixture(scope="module")
def compose() -> list[str]:
    """The compose command: Debian's docker-compose (installed from apt when missing and root)."""
    found = shutil.which("docker-compose")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "docker-compose"]):
            subprocess.run(cmd, env=env, capture_output=True, timeout=900, check=False)
        found = shutil.which("docker-compose")
    if found is None:
        skip_or_fail("docker-compose is not installed (apt-get install docker-compose)")
    return [found, "-f", str(COMPOSE_FILE)]


def compose_env(**extra: str) -> dict[str, str]:
    """The environment compose interpolates: none of the caller's fleet settings, except the build ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDFLEET_", "OPENAI_", "COMPOSE_"))}
    env.update({k: os.environ[k] for k in PASSED_THROUGH if k in os.environ})
    return {**env, **extra}


def config(compose: list[str], **extra: str) -> dict:
    done = subprocess.run(
        [*compose, "config"], env=compose_env(**extra), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_config_is_valid(compose: list[str]) -> None:
    done = subprocess.run(
        [*compose, "config", "-q"], env=compose_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stdout, done.stderr


def test_services_and_their_safety(compose: list[str]) -> None:
    services = config(compose)["services"]
    assert set(services) == {"redis", "worker", "flower", "model"}
    for name, service in services.items():  # nothing is published beyond this host
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    worker, flower = services["worker"], services["flower"]
    assert any(str(v).startswith("/var/run/docker.sock:/var/run/docker.sock") for v in worker["volumes"])
    assert worker["environment"]["SANDFLEET_TOOLS"] == "sandfleet.worker.tools.examples.orders"
    assert worker["environment"]["SANDFLEET_REDIS_URL"] == "redis://:sandfleet-local@redis:6379/0"
    assert services["redis"]["environment"]["REDIS_PASSWORD"] == "sandfleet-local"
    # Flower listens on every interface of its container, so it must have (and does) basic auth.
    assert "0.0.0.0" in flower["command"] and flower["environment"]["SANDFLEET_FLOWER_AUTH"]
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    # A job's replay:FILE reaches only the demo's scripts, the folder the model server's script is in.
    scripts = worker["environment"]["SANDFLEET_REPLAY_SCRIPTS_DIR"]
    assert scripts == "/opt/sandfleet-demo" and f"{scripts}/replay.json" in services["model"]["command"]


def test_base_image_is_chosen_by_one_variable(compose: list[str]) -> None:
    local = config(compose)["services"]
    assert local["redis"]["build"]["args"]["BASE_IMAGE"] == "sandfleet/base:bookworm"
    assert local["model"]["build"]["args"]["BASE_IMAGE"] == "sandfleet/base:bookworm"
    assert local["model"]["build"]["dockerfile"] == "deploy/images/worker/Dockerfile"
    public = config(compose, SANDFLEET_BASE_IMAGE="python:3.11-slim")["services"]
    assert public["redis"]["build"]["args"]["BASE_IMAGE"] == "python:3.11-slim"
    assert public["model"]["build"]["args"]["BASE_IMAGE"] == "python:3.11-slim"


def test_the_other_services_use_the_image_the_model_service_builds(compose: list[str]) -> None:
    """One build of the worker image: ``up`` readies images in dependency order, model first."""
    services = config(compose)["services"]
    image = services["model"]["image"]
    assert services["worker"]["image"] == services["flower"]["image"] == image
    assert "build" not in services["worker"] and "build" not in services["flower"]
    assert "model" in services["worker"]["depends_on"] and "worker" in services["flower"]["depends_on"]


# ---- the stack, for real -------------------------------------------------------------------------


def default_bridge_problem() -> str | None:
    """Why builds on Docker's default bridge cannot work here, or None."""
    if os.environ.get("SANDFLEET_BUILD_NETWORK"):
        return None
    done = subprocess.run(
        [
            "docker",
            "network",
            "inspect",
            "bridge",
            "--format",
            '{{index .Options "com.docker.network.bridge.name"}}',
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    name = done.stdout.strip() or "docker0"
    if done.returncode == 0 and not Path(f"/sys/class/net/{name}").exists():
        return (
            f"Docker's default bridge interface {name} is missing on this host, so build steps cannot reach "
            f"the network: restart dockerd, or set SANDFLEET_BUILD_NETWORK=host"
        )
    return None


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    redis_url: str
    flower_url: str


@pytest.fixture(scope="module")
def stack(compose: list[str], docker_engine) -> Iterator[Stack]:  # type: ignore[no-untyped-def]
    if problem := default_bridge_problem():
        pytest.fail(problem, pytrace=False)
    project = f"sfcomposetest{uuid.uuid4().hex[:8]}"
    redis_port, flower_port = free_port(), free_port()
    extra = {
        "SANDFLEET_IMAGE_TAG": IMAGE_TAG,
        "SANDFLEET_REDIS_PASSWORD": REDIS_PASSWORD,
        "SANDFLEET_FLOWER_AUTH": ":".join(FLOWER_AUTH),
        "SANDFLEET_COMPOSE_REDIS_PORT": str(redis_port),
        "SANDFLEET_COMPOSE_FLOWER_PORT": str(flower_port),
    }
    if "SANDFLEET_EXTRA_CA_CERTS" not in os.environ and LOCAL_CA_DIR.is_dir():
        extra["SANDFLEET_EXTRA_CA_CERTS"] = "".join(p.read_text() for p in sorted(LOCAL_CA_DIR.glob("*.crt")))
    env = compose_env(**extra)
    cmd = [*compose, "-p", project]
    worker_ids: list[str] = []
    try:
        began = time.monotonic()
        up = subprocess.run(
            [*cmd, "up", "-d", "--build"], env=env, capture_output=True, text=True, timeout=UP_TIMEOUT_S
        )
        assert up.returncode == 0, (up.stdout + up.stderr)[-6000:]
        print(f"compose up --build took {time.monotonic() - began:.1f} s")
        ids = subprocess.run(
            [*cmd, "ps", "-q", "worker"], env=env, capture_output=True, text=True, timeout=60
        )
        worker_ids = ids.stdout.split()
        yield Stack(
            project,
            env,
            f"redis://:{REDIS_PASSWORD}@127.0.0.1:{redis_port}/0",
            f"http://127.0.0.1:{flower_port}",
        )
    finally:
        logs = subprocess.run(
            [*cmd, "logs", "--tail", "40"], env=env, capture_output=True, text=True, timeout=60
        )
        down = subprocess.run(
            [*cmd, "down", "-v", "--remove-orphans", "-t", "60"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert down.returncode == 0, down.stderr[-3000:] + "\n" + logs.stdout[-4000:]
        # The worker drained its sandbox pool on the way down: no container of it is left.
        if worker_ids:
            hosts = {worker_id[:12] for worker_id in worker_ids}
            listed = subprocess.run(
                [
                    "docker",
                    "ps",
                    "-a",
                    "--filter",
                    "label=sandfleet.role",
                    "--format",
                    '{{.Label "sandfleet.owner"}}',
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            left = [owner for owner in listed.stdout.split() if owner.split(":")[0] in hosts]
            assert not left, f"sandboxes left by the compose worker: {left}"


@pytest.mark.slow
@pytest.mark.timeout(UP_TIMEOUT_S + 600)
def test_stack_runs_the_reference_scenario(stack: Stack, docker_engine) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(redis_url=stack.redis_url, key_prefix="sandfleet")
    backends = ["docker"] + (["gvisor"] if "runsc" in docker_engine.runtimes else [])
    # Flower learns a task's name and arguments from its task-received event only, and events are not
    # kept: jobs submitted before its receiver listens show as nameless. A worker listed from events
    # (its heartbeats, every 2 s) shows it listens; a worker is ready in ~0.4 s since mingle is off.
    assert wait_until(lambda: lists_a_worker(stack.flower_url, FLOWER_AUTH), 90, every_s=0.5), (
        "Flower never listed the worker"
    )
    with Client(settings=settings) as client:
        jobs = {
            b: client.submit(REFERENCE_QUESTION, tools=["load_orders"], sandbox={"backend": b})
            for b in backends
        }
        for backend, job in jobs.items():
            result = job.result(timeout=JOB_TIMEOUT_S)
            assert result.status == JobStatus.SUCCEEDED, (backend, result.error)
            assert result.result == REFERENCE_ANSWER, backend
            assert list(result.result.items()) == list(REFERENCE_ANSWER.items())  # highest first
            assert job.verify_audit() == (True, None)
            runs = [e.data for e in job.audit() if e.kind == "sandbox_run"]
            want = "runsc" if backend == "gvisor" else "runc"
            assert runs and runs[-1]["runtime"] == want, (backend, runs)
            tool_calls = [e.data for e in job.audit() if e.kind == "tool_call"]
            assert tool_calls and tool_calls[0]["tool"] == "load_orders" and tool_calls[0]["ok"]

    # Redis: a password, AOF on, no eviction.
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(stack.redis_url.replace(f":{REDIS_PASSWORD}@", "")).ping()
    r = redis.Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        assert r.config_get("appendonly")["appendonly"] == "yes"
        assert r.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    finally:
        r.close()

    # Flower: basic auth, and the job's task among those it saw finish.
    assert get(stack.flower_url + "/tasks", None)[0] == 401
    deadline = time.monotonic() + 30
    while True:
        status, body = get(stack.flower_url + "/api/tasks", FLOWER_AUTH)
        tasks = json.loads(body or b"{}") if status == 200 else {}
        seen = {backend: tasks.get(job.job_id, {}).get("state") for backend, job in jobs.items()}
        if all(state == "SUCCESS" for state in seen.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert all(state == "SUCCESS" for state in seen.values()), (status, seen)
    task = tasks[jobs["docker"].job_id]
    assert task["name"] == "sandfleet.run_job" and "revenue per region" in task["args"]
