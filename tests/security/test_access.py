"""Access: Redis with a password, Flower with basic auth, and neither reachable from inside a sandbox.

Everything for real: our own password-protected ``redis-server`` listening on 0.0.0.0, a real
``sandfleet worker`` and Client on it, the shipped docker-compose.yml through ``docker-compose config``,
a real ``sandfleet flower`` process on 0.0.0.0, and programs in real sandboxes (runc and runsc) trying to
connect to both ports on every address of this host a container could route to.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from sandfleet_testing.workers import WorkerFactory, fleet_settings_for, stop_worker

from sandfleet.core.contracts import JobStatus
from sandfleet.core.errors import QueueUnavailableError
from sandfleet.core.settings import Settings
from sandfleet.producer.client import Client

from .helpers import REPO, free_port, program, record, skip_or_fail

PASSWORD = "access-test-Pw-91f3"
FLOWER_AUTH = "ops:flower-Pw-27ac"
SANDFLEET = str(Path(sys.executable).with_name("sandfleet"))
START_TIMEOUT_S = 30.0


@dataclass
class Listener:
    port: int
    process: subprocess.Popen[bytes]

    def url(self, password: str | None = PASSWORD) -> str:
        auth = f":{password}@" if password is not None else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"


def wait_for_port(port: int, process: subprocess.Popen[Any], what: str, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{what} did not come up on port {port}")
            time.sleep(0.05)


def stop(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def protected_redis(tmp_path_factory: pytest.TempPathFactory, redis_binary: str) -> Iterator[Listener]:
    """Our own redis-server with --requirepass, on 0.0.0.0 (as a careless operator might bind it)."""
    port = free_port()
    folder = tmp_path_factory.mktemp("protected-redis")
    cmd = ["redis-server", "--bind", "0.0.0.0", "--port", str(port), "--requirepass", PASSWORD,
           "--save", "", "--appendonly", "no", "--dir", str(folder)]  # fmt: skip
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process, "redis-server")
        yield Listener(port, process)
    finally:
        stop(process)


def fleet_settings(url: str) -> Settings:
    return fleet_settings_for(url)


# ---- Redis: the password is required, and the producer and the worker pass it ---------------------------


def test_a_client_and_a_worker_with_the_password_run_a_job(
    protected_redis: Listener, fleet_worker: WorkerFactory
) -> None:
    script = {"rules": [], "default": ["```python\nprint('RESULT: ' + str(6 * 7))\n```"]}
    worker = fleet_worker(
        "worker", redis_url=protected_redis.url(), sandboxes=1, concurrency=2, script=script
    )
    try:
        job = worker.client.submit({"question": "What is six times seven?", "model": worker.model})
        result = job.result(timeout=90)
    finally:
        stop_worker(worker)  # its whole log, shutdown included, is read below
    assert result.status == JobStatus.SUCCEEDED and result.result == 42, result.error
    assert PASSWORD not in worker.log(), "the worker's log shows the Redis password"
    record("access: client and worker with the Redis password", "redis", True, "job succeeded")


@pytest.mark.parametrize(
    "password, words",
    [
        (None, "authentication failed: it requires a password and none was given"),
        ("wrong-password", "authentication failed: wrong password"),
    ],
)
def test_a_client_without_the_password_gets_a_clear_error(
    protected_redis: Listener, password: str | None, words: str
) -> None:
    settings = fleet_settings(protected_redis.url(password))
    with Client(settings=settings) as client:
        with pytest.raises(QueueUnavailableError) as caught:
            client.submit("Who am I?")
        with pytest.raises(QueueUnavailableError):
            client.get("0b5e0bde-6d9e-4d1e-9c57-3f3b2b3c1a11").status()
    message = str(caught.value)
    assert "refused the credentials" in message and words in message, message
    assert "SANDFLEET_REDIS_URL" in message and "cannot reach" not in message
    assert PASSWORD not in message and (password is None or password not in message), "password echoed"
    r = redis.Redis.from_url(protected_redis.url())
    assert r.keys(f"{settings.key_prefix}*") == [], "something was written without the password"
    r.close()
    record(f"access: Redis, {'no' if password is None else 'wrong'} password", "redis", True, message)


# ---- the shipped compose stack --------------------------------------------------------------------------

COMPOSE_FILE = REPO / "docker-compose.yml"


def compose_config(**env: str) -> dict[str, Any]:
    found = shutil.which("docker-compose")
    if found is None:
        skip_or_fail("docker-compose is not installed")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SANDFLEET_", "OPENAI_", "COMPOSE_"))}
    done = subprocess.run(
        [found, "-f", str(COMPOSE_FILE), "config"],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_compose_requires_a_redis_password_and_flower_auth() -> None:
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    dockerfile = (REPO / "deploy/images/redis/Dockerfile").read_text()
    assert "${REDIS_PASSWORD:?" in dockerfile and '--requirepass "$REDIS_PASSWORD"' in dockerfile
    assert raw["services"]["redis"]["environment"]["REDIS_PASSWORD"]

    for env, password, auth in (
        ({}, "sandfleet-local", "admin:sandfleet-local"),
        ({"SANDFLEET_REDIS_PASSWORD": "s3cret", "SANDFLEET_FLOWER_AUTH": "me:pw"}, "s3cret", "me:pw"),
        # Empty values fall back to the defaults (`:-`): neither can be switched off by an empty variable.
        (
            {"SANDFLEET_REDIS_PASSWORD": "", "SANDFLEET_FLOWER_AUTH": ""},
            "sandfleet-local",
            "admin:sandfleet-local",
        ),
    ):
        services = compose_config(**env)["services"]
        assert services["redis"]["environment"]["REDIS_PASSWORD"] == password
        for name in ("worker", "flower"):
            assert services[name]["environment"]["SANDFLEET_REDIS_URL"] == f"redis://:{password}@redis:6379/0"
        flower = services["flower"]
        assert flower["environment"]["SANDFLEET_FLOWER_AUTH"] == auth
        assert "--address" in flower["command"] and "0.0.0.0" in flower["command"]
        for service in services.values():  # published on this host's loopback only
            for port in service.get("ports", []):
                assert (
                    port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
                ) == "127.0.0.1"
    record(
        "access: docker-compose.yml requires a Redis password and Flower auth",
        "compose",
        True,
        "config checked",
    )


# ---- Flower: auth beyond localhost ----------------------------------------------------------------------


def flower_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SANDFLEET_", "FLOWER_"))}
    return {**env, "SANDFLEET_REDIS_URL": url}


def test_flower_on_every_interface_without_auth_refuses_to_start(protected_redis: Listener) -> None:
    done = subprocess.run(
        [SANDFLEET, "flower", "--address", "0.0.0.0", "--port", str(free_port())],
        env=flower_env(protected_redis.url()),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "refusing to start Flower on 0.0.0.0 without a password" in done.stderr, done.stderr
    assert "--basic-auth USER:PASS" in done.stderr
    record("access: Flower on 0.0.0.0 without auth", "flower", True, f"exit {done.returncode}: refused")


@pytest.fixture(scope="module")
def flower(protected_redis: Listener, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """``sandfleet flower --address 0.0.0.0 --basic-auth ...`` on a free port; its port."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("flower") / "flower.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [SANDFLEET, "flower", "--address", "0.0.0.0", "--port", str(port), "--basic-auth", FLOWER_AUTH],
            env=flower_env(protected_redis.url()),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_port(port, process, f"flower ({log_path.read_text(errors='replace')[-2000:]})")
        yield port
    finally:
        stop(process)


def http_status(url: str, auth: str | None = None) -> int:
    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_flower_with_basic_auth_starts_and_asks_for_it(flower: int) -> None:
    url = f"http://127.0.0.1:{flower}/"
    assert http_status(url) == 401
    assert http_status(url, "ops:wrong") == 401
    assert http_status(url, FLOWER_AUTH) == 200
    record(
        "access: Flower on 0.0.0.0 with --basic-auth",
        "flower",
        True,
        "401 without or with a wrong password, 200 with it",
    )


# ---- from inside a sandbox: neither port is reachable -----------------------------------------------------


def host_addresses() -> list[str]:
    """The docker bridge gateways and this host's other IPv4 addresses (loopback aside)."""
    found: set[str] = set()
    out = subprocess.run(
        ["docker", "network", "inspect", "bridge", "--format", "{{range .IPAM.Config}}{{.Gateway}} {{end}}"],
        capture_output=True,
        text=True,
    ).stdout
    found.update(out.split())
    for line in subprocess.run(
        ["ip", "-4", "-o", "addr"], capture_output=True, text=True
    ).stdout.splitlines():
        parts = line.split()
        if parts[1] != "lo" and "inet" in parts:
            found.add(parts[parts.index("inet") + 1].split("/")[0])
    return sorted(found)


PROBE = program(
    """
    import json, socket
    out = {}
    for host, port in TARGETS:
        try:
            socket.create_connection((host, port), timeout=3).close()
            out[f"{host}:{port}"] = "connected"
        except OSError as e:
            out[f"{host}:{port}"] = type(e).__name__ + ": " + (e.strerror or str(e))
    print("RESULT: " + json.dumps(out))
    """
)


def test_neither_redis_nor_flower_is_reachable_from_a_sandbox(
    runtime: str, run: Callable[..., Any], protected_redis: Listener, flower: int
) -> None:
    targets = [(host, port) for host in host_addresses() for port in (protected_redis.port, flower)]
    targets += [("127.0.0.1", protected_redis.port), ("127.0.0.1", flower)]
    assert "172.17.0.1" in {h for h, _p in targets}, "no docker bridge gateway found"
    for host, port in targets:  # from the host, each listener answers on each of these addresses
        socket.create_connection((host, port), timeout=3).close()

    done = run(f"TARGETS = {targets!r}\n" + PROBE, runtime)

    assert done.ok, (done.failure(), done.stderr)
    reached = {target: outcome for target, outcome in done.result.items() if outcome == "connected"}
    assert reached == {}, reached
    record(
        "access: Redis and Flower from inside a sandbox (network none)",
        runtime,
        True,
        done.result,
    )
