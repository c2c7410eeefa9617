"""The one home of size spelling and of free ports: configured sizes exact, measured sizes rounded."""

from __future__ import annotations

import socket

from sandfleet.core.sizes import format_size, parse_size
from sandfleet.fleet.local_redis import free_port


def test_a_configured_size_is_spelled_exactly_and_parses_back() -> None:
    for text in ("4G", "1536M", "512K", "1000"):
        assert format_size(parse_size(text)) == text


def test_a_measured_size_is_rounded_to_decimal_megabytes() -> None:
    assert format_size(423_456_789, rounded=True) == "423 MB"


def test_free_port_keeps_a_free_preferred_port_and_skips_a_taken_one() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        other = free_port(busy)
        assert other != busy
    assert free_port(other) == other
