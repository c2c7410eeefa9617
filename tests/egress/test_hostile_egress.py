"""Hostile programs against network "restricted", under runc and gVisor, each refused by a named mechanism.

The only servers contacted are the test's own: an HTTPS service in a network namespace this test
creates (its own CA; names the proxy resolves from a test hosts file), a listener in a second
sandbox, and whatever the host has on its gateway addresses. Each attack's outcome must be the error
its mechanism gives, and for network-level refusals the sandbox filter's rule that refused it must
have counted the packet (worker/egress/network.py); proxy refusals must be in the run's denials.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from sandbox.helpers import BACKENDS, TEST_LABELS
from security.helpers import record

from sandfleet.core.config import SandboxConfig

from .attacks import ATTACKS

pytestmark = pytest.mark.docker

LISTENER = (
    "import socket,time\n"
    "s=socket.create_server(('0.0.0.0',8000));s.settimeout(6)\n"
    "try:\n c,_=s.accept();print('ACCEPTED')\nexcept Exception as e:print('no one came',e)\n"
)

# Locally made UDP rejected by an OUTPUT rule fails its send with EPERM (the kernel's answer to a
# verdict on its own packet), under runc and under gVisor's host network alike.
# The sandbox filter's rules (iptables -S form), named by what they refuse.
REJECT_TCP = "iptables -A OUTPUT -p tcp -j REJECT --reject-with tcp-reset"
REJECT_OTHER = "iptables -A OUTPUT -j REJECT --reject-with icmp-port-unreachable"
REJECT_DOCKER_DNS_UDP = "iptables -A OUTPUT -d 127.0.0.11/32 -j REJECT --reject-with icmp-port-unreachable"


def refused(errno_name: str) -> Any:
    return lambda o: o.get("errno") == errno_name


def closed_by_proxy(o: dict[str, Any]) -> bool:  # Squid closed the CONNECT before its 200
    return (
        "Remote end closed connection without response" in o.get("text", "") or o.get("connect_reply") == ""
    )


def tls_terminated(o: dict[str, Any]) -> bool:
    return o.get("error") in ("SSLEOFError", "SSLError", "ConnectionResetError", "SSLZeroReturnError")


# case -> (check of the program's outcome, mechanism, proxy reason the denials must hold or None)
EXPECTED: dict[str, tuple[Any, str, str | None]] = {
    "name not in the allow-list": (closed_by_proxy, "proxy: CONNECT target name", "not in the allow-list"),
    "IP literal through the proxy": (closed_by_proxy, "proxy: names only", "IP addresses are not allowed"),
    "IP literal directly": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "redirect to a disallowed name": (closed_by_proxy, "proxy: CONNECT target name", "not in the allow-list"),
    "plain HTTP to an allowed name on port 80": (
        lambda o: o.get("status") == 403 and "sandfleet egress refused" in o.get("body", ""),
        "proxy: port of the name (403 page)",
        "port 80 is not allowed",
    ),
    "CONNECT to port 22 of an allowed name": (
        lambda o: o.get("connect_reply", None) == "" or closed_by_proxy(o) or o.get("errno") == "ECONNRESET",
        "proxy: port of the name",
        "port 22 is not allowed",
    ),
    "SNI differs from the CONNECT target": (
        tls_terminated,
        "proxy: TLS SNI vs CONNECT target",
        "does not match",
    ),
    "non-TLS bytes through an allowed CONNECT": (
        lambda o: "then" in o and "HTTP/1.1 200" in o.get("connect_reply", "") and "hello" not in o["then"],
        "proxy: on_unsupported_protocol respond (not TLS)",
        None,
    ),
    "DNS lookup": (lambda o: o.get("error") == "gaierror", "sandbox filter: 127.0.0.11 rejected", None),
    "DNS tunnel to Docker's resolver (127.0.0.11)": (
        refused("EPERM"),
        "sandbox filter: 127.0.0.11 rejected",
        None,
    ),
    "DNS tunnel to 1.1.1.1:53 (UDP)": (refused("EPERM"), "sandbox filter: ICMP port unreachable", None),
    "DNS over TCP to 1.1.1.1:53": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "UDP to the gateway": (refused("EPERM"), "sandbox filter: ICMP port unreachable", None),
    "IPv6 (2606:4700:4700::1111)": (
        lambda o: o.get("errno") in ("ENETUNREACH", "ECONNREFUSED", "EADDRNOTAVAIL", "EHOSTUNREACH"),
        "no IPv6 route; ip6tables reject",
        None,
    ),
    "host gateway, SSH port": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "host gateway, Redis port": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "Docker bridge gateway, Redis port": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "Docker API over TCP (2375)": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "cloud metadata 169.254.169.254": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "another sandbox": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
}


def docker_gateway() -> str:
    from sandfleet.worker.sandbox.engine import docker_client

    return str(docker_client().networks.get("bridge").attrs["IPAM"]["Config"][0].get("Gateway", "172.17.0.1"))


@pytest.fixture(scope="module", params=BACKENDS)
def hostile_run(request: pytest.FixtureRequest, egress_env: dict[str, Any], service: Any) -> dict[str, Any]:
    """The hostile program's outcome in one sandbox per runtime, with its denials and rule counters."""
    from sandfleet.worker.egress.gateway import egress_gateway
    from sandfleet.worker.egress.network import rule_counters
    from sandfleet.worker.sandbox.manager import SandboxManager

    config = SandboxConfig(backend=request.param, network="restricted", allow_hosts=["api.egress.test"])
    gateway = egress_gateway()
    with SandboxManager(config) as manager, SandboxManager(config) as other_manager:
        attacker = manager.create_session(labels=TEST_LABELS)
        other = other_manager.create_session(labels=TEST_LABELS)
        other_ip = other._container.handle.egress.address
        heard: dict[str, Any] = {}
        listener = threading.Thread(
            target=lambda: heard.update(out=other.execute(["python3", "-c", LISTENER], timeout=40))
        )
        listener.start()
        time.sleep(1.0)
        lease = attacker._container.handle.egress
        before = rule_counters(lease.pid)
        prelude = (
            f"CA={service.ca.read_text()!r}\nPROXY=({gateway.network.gateway!r},{gateway.network.proxy_port})\n"
            f"GATEWAY={gateway.network.gateway!r}\nDOCKER_GATEWAY={docker_gateway()!r}\n"
            f"SERVICE_IP={service.address!r}\nOTHER_SANDBOX={other_ip!r}\n"
        )
        done = attacker.execute(["python3", "-c", prelude + ATTACKS], timeout=120)
        after = rule_counters(lease.pid)
        denials = lease.take_denials()
        listener.join(30)
    assert done.exit_code == 0, done.stderr
    counted = {rule: after.get(rule, 0) - before.get(rule, 0) for rule in after}
    return {
        "runtime": config.docker_runtime,
        "outcome": json.loads(done.stdout),
        "denials": denials,
        "counted": counted,
        "listener": heard.get("out").stdout if heard.get("out") else None,
    }


def test_the_allowed_name_is_reached(hostile_run: dict[str, Any]) -> None:
    assert hostile_run["outcome"]["allowed name"] == {
        "status": 200,
        "body": "hello from api.egress.test on port 443",
    }


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_attack_is_refused_by_its_mechanism(hostile_run: dict[str, Any], case: str) -> None:
    check, mechanism, reason = EXPECTED[case]
    outcome = hostile_run["outcome"][case]
    ok = bool(check(outcome))
    if reason is not None:
        ok = ok and any(reason in d["reason"] for d in hostile_run["denials"])
    if mechanism.startswith("sandbox filter"):
        rule = (
            REJECT_DOCKER_DNS_UDP
            if "127.0.0.11" in mechanism
            else REJECT_OTHER
            if "ICMP" in mechanism
            else REJECT_TCP
        )
        ok = ok and hostile_run["counted"].get(rule, 0) > 0
    record(f"egress: {case}", hostile_run["runtime"], ok, {"outcome": outcome, "mechanism": mechanism})
    assert ok, (outcome, mechanism, hostile_run["denials"], hostile_run["counted"])


def test_the_other_sandbox_heard_nothing(hostile_run: dict[str, Any]) -> None:
    assert hostile_run["listener"] is not None and hostile_run["listener"].startswith("no one came")
