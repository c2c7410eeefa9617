"""Hostile programs against network "restricted", under runc and gVisor, each refused by a named mechanism.

The only servers contacted are the test's own: an HTTPS service in a network namespace this test
creates (its own CA; names the proxy resolves from a test hosts file), a listener in a second
sandbox, whatever the host has on its gateway addresses, and the addresses this test run owns
(tests/owned_targets.py) for "the Internet" and "a metadata service": nothing that reaches one of
them leaves the machine, and the run asserts that nothing reached them at all. Each attack's outcome must be the error
its mechanism gives, and for network-level refusals the sandbox filter's rule that refused it must
have counted the packet (sandfleet/worker/egress/network.py); proxy refusals must be in the run's denials, and
so must the filter's, itemised from its NFLOG rules (sandfleet/worker/egress/nflog.py) with the destination.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pytest
from sandbox.helpers import BACKENDS, TEST_LABELS
from security.helpers import record

from sandfleet.core.config import SandboxConfig

from .attacks import ATTACKS

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
REJECT6_TCP = "ip6tables -A OUTPUT -p tcp -j REJECT --reject-with tcp-reset"
REJECT6_OTHER = "ip6tables -A OUTPUT -j REJECT --reject-with icmp6-port-unreachable"


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
    "DNS tunnel to an outside resolver (UDP 53)": (
        refused("EPERM"),
        "sandbox filter: ICMP port unreachable",
        None,
    ),
    "DNS over TCP to an outside resolver (53)": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "UDP to the gateway": (refused("EPERM"), "sandbox filter: ICMP port unreachable", None),
    # IPv6 is routed into the sandbox's own filter (sandbox_filter.py route_ipv6_into_filter).
    "IPv6 to an outside address": (refused("ECONNREFUSED"), "sandbox filter (IPv6): TCP reset", None),
    "UDP over IPv6 to an outside address": (
        refused("EPERM"),
        "sandbox filter (IPv6): ICMPv6 port unreachable",
        None,
    ),
    "IPv4-mapped IPv6 address": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "host gateway, SSH port": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "host gateway, Redis port": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "Docker bridge gateway, Redis port": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "Docker API over TCP (2375)": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "cloud metadata (a link-local address)": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
    "another sandbox": (refused("ECONNREFUSED"), "sandbox filter: TCP reset", None),
}


# case -> (the address it went to, port, protocol, what the packet filter's reason says), as the
# run's denials must itemise it (read from the sandbox's NFLOG group, sandfleet/worker/egress/nflog.py).
DIRECT = "a direct connection, not through the proxy (packet filter)"
DOCKER_DNS = "DNS to Docker's resolver (127.0.0.11)"
IPV6 = "IPv6 is not allowed (packet filter)"
FILTER_DENIED: dict[str, tuple[str, int, str, str]] = {
    "IPv6 to an outside address": ("OUTSIDE_V6", 443, "tcp", IPV6),
    "UDP over IPv6 to an outside address": ("OUTSIDE_V6", 53, "udp", IPV6),
    "IPv4-mapped IPv6 address": ("OUTSIDE_V4_B", 443, "tcp", DIRECT),
    "IP literal directly": ("SERVICE_IP", 443, "tcp", DIRECT),
    "DNS lookup": ("127.0.0.11", 53, "udp", DOCKER_DNS),
    "DNS tunnel to Docker's resolver (127.0.0.11)": ("127.0.0.11", 53, "udp", DOCKER_DNS),
    "DNS tunnel to an outside resolver (UDP 53)": ("OUTSIDE_V4", 53, "udp", DIRECT),
    "DNS over TCP to an outside resolver (53)": ("OUTSIDE_V4", 53, "tcp", DIRECT),
    "UDP to the gateway": ("GATEWAY", 3128, "udp", DIRECT),
    "host gateway, SSH port": ("GATEWAY", 22, "tcp", DIRECT),
    "host gateway, Redis port": ("GATEWAY", 6379, "tcp", DIRECT),
    "Docker bridge gateway, Redis port": ("DOCKER_GATEWAY", 6379, "tcp", DIRECT),
    "Docker API over TCP (2375)": ("DOCKER_GATEWAY", 2375, "tcp", DIRECT),
    "cloud metadata (a link-local address)": ("METADATA", 80, "tcp", DIRECT),
    "another sandbox": ("OTHER_SANDBOX", 8000, "tcp", DIRECT),
}


def docker_gateway() -> str:
    from sandfleet.worker.sandbox.docker.backend import docker_client

    return str(docker_client().networks.get("bridge").attrs["IPAM"]["Config"][0].get("Gateway", "172.17.0.1"))


@pytest.fixture(scope="module", params=BACKENDS)
def hostile_run(
    request: pytest.FixtureRequest, egress_env: dict[str, Any], service: Any, owned_targets: Any
) -> dict[str, Any]:
    """The hostile program's outcome in one sandbox per runtime, with its denials, rule counters and
    whatever reached the run's own targets meanwhile (nothing, if every refusal held)."""
    from sandfleet.worker.egress.gateway import egress_gateway, take_refusals
    from sandfleet.worker.egress.sandbox_filter import rule_counters
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
        before = rule_counters(lease.netns)
        addresses = {
            "GATEWAY": gateway.network.gateway,
            "DOCKER_GATEWAY": docker_gateway(),
            "SERVICE_IP": service.address,
            "OTHER_SANDBOX": other_ip,
            "OUTSIDE_V4": owned_targets.public_v4,
            "OUTSIDE_V4_B": owned_targets.public_v4_b,
            "OUTSIDE_V6": owned_targets.public_v6,
            "METADATA": owned_targets.link_local,
        }
        mark = owned_targets.mark()
        prelude = f"CA={service.ca.read_text()!r}\nPROXY=({gateway.network.gateway!r},{gateway.network.proxy_port})\n"
        prelude += "".join(f"{name}={value!r}\n" for name, value in addresses.items())
        done = attacker.execute(["python3", "-c", prelude + ATTACKS], timeout=120)
        after = rule_counters(lease.netns)
        arrived = owned_targets.arrived_since(mark)
        refusals = lease.take()
        listener.join(30)
        other_denials = take_refusals(other._container).denials
    assert done.exit_code == 0, done.stderr
    counted = {rule: after.get(rule, 0) - before.get(rule, 0) for rule in after}
    return {
        "runtime": config.docker_runtime,
        "outcome": json.loads(done.stdout),
        "denials": refusals.denials,
        "refused_total": refusals.total,
        "counted": counted,
        "addresses": addresses,
        "other_denials": other_denials,
        "listener": heard.get("out").stdout if heard.get("out") else None,
        "arrived": arrived,
    }


def test_the_allowed_name_is_reached(hostile_run: dict[str, Any]) -> None:
    assert hostile_run["outcome"]["allowed name"] == {
        "status": 200,
        "body": "hello from api.egress.test on port 443",
    }


def _rule_of(mechanism: str) -> str:
    """The sandbox filter's rule a mechanism names (its counter must have counted the packet)."""
    if "127.0.0.11" in mechanism:
        return REJECT_DOCKER_DNS_UDP
    if "IPv6" in mechanism:
        return REJECT6_OTHER if "ICMP" in mechanism else REJECT6_TCP
    return REJECT_OTHER if "ICMP" in mechanism else REJECT_TCP


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_attack_is_refused_by_its_mechanism(hostile_run: dict[str, Any], case: str) -> None:
    check, mechanism, reason = EXPECTED[case]
    outcome = hostile_run["outcome"][case]
    ok = bool(check(outcome))
    if reason is not None:
        ok = ok and any(reason in d["reason"] for d in hostile_run["denials"])
    if mechanism.startswith("sandbox filter"):
        ok = ok and hostile_run["counted"].get(_rule_of(mechanism), 0) > 0
    ok = ok and hostile_run["arrived"] == {}  # and nothing reached the run's own targets
    record(f"egress: {case}", hostile_run["runtime"], ok, {"outcome": outcome, "mechanism": mechanism})
    assert ok, (outcome, mechanism, hostile_run["denials"], hostile_run["counted"], hostile_run["arrived"])


def test_nothing_reached_the_runs_own_targets(hostile_run: dict[str, Any]) -> None:
    """The stand-ins for the Internet and the metadata service counted no packet, heard no one."""
    assert hostile_run["arrived"] == {}


def test_the_other_sandbox_heard_nothing(hostile_run: dict[str, Any]) -> None:
    assert hostile_run["listener"] is not None and hostile_run["listener"].startswith("no one came")


@pytest.mark.parametrize("case", sorted(FILTER_DENIED))
def test_filter_refusal_is_itemised_in_the_denials(hostile_run: dict[str, Any], case: str) -> None:
    where, port, protocol, reason = FILTER_DENIED[case]
    host = hostile_run["addresses"].get(where, where)
    found = [
        d
        for d in hostile_run["denials"]
        if (d["host"], d["port"], d.get("protocol")) == (host, port, protocol) and reason in d["reason"]
    ]
    ok = len(found) == 1 and found[0]["count"] >= 1
    record(
        f"egress: {case} (itemised)",
        hostile_run["runtime"],
        ok,
        {"denial": found[0] if found else None, "mechanism": "sandbox filter: NFLOG before the REJECT"},
    )
    assert ok, json.dumps([host, port, protocol, hostile_run["denials"]])


def test_every_refusal_of_the_run_is_counted_and_below_the_log_rate_listed(
    hostile_run: dict[str, Any],
) -> None:
    """Fewer refusals than the log's burst: the count of all of them (the proxy's and the filter's
    REJECT counters) equals what the denials itemise, none unlisted."""
    listed = sum(d["count"] for d in hostile_run["denials"])
    ok = hostile_run["refused_total"] == listed > 0
    record(
        "egress: every refusal counted", hostile_run["runtime"], ok, {"total": hostile_run["refused_total"]}
    )
    assert ok, (hostile_run["refused_total"], listed, hostile_run["denials"])


def test_the_filter_log_reads_only_its_own_sandbox(hostile_run: dict[str, Any]) -> None:
    """The other sandbox only listened: none of the attacker's refusals may appear in its record."""
    assert hostile_run["other_denials"] == []


FLOOD_THEN_DIE = """\
import os, signal, socket
for i in range({count}):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(({target!r}, 443))
    except OSError:
        pass
    finally:
        s.close()
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    if pid != os.getpid():
        try:
            os.kill(pid, signal.SIGKILL)  # the agent too: gVisor delivers it, and the sandbox ends
        except OSError:
            pass
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sandbox_that_kills_itself_after_a_burst_has_every_refusal_counted(
    egress_env: dict[str, Any], owned_targets: Any, backend: str
) -> None:
    """Twice the log's burst, then every process it sees killed, its own last: the filter's counters
    are read through the namespace the worker holds open (netns.py), so a sandbox that ended itself
    (under gVisor its agent dies with it) still has every refusal counted, listed or not."""
    from sandfleet.worker.egress.nflog import BURST
    from sandfleet.worker.sandbox.manager import SandboxManager

    count = 2 * BURST
    config = SandboxConfig(backend=backend, network="restricted", allow_hosts=["api.egress.test"])
    mark = owned_targets.mark()
    with SandboxManager(config) as manager:
        session = manager.create_session(labels=TEST_LABELS)
        lease = session._container.handle.egress
        program = FLOOD_THEN_DIE.format(count=count, target=owned_targets.public_v4)
        try:
            session.execute(["python3", "-c", program], timeout=60)
        except Exception as e:  # the sandbox may be gone with its agent: what matters is the count
            ended = type(e).__name__
        else:
            ended = "returned"
        agent_gone = not os.path.exists(f"/proc/{lease.pid}")
        refusals = lease.take()
    ok = refusals.total == count and refusals.unlisted == count - refusals.listed > 0
    detail = {"total": refusals.total, "listed": refusals.listed, "agent_gone": agent_gone, "execute": ended}
    record(
        "egress: a burst, then the sandbox ends itself: every refusal counted",
        config.docker_runtime,
        ok,
        detail,
    )
    assert ok, detail
    assert owned_targets.arrived_since(mark) == {}
