"""Network "none" lets nothing out (network "restricted", the egress allow-list, is tested in tests/egress).

The only servers contacted are ones the tests start themselves: two on this machine's own Docker
bridge gateway address (port 80, allowed, and 8080, not allowed), one on an abstract Unix socket of
the host, one in another container on the bridge; no other address is ever tried.

Network "none" is asked of Docker as ``network_disabled`` (sandfleet/worker/sandbox/docker/spec.py), so these tests
check what a sandbox can reach and see from inside, never Docker's NetworkMode string: a network
namespace of its own (not the worker's, not another sandbox's), only ``lo``, no route through
anything else, no DNS, and neither the host nor other containers reachable.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sandfleet_testing import program

from sandfleet.core.config import SandboxConfig

from .helpers import plain_container_labels, skip_or_fail

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
    from sandfleet.worker.sandbox.docker.backend import docker_client

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


def test_none_reaches_neither(backend: str, open_session: Any, host_servers: dict[int, str]) -> None:
    outcome = fetch(open_session(backend), [host_servers[ALLOWED_PORT], host_servers[BLOCKED_PORT]])
    for url in host_servers.values():
        # runc: no interface but lo, ENETUNREACH; runsc: gVisor's own stack answers EHOSTUNREACH.
        assert isinstance(outcome[url], str), outcome[url]
        assert "Network is unreachable" in outcome[url] or "No route to host" in outcome[url], outcome[url]


def _sandbox_ids(labels: dict[str, str] | None = None) -> set[str]:
    from sandfleet.worker.sandbox.docker.backend import LABEL_ROLE, docker_client

    wanted = [LABEL_ROLE] + [f"{k}={v}" for k, v in (labels or {}).items()]
    return {c["Id"] for c in docker_client().api.containers(all=True, filters={"label": wanted})}


# ---- network "none", seen from inside ---------------------------------------------------------------

VIEW = program(
    """
    import errno, json, os, socket, sys

    def attempt(family, address):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.settimeout(3)
                s.connect(address)
            return "connected"
        except OSError as e:
            return errno.errorcode.get(e.errno, str(e))

    out = {"netns": os.readlink("/proc/self/ns/net"), "interfaces": sorted(os.listdir("/sys/class/net"))}
    out["ipv4_routes"] = open("/proc/net/route").read().splitlines()[1:]
    out["ipv6_route_interfaces"] = sorted({l.split()[-1] for l in open("/proc/net/ipv6_route") if l.strip()})
    try:
        out["dns"] = socket.getaddrinfo("pypi.sandfleet.invalid", 443)[0][4][0]
    except socket.gaierror as e:
        out["dns"] = f"gaierror {e.errno}"
    targets = json.loads(sys.argv[1])
    out["tcp"] = {f"{h}:{p}": attempt(socket.AF_INET, (h, p)) for h, p in targets.get("tcp", [])}
    out["abstract"] = {n: attempt(socket.AF_UNIX, "\\0" + n) for n in targets.get("abstract", [])}
    print(json.dumps(out))
    """
)
# Listens on the sandbox's own loopback (v4 and v6) and answers itself: loopback keeps working.
LOOPBACK_SERVER = program(
    """
    import socket
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family) as server:
            server.bind((host, 0))
            server.listen()
            with socket.create_connection(server.getsockname()[:2], timeout=3) as client:
                peer, _ = server.accept()
                client.sendall(b"ping")
                print(host, peer.recv(4).decode())
                peer.close()
    """
)


def view_of(session: Any, **targets: Any) -> dict[str, Any]:
    result = session.execute(["python3", "-c", VIEW, json.dumps(targets)], timeout=60)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_none_gives_each_sandbox_a_namespace_of_its_own_with_only_loopback(
    backend: str, open_session: Any
) -> None:
    """Two sandboxes at once: each sees only ``lo``, no IPv4 route, IPv6 routes on ``lo`` alone (runc)
    or none (gVisor's stack), in a namespace that is neither the worker's nor (runc) the other's."""
    first, second = open_session(backend), open_session(backend)
    views = [view_of(first), view_of(second)]
    worker_netns = os.readlink("/proc/self/ns/net")
    for view in views:
        assert view["interfaces"] == ["lo"], view
        assert view["ipv4_routes"] == [], view
        assert set(view["ipv6_route_interfaces"]) <= {"lo"}, view
        assert view["netns"] != worker_netns, view
    if backend == "docker":  # the host kernel's namespaces; gVisor numbers its own per sandbox
        assert views[0]["netns"] != views[1]["netns"], views
    for session in (first, second):  # the agent's own view, checked by the host at the start
        assert session.hello["network"]["interfaces"] == ["lo"]


# Listens on 127.0.0.1:4243 for a few seconds, then connects to itself: (bound at, ended at, self-check).
HOLD_PORT = program(
    """
    import socket, time
    with socket.create_server(("127.0.0.1", 4243)) as server:
        bound = time.time()
        time.sleep(4)
        with socket.create_connection(("127.0.0.1", 4243), timeout=3):
            print(bound, time.time(), "self-connected")
    """
)
# Tries 127.0.0.1:4243 every 0.2 s for 6 s: one "time outcome" line per try.
TRY_PORT = program(
    """
    import errno, socket, time
    end = time.time() + 6
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", 4243), timeout=1).close()
            print(time.time(), "connected")
        except OSError as e:
            print(time.time(), errno.errorcode.get(e.errno, str(e)))
        time.sleep(0.2)
    """
)


def test_none_loopback_is_the_sandboxs_own(backend: str, open_session: Any) -> None:
    """A server on one sandbox's loopback is not on another's, also under gVisor (whose namespace
    numbers cannot be compared across sandboxes); and loopback works inside, v4 and v6."""
    holder, prober = open_session(backend), open_session(backend)
    held: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: held.update(result=holder.execute(["python3", "-c", HOLD_PORT], timeout=30)),
        daemon=True,
    )
    thread.start()
    tries = prober.execute(["python3", "-c", TRY_PORT], timeout=30)
    thread.join(timeout=30)
    bound, ended, check = held["result"].stdout.split()
    assert check == "self-connected", held["result"].stderr
    outcomes = [line.split() for line in tries.stdout.splitlines()]
    while_held = [what for at, what in outcomes if float(bound) < float(at) < float(ended)]
    assert while_held and set(while_held) == {"ECONNREFUSED"}, (bound, ended, outcomes)
    answered = prober.execute(["python3", "-c", LOOPBACK_SERVER], timeout=30)
    assert answered.stdout.splitlines() == ["127.0.0.1 ping", "::1 ping"], answered.stderr


def test_none_has_no_dns(backend: str, open_session: Any) -> None:
    view = view_of(open_session(backend))
    # EAI_AGAIN (-3): no resolver reachable (only lo, no route). A resolver would have answered the
    # .invalid name with NXDOMAIN (EAI_NONAME, -2).
    assert view["dns"] == f"gaierror {socket.EAI_AGAIN}", view


def test_none_cannot_reach_the_hosts_abstract_unix_sockets(backend: str, open_session: Any) -> None:
    """Abstract Unix socket names belong to a network namespace: a host listener's is not in the sandbox's."""
    name = f"sandfleet-test-{uuid.uuid4().hex[:8]}"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("\0" + name)
        server.listen()
        with socket.socket(socket.AF_UNIX) as probe:  # the host itself reaches it
            probe.connect("\0" + name)
        view = view_of(open_session(backend), abstract=[name])
    assert view["abstract"] == {name: "ECONNREFUSED"}, view


@pytest.fixture
def bridged_server(docker_engine: Any) -> Iterator[tuple[str, int]]:
    """A plain container on Docker's default bridge serving HTTP on port 8000: (its address, port).

    Owned by this process (plain_container_labels): CI once saw it vanish (no answer, then 404 on
    removal) when it was ownerless and another module's worker reaped it. Started again (twice at
    most) when it still does not answer the host within 30 s."""
    from sandfleet.core.config import DEFAULT_IMAGE
    from sandfleet.worker.sandbox.docker.backend import docker_client

    client = docker_client()
    for tries_left in (2, 1, 0):
        container = client.containers.run(
            DEFAULT_IMAGE,
            ["python3", "-m", "http.server", "8000"],
            detach=True,
            network_mode="bridge",
            user="10001:10001",
            labels=plain_container_labels("test"),
        )
        try:
            if address := _answering_address(container):
                yield address, 8000
                return
        finally:
            _remove_quietly(container)
        assert tries_left, "the bridged server never answered the host"


def _answering_address(container: Any) -> str | None:
    """The container's bridge address once its server answers from the host; None after 30 s or if
    the container went away."""
    import docker.errors

    deadline = time.monotonic() + 30
    try:
        container.reload()
        address = container.attrs["NetworkSettings"]["IPAddress"]
    except docker.errors.NotFound:
        return None
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, 8000), timeout=1).close()
            return str(address)
        except OSError:
            time.sleep(0.1)
    return None


def _remove_quietly(container: Any) -> None:
    import docker.errors

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass


def test_none_cannot_reach_other_containers(
    backend: str, open_session: Any, bridged_server: tuple[str, int], gateway: str
) -> None:
    address, port = bridged_server
    view = view_of(open_session(backend), tcp=[[address, port], [gateway, 2375]])
    for target, outcome in view["tcp"].items():
        # runc: no interface but lo, ENETUNREACH; runsc: gVisor's own stack answers EHOSTUNREACH.
        assert outcome in ("ENETUNREACH", "EHOSTUNREACH"), (target, outcome)


def test_a_sandbox_that_sees_a_network_is_refused_as_none(open_session: Any) -> None:
    """The host's check at start (isolation.network_refusal) against a real view that has a network:
    a bridged sandbox's own report would be refused if it had been asked for as "none"."""
    from sandfleet.worker.sandbox.isolation import network_refusal

    bridged = open_session("docker", network="full")
    seen = bridged.hello["network"]
    assert "eth0" in seen["interfaces"]
    refusal = network_refusal(SandboxConfig(), seen)
    assert refusal is not None and "sees interfaces" in refusal
    assert network_refusal(SandboxConfig(network="full"), seen) is None
