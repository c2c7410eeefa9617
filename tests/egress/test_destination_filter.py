"""The host's destination filter (network.py) alone: what the kernel does with a connection that carries
a proxy's mark, whatever Squid's rule decided before. A marked connection to a refused address fails
at once with EHOSTUNREACH (EACCES for IPv6: the filter's REJECT) while the same connection unmarked is accepted by the
listener there (so the refusal is the filter's, not a missing listener); a listed address passes; an
IPv4-mapped IPv6 connection is an IPv4 connection to the kernel; and the host's own addresses are
refused by ``addrtype LOCAL`` even when no range holds them. Squid marks its connections with
``tcp_outgoing_mark`` (tests/egress/test_hostile_destinations.py shows one refused this way). Only
addresses of this machine are contacted: its loopback and the run's own (tests/owned_targets.py)."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from sandfleet.worker.egress.destinations import DeniedRanges, parse_networks
from sandfleet.worker.egress.network import (
    EgressNetwork,
    install_destination_filter,
    remove_host_rules,
    verify_destination_filter,
)
from sandfleet.worker.egress.squid import EgressError

PORT = 8000  # one of the owned targets' listening ports (owned_targets.TCP_PORTS)
SO_MARK = getattr(socket, "SO_MARK", 36)


@pytest.fixture
def scratch_network() -> Iterator[EgressNetwork]:
    """A network of this test alone: only its destination chain and OUTPUT jumps exist (no bridge)."""
    net = EgressNetwork("sfeg-filter-test", f"egressd{os.getpid() % 100000}", "10.213.250.0/24", 3128)
    try:
        yield net
    finally:
        remove_host_rules(net)


@pytest.fixture
def loopback_listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.1)
        yield server.getsockname()[1]


def connect(address: str, port: int, mark: int | None) -> str:
    """ "connected" or the errno's name."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        if mark is not None:
            s.setsockopt(socket.SOL_SOCKET, SO_MARK, mark)
        try:
            s.connect((address, port))
        except OSError as e:
            return errno.errorcode.get(e.errno or 0, str(e))
        return "connected"


def test_marked_connections_to_refused_addresses_are_rejected(
    scratch_network: EgressNetwork, owned_targets: Any, loopback_listener: int
) -> None:
    net = scratch_network
    install_destination_filter(net, DeniedRanges.build(parse_networks([f"{owned_targets.private_b}/32"])))
    refused = {
        ("127.0.0.1", loopback_listener): "loopback",
        (owned_targets.link_local, PORT): "link-local",
        (owned_targets.private, PORT): "private",
        (owned_targets.public_v4, PORT): "documentation (special)",
        (owned_targets.public_v6, PORT): "documentation, IPv6 (special)",
        (f"::ffff:{owned_targets.link_local}", PORT): "IPv4-mapped link-local",
    }
    seen = {target: (connect(*target, net.mark), connect(*target, None)) for target in refused}
    # The REJECT's ICMP "administratively prohibited": EHOSTUNREACH for IPv4, EACCES for IPv6.
    expected = {
        t: ("EACCES" if ":" in t[0] and "." not in t[0] else "EHOSTUNREACH", "connected") for t in refused
    }
    assert seen == expected, refused
    assert connect(owned_targets.private_b, PORT, net.mark) == "connected"  # the listed address
    assert connect(owned_targets.link_local, PORT, net.mark + 1) == "connected"  # another proxy's mark


def test_the_hosts_own_addresses_are_refused_even_in_no_range(
    scratch_network: EgressNetwork, owned_targets: Any
) -> None:
    """``addrtype LOCAL``: with no range at all, a marked connection to an address of this host fails."""
    net = scratch_network
    install_destination_filter(net, DeniedRanges(categories=()))
    assert connect(owned_targets.public_v4, PORT, net.mark) == "EHOSTUNREACH"
    assert connect(owned_targets.public_v4, PORT, None) == "connected"


def test_a_filter_that_differs_from_the_settings_does_not_verify(scratch_network: EgressNetwork) -> None:
    """A restricted sandbox does not start (EgressError) when the chain is not what the settings make."""
    net = scratch_network
    install_destination_filter(net, DeniedRanges.build())
    verify_destination_filter(net, DeniedRanges.build())
    with pytest.raises(EgressError, match="destination filter"):
        verify_destination_filter(net, DeniedRanges.build(parse_networks(["10.231.5.2/32"])))
    remove_host_rules(net)
    with pytest.raises(EgressError, match="destination filter"):
        verify_destination_filter(net, DeniedRanges.build())
