"""Redis secured across hosts: ACL users per role (deploy/redis-acl.conf) and TLS (rediss:// + CA file).

The auditor's user reads records but cannot write (NOPERM), and the error says which user and
what to do; a TLS connection verifies the server against SANDFLEET_REDIS_CA_FILE and is refused
against another CA.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from sandfleet.core.errors import QueueUnavailableError
from sandfleet.core.queue import redis_errors
from sandfleet.core.redis_connect import connect
from sandfleet.core.settings import Settings
from sandfleet.fleet.local_redis import free_port
from sandfleet.fleet.redis_security import make_ca_and_cert

ACL_FILE = Path(__file__).resolve().parents[2] / "deploy" / "redis-acl.conf"


def acl_rules() -> dict[str, str]:
    """``user -> rules`` of the example file, passwords replaced by ``NAME-pw``."""
    rules = {}
    for line in ACL_FILE.read_text().splitlines():
        if line.startswith("user ") and not line.startswith("user default"):
            _, name, rest = line.split(" ", 2)
            rules[name] = rest.replace(f">{name.upper()}_PASSWORD", f">{name}-pw")
    return rules


def test_the_auditor_reads_but_cannot_write_and_is_told_so(redis_server: str) -> None:
    admin = redis.Redis.from_url(redis_server, decode_responses=True)
    for name, rules in acl_rules().items():
        admin.execute_command("ACL", "SETUSER", name, "reset", *rules.split())
    admin.hset("sandfleet:job:abc", mapping={"status": "succeeded"})
    port = admin.connection_pool.connection_kwargs["port"]
    url = f"redis://auditor:auditor-pw@127.0.0.1:{port}/0"
    auditor = connect(url, Settings())
    worker = connect(f"redis://worker:worker-pw@127.0.0.1:{port}/0", Settings())
    try:
        assert auditor.hget("sandfleet:job:abc", "status") == "succeeded"
        with pytest.raises(QueueUnavailableError) as caught, redis_errors(url):
            auditor.hset("sandfleet:job:abc", "status", "failed")
        message = str(caught.value)
        assert "NOPERM" in message and "auditor" in message and "redis-acl.conf" in message
        assert "auditor-pw" not in message
        worker.hset("sandfleet:job:abc", "worker", "w1")  # the worker's user may write
        assert admin.hget("sandfleet:job:abc", "status") == "succeeded"
    finally:
        for client in (auditor, worker, admin):
            client.close()
        admin = redis.Redis.from_url(redis_server)
        admin.execute_command("ACL", "DELUSER", *acl_rules())
        admin.delete("sandfleet:job:abc")
        admin.close()


@pytest.fixture
def tls_redis(tmp_path: Path, redis_binary: str) -> Iterator[tuple[int, Path, Path]]:
    """A redis-server speaking only TLS on a free port: ``(port, its CA, another CA)``."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test's CA (apt-get install openssl)")
    ca, cert, key = make_ca_and_cert(tmp_path, "fleet")
    other_ca, _, _ = make_ca_and_cert(tmp_path, "other")
    port = free_port()
    log = open(tmp_path / "redis-tls.log", "ab")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [
            "redis-server",
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            str(cert),
            "--tls-key-file",
            str(key),
            "--tls-ca-cert-file",
            str(ca),
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        probe = connect(f"rediss://127.0.0.1:{port}/0", Settings(redis_ca_file=str(ca)))
        for _ in range(100):
            try:
                probe.ping()
                break
            except redis.ConnectionError:
                assert process.poll() is None, (tmp_path / "redis-tls.log").read_text()
                time.sleep(0.05)
        probe.close()
        yield port, ca, other_ca
    finally:
        process.kill()
        process.wait()
        log.close()


def test_tls_verifies_the_server_against_the_ca_file(tls_redis: tuple[int, Path, Path]) -> None:
    port, ca, _other = tls_redis
    client = connect(f"rediss://127.0.0.1:{port}/0", Settings(redis_ca_file=str(ca)))
    try:
        client.set("tls", "yes")
        assert client.get("tls") == "yes"
    finally:
        client.close()


def test_tls_is_refused_against_another_ca(tls_redis: tuple[int, Path, Path]) -> None:
    port, _ca, other = tls_redis
    client = connect(f"rediss://127.0.0.1:{port}/0", Settings(redis_ca_file=str(other)))
    try:
        with pytest.raises(redis.ConnectionError) as caught:
            client.ping()
        assert "certificate verify failed" in str(caught.value)
    finally:
        client.close()


def test_plain_redis_to_a_tls_port_does_not_connect(tls_redis: tuple[int, Path, Path]) -> None:
    port, _ca, _other = tls_redis
    client = connect(f"redis://127.0.0.1:{port}/0", Settings(), socket_timeout=2.0)
    try:
        with pytest.raises(redis.RedisError):
            client.ping()
    finally:
        client.close()
