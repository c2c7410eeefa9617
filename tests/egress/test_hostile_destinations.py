"""An allowed name is not an allowed destination: hostile jobs through a real worker, runc and gVisor.

Every name these jobs use is on their allow-list (``*.dst.invalid`` on one port) and resolves,
through the proxy's hosts file or the test's own DNS server, to an internal address: this machine's
loopback, the run's link-local "metadata" address and a private one (tests/owned_targets.py),
Docker's bridge gateway, the egress network's own gateway, the host's main address, IPv4-mapped
IPv6 forms, an answer that mixes an allowed address with 127.0.0.1, an IPv6-only ::1, an allowed
IPv4 address beside an IPv6 ::1 (Squid's happy eyeballs could pick either). Each is tried
as plain HTTP through the proxy and as a CONNECT followed by a TLS ClientHello. Each must be refused
by the proxy's destination rule (a 403 page naming it; a CONNECT closed before its "200"), the job's
network denials must name the rule and the category, and nothing may arrive: listeners on every one
of those addresses and the run's packet counters see nothing. The one address the settings list
(SANDFLEET_EGRESS_ALLOW_DESTINATIONS, ``listed.dst.invalid``) is reached, by both methods: the switch.

DNS rebinding (slow: Squid keeps an answer at least 60 s): a name first answers the listed address,
so the CONNECT passes the rule; the program waits past the answer's life, and only then sends its
ClientHello; Squid resolves the name again for the connection and gets the link-local address. Its
``dst`` ACL does not look a name up twice for one request, so the refusal is the host kernel's
(network.py's destination filter on Squid's marked connections), recorded from Squid's log.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sandbox.helpers import BACKENDS
from sandfleet_testing.workers import FleetWorker, WorkerFactory
from security.helpers import record

from sandfleet.core.contracts import JobStatus

from .destination_names import DESTINATION_DOMAIN

PROBE = r"""
import json, os, socket, ssl, time, urllib.error, urllib.request

PROXY_HOST, PROXY_PORT = os.environ["HTTPS_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
TLS = ssl.create_default_context()
TLS.check_hostname, TLS.verify_mode = False, ssl.CERT_NONE  # the listeners speak no TLS: only the hello counts


def plain(name):
    try:
        with urllib.request.urlopen(f"http://{name}:{PORT}/probe", timeout=15) as reply:
            return {"status": reply.status}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "body": e.read().decode(errors="replace")[:600]}
    except Exception as e:
        return {"error": type(e).__name__, "text": str(e)[:200]}


def connect(name, wait=0.0):
    try:
        s = socket.create_connection((PROXY_HOST, int(PROXY_PORT)), timeout=15 + wait)
    except Exception as e:
        return {"error": type(e).__name__, "text": str(e)[:200]}
    try:
        s.sendall(f"CONNECT {name}:{PORT} HTTP/1.1\r\nHost: {name}:{PORT}\r\n\r\n".encode())
        reply = s.recv(4096).decode(errors="replace")
        out = {"connect_reply": reply.split("\r\n", 1)[0]}
        if reply.startswith("HTTP/1.1 200"):
            time.sleep(wait)
            try:
                TLS.wrap_socket(s, server_hostname=name)
                out["then"] = "handshake completed"
            except Exception as e:
                out["then"] = type(e).__name__
        return out
    except Exception as e:
        return {"error": type(e).__name__, "text": str(e)[:200]}
    finally:
        s.close()
"""
PROBE_ALL = (
    PROBE
    + """
out = {name: {"http": plain(name), "connect": connect(name)} for name in NAMES}
print("RESULT: " + json.dumps(out))
"""
)
REBIND = (
    PROBE
    + """
out = connect(NAME, wait=WAIT_S)
time.sleep(0.5)
print("RESULT: " + json.dumps(out))
"""
)
PROBE_QUESTION = "Probe the internal destinations"
REBIND_QUESTION = "Rebind a name"
REBIND_WAIT_S = 63  # past Squid's shortest life of an answer (negative_dns_ttl, 60 s, whole seconds)


@dataclass
class PortListener:
    """TCP listeners on one port of several addresses: who came, and their first bytes."""

    port: int
    addresses: list[str]
    arrived: list[tuple[str, bytes]] = field(default_factory=list)
    _sockets: list[socket.socket] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> PortListener:
        for address in sorted(set(self.addresses)):
            sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, self.port))
            sock.listen(16)
            self._sockets.append(sock)
            thread = threading.Thread(target=self._serve, args=(sock, address), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _serve(self, sock: socket.socket, address: str) -> None:
        while True:
            try:
                conn, _peer = sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            try:
                data = conn.recv(2048)
            except OSError:
                data = b""
            conn.close()
            self.arrived.append((address, data))

    def at(self, address: str) -> list[bytes]:
        return [data for where, data in self.arrived if where == address]

    def stop(self) -> None:
        for sock in self._sockets:
            sock.close()


@dataclass
class DestinationFleet:
    """One real worker for these jobs, the listeners, and the addresses behind the names."""

    worker: FleetWorker
    model: str
    names: dict[str, str]  # name -> the address it resolves to (the first refused one of an answer)
    listener: PortListener
    owned: Any
    dns: Any
    port: int

    def run(self, question: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The question's job under each runtime, submitted at once: (results by backend, what
        reached the run's owned addresses meanwhile)."""
        mark = self.owned.mark()
        sandbox = {"network": "restricted", "allow_hosts": [f"*.{DESTINATION_DOMAIN}:{self.port}"]}
        jobs = {
            backend: self.worker.client.submit(
                f"{question} ({backend})", model=self.model, sandbox={**sandbox, "backend": backend}
            )
            for backend in BACKENDS
        }
        results = {backend: job.result(timeout=300) for backend, job in jobs.items()}
        for backend, result in results.items():
            assert result.status == JobStatus.SUCCEEDED, (
                f"{backend}: {result.error} {self.worker.log()[-3000:]}"
            )
        return results, self.owned.arrived_since(mark)


def dns_names(owned: Any) -> dict[str, list[str]]:
    """Names only the test's DNS server answers: several addresses at once, IPv6 alone."""
    return {
        f"multi.{DESTINATION_DOMAIN}": [owned.private_b, "127.0.0.1"],
        f"v6-loopback.{DESTINATION_DOMAIN}": ["::1"],
        f"dual-stack.{DESTINATION_DOMAIN}": [owned.private_b, "::1"],  # happy eyeballs may pick either
    }


def replay_script(port: int, names: list[str]) -> dict[str, Any]:
    def fenced(source: str) -> str:
        return "```python\n" + source + "```"

    rules = []
    for backend in BACKENDS:
        probe = f"NAMES = {names!r}\nPORT = {port}\n" + PROBE_ALL
        rules.append({"match": re.escape(f"{PROBE_QUESTION} ({backend})"), "responses": [fenced(probe)]})
        rebind = f"NAME = {rebind_name(backend)!r}\nPORT = {port}\nWAIT_S = {REBIND_WAIT_S}\n" + REBIND
        rules.append({"match": re.escape(f"{REBIND_QUESTION} ({backend})"), "responses": [fenced(rebind)]})
    return {"rules": rules}


def rebind_name(backend: str) -> str:
    return f"rebind-{backend}.{DESTINATION_DOMAIN}"


@pytest.fixture(scope="module")
def fleet(
    egress_env: dict[str, Any],
    owned_targets: Any,
    module_fleet_worker: WorkerFactory,
) -> Iterator[DestinationFleet]:
    """A real worker (four sandboxes: both runtimes' jobs at once), the test DNS server's names, and
    listeners on the destination port of every address a name points at."""
    from sandfleet.worker.egress.gateway import egress_gateway
    from sandfleet.worker.sandbox.docker.backend import docker_client

    egress_gateway().prepare(docker_client())  # the egress network's gateway address exists from here
    port = egress_env["dst_port"]
    dns = egress_env["dns"]
    names = dict(egress_env["destinations"])
    for name, addresses in dns_names(owned_targets).items():
        dns.set(name, *addresses)
        names[name] = next(a for a in addresses if a != owned_targets.private_b)
    for backend in BACKENDS:  # first the listed address (the rule passes it), then the link-local one
        dns.set_sequence(rebind_name(backend), [owned_targets.private_b], [owned_targets.link_local])
    addresses = {a.removeprefix("::ffff:") for a in names.values()} | set(owned_targets.targets.values())
    listener = PortListener(port, sorted(addresses)).start()
    try:
        worker = module_fleet_worker(
            "destinations", env=egress_env["env"], sandboxes=4, script=replay_script(port, sorted(names))
        )
        yield DestinationFleet(worker, worker.model, names, listener, owned_targets, dns, port)
    finally:
        listener.stop()


@pytest.fixture(scope="module")
def probes(fleet: DestinationFleet) -> tuple[dict[str, Any], dict[str, Any]]:
    return fleet.run(PROBE_QUESTION)


@pytest.fixture(scope="module")
def rebinds(fleet: DestinationFleet) -> tuple[dict[str, Any], dict[str, Any]]:
    return fleet.run(REBIND_QUESTION)


LISTED = f"listed.{DESTINATION_DOMAIN}"
# name -> the category its refusal must name (destinations.py's labels); None: the settings allow it
CATEGORY = {
    f"loopback.{DESTINATION_DOMAIN}": "a loopback address",
    f"metadata.{DESTINATION_DOMAIN}": "a link-local address",
    f"private.{DESTINATION_DOMAIN}": "a private address",
    f"docker-gateway.{DESTINATION_DOMAIN}": "a private address",
    f"egress-gateway.{DESTINATION_DOMAIN}": "a private address",
    f"host.{DESTINATION_DOMAIN}": "",  # this host's main address: whichever category holds it
    f"mapped-loopback.{DESTINATION_DOMAIN}": "a loopback address",
    f"mapped-metadata.{DESTINATION_DOMAIN}": "a link-local address",
    f"multi.{DESTINATION_DOMAIN}": "a loopback address",
    f"v6-loopback.{DESTINATION_DOMAIN}": "a loopback address",
    f"dual-stack.{DESTINATION_DOMAIN}": "a loopback address",
}


def refused_by_the_rule(outcome: dict[str, Any]) -> bool:
    """Plain HTTP: Squid's 403 page with the helper's message; CONNECT: closed before any reply."""
    http, tunnel = outcome["http"], outcome["connect"]
    page = http.get("status") == 403 and "destination rule" in http.get("body", "")
    closed = tunnel.get("connect_reply") == "" or tunnel.get("error") == "ConnectionResetError"
    return page and closed


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CATEGORY))
def test_an_allowed_name_that_resolves_inside_is_refused_by_the_destination_rule(
    fleet: DestinationFleet, probes: tuple[dict[str, Any], dict[str, Any]], backend: str, name: str
) -> None:
    results, arrived = probes
    result = results[backend]
    outcome = result.result[name]
    denials = [d for d in result.network_denied if d.host == name]
    category = CATEGORY[name]
    address = fleet.names[name].removeprefix("::ffff:")
    heard = fleet.listener.at(address) if address != fleet.owned.private_b else []
    mentioned = [data for _where, data in fleet.listener.arrived if name.encode() in data]
    ok = (
        refused_by_the_rule(outcome)
        and {d.method for d in denials} == {"GET", "CONNECT"}
        and all(
            d.port == fleet.port and "(destination rule)" in d.reason and category in d.reason
            for d in denials
        )
        and heard == []
        and mentioned == []
        and address not in arrived.get("packets", {})
    )
    detail = {
        "outcome": outcome,
        "denials": [d.model_dump(exclude_none=True) for d in denials],
        "heard": heard,
    }
    runtime = result.attempts[0].runtime
    record(f"egress destination: {name.split('.')[0]} ({category or 'host'})", runtime, ok, detail)
    assert ok, (detail, mentioned, arrived)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_address_the_operator_lists_is_reached(
    fleet: DestinationFleet, probes: tuple[dict[str, Any], dict[str, Any]], backend: str
) -> None:
    """The switch: the same kind of private address, listed in SANDFLEET_EGRESS_ALLOW_DESTINATIONS."""
    result = probes[0][backend]
    outcome = result.result[LISTED]
    got = [data for data in fleet.listener.at(fleet.owned.private_b) if LISTED.encode() in data]
    assert outcome["connect"].get("connect_reply", "").startswith("HTTP/1.1 200"), outcome
    assert any(data.startswith(b"GET /probe") for data in got), (got, outcome)  # plain HTTP arrived
    assert any(data[:1] == b"\x16" for data in got), (got, outcome)  # the ClientHello (SNI: the name)
    assert not [d for d in result.network_denied if d.host == LISTED], result.network_denied


def test_nothing_arrived_anywhere_else(
    fleet: DestinationFleet, probes: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    """Of everything that arrived at a listener or a counted address, only the listed address's."""
    private_b = fleet.owned.private_b
    elsewhere = [(where, data[:80]) for where, data in fleet.listener.arrived if where != private_b]
    assert elsewhere == []
    assert set(probes[1].get("packets", {})) <= {private_b}, probes[1]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_name_rebound_after_the_check_is_refused_by_the_hosts_destination_filter(
    fleet: DestinationFleet, rebinds: tuple[dict[str, Any], dict[str, Any]], backend: str
) -> None:
    results, arrived = rebinds
    result = results[backend]
    outcome = result.result
    name = rebind_name(backend)
    denials = [d for d in result.network_denied if d.host == name]
    link_local = fleet.owned.link_local
    queries = sum(1 for asked, kind in fleet.dns.queries if asked == name and kind == 1)  # A queries
    ok = (
        outcome.get("connect_reply", "").startswith("HTTP/1.1 200")  # the first answer passed the rule
        and outcome.get("then") not in (None, "handshake completed")
        and queries >= 2  # Squid did ask again, for the connection
        and len(denials) == 1
        and "refused by the host's destination filter" in denials[0].reason
        and f"connection to {link_local} (a link-local address" in denials[0].reason
        and fleet.listener.at(link_local) == []
        and not [data for data in fleet.listener.arrived if name.encode() in data]
        and link_local not in arrived.get("packets", {})
    )
    detail = {
        "outcome": outcome,
        "denials": [d.model_dump(exclude_none=True) for d in denials],
        "a_queries": queries,
    }
    record("egress destination: DNS rebinding after the check", result.attempts[0].runtime, ok, detail)
    assert ok, detail
