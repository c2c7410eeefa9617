"""Network "restricted" lets only DNS and HTTP(S) out; "none" lets nothing out.

The only servers contacted are two the test starts itself, on this machine's own Docker bridge
gateway address (port 80, allowed, and 8080, not allowed); no other address is ever tried.
"restricted" is runc only: under gVisor the sandbox refuses it, which is tested too.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import SandboxError

from .helpers import TEST_LABELS, skip_or_fail

pytestmark = pytest.mark.docker

ALLOWED_PORT, BLOCKED_PORT = 80, 8080
FETCH = """
import json, sys, urllib.request
outcome = {}
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            outcome[url] = [answer.status, answer.read().decode()]
    except Exception as e:
        outcome[url] = f"{type(e).__name__}: {e}"
print(json.dumps(outcome))
"""


class Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"sandfleet test server on port {self.server.server_address[1]}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def bridge_gateway() -> str:
    """The host's address on Docker's default bridge (IPAM Gateway, else the subnet's first host)."""
    from sandfleet.worker.sandbox.engine import docker_client

    config = docker_client().networks.get("bridge").attrs["IPAM"]["Config"][0]
    if config.get("Gateway"):
        return str(config["Gateway"])
    return str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


@pytest.fixture(scope="module")
def gateway(docker_engine: Any) -> str:
    """The bridge gateway address, when the host really has it (else no bridged container can start)."""
    address = bridge_gateway()
    try:
        with socket.socket() as probe:
            probe.bind((address, 0))
    except OSError as e:
        skip_or_fail(
            f"Docker's bridge gateway {address} is not on this host ({e}); is docker0 gone? "
            "restarting dockerd recreates it"
        )
    return address


@pytest.fixture(scope="module")
def host_servers(gateway: str) -> Iterator[dict[int, str]]:
    """HTTP servers on the bridge gateway, ports 80 and 8080: {port: url}. Stopped after the module."""
    servers = []
    try:
        for port in (ALLOWED_PORT, BLOCKED_PORT):
            try:
                server = ThreadingHTTPServer((gateway, port), Hello)
            except OSError as e:
                skip_or_fail(f"cannot serve on {gateway}:{port}: {e}")
            servers.append(server)
            threading.Thread(target=server.serve_forever, name=f"http-{port}", daemon=True).start()
        yield {port: f"http://{gateway}:{port}/" for port in (ALLOWED_PORT, BLOCKED_PORT)}
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def fetch(session: Any, urls: list[str]) -> dict[str, Any]:
    result = session.execute(["python3", "-c", FETCH, *urls], timeout=30)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_restricted_reaches_port_80_but_not_8080(open_session: Any, host_servers: dict[int, str]) -> None:
    session = open_session("docker", network="restricted")
    outcome = fetch(session, [host_servers[ALLOWED_PORT], host_servers[BLOCKED_PORT]])
    assert outcome[host_servers[ALLOWED_PORT]] == [200, "sandfleet test server on port 80"]
    blocked = outcome[host_servers[BLOCKED_PORT]]
    assert isinstance(blocked, str) and ("timed out" in blocked or "refused" in blocked.lower()), blocked


def test_restricted_filter_cannot_be_undone_from_inside(gateway: str, open_session: Any) -> None:
    session = open_session("docker", network="restricted")
    program = (
        "import socket\n"
        "try:\n"
        "    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)\n"
        "    print('raw socket')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    assert session.execute(["python3", "-c", program]).stdout == "refused 1\n"  # EPERM: no CAP_NET_RAW/ADMIN
    status = session.execute(["python3", "-c", "print(open('/proc/self/status').read())"]).stdout
    assert int(dict(line.split(":\t") for line in status.splitlines() if ":\t" in line)["CapEff"], 16) == 0


def test_none_reaches_neither(backend: str, open_session: Any, host_servers: dict[int, str]) -> None:
    outcome = fetch(open_session(backend), [host_servers[ALLOWED_PORT], host_servers[BLOCKED_PORT]])
    for url in host_servers.values():
        # runc: no interface but lo, ENETUNREACH; runsc: gVisor's own stack answers EHOSTUNREACH.
        assert isinstance(outcome[url], str), outcome[url]
        assert "Network is unreachable" in outcome[url] or "No route to host" in outcome[url], outcome[url]


def test_gvisor_refuses_restricted(docker_engine: Any) -> None:
    from sandfleet.worker.sandbox.manager import SandboxManager

    config = SandboxConfig(backend="gvisor", network="restricted")
    if config.docker_runtime not in docker_engine.runtimes:
        skip_or_fail(f"{config.docker_runtime} is not registered")
    before = _sandbox_ids()
    with SandboxManager(config) as manager, pytest.raises(SandboxError) as caught:
        manager.create_session(labels=TEST_LABELS)
    assert str(caught.value) == (
        "network 'restricted' is not supported under gVisor: its filter cannot be installed from the host; "
        "use network 'none' or the runc runtime"
    )
    assert _sandbox_ids(TEST_LABELS) <= before


def _sandbox_ids(labels: dict[str, str] | None = None) -> set[str]:
    from sandfleet.worker.sandbox.engine import LABEL_ROLE, docker_client

    wanted = [LABEL_ROLE] + [f"{k}={v}" for k, v in (labels or {}).items()]
    return {c["Id"] for c in docker_client().api.containers(all=True, filters={"label": wanted})}
