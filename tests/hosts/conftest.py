"""A multi-host fleet per test (sandfleet/fleet/hosts.py): root, the sandbox image, redis-server."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sandfleet.fleet.hosts import HostFleet
from sandfleet.fleet.local import FleetConfig


@pytest.fixture
def host_fleet(docker_engine: Any, skip_or_fail: Callable[[str], None]) -> Iterator[Callable[..., HostFleet]]:
    """``host_fleet(hosts, secured=False, sentinel=False, clocks=None, **env)``: a started HostFleet (no warm pool),
    stopped when the test ends; ``secured``: its Redis over TLS only, an ACL user per role;
    ``sentinel``: primary + replica + three Sentinels; ``clocks``: a host's worker clock offset; ``egress``: network "restricted" with each host's own proxy."""
    if os.geteuid() != 0 or shutil.which("nsenter") is None or shutil.which("redis-server") is None:
        skip_or_fail("a multi-host fleet needs root, nsenter and redis-server")
    fleets: list[HostFleet] = []

    def make(
        hosts: int,
        secured: bool = False,
        sentinel: bool = False,
        clocks: dict[int, str] | None = None,
        egress: bool = False,
        **env: str,
    ) -> HostFleet:
        config = FleetConfig(concurrency=4, sandboxes=2, tools="", loglevel="info")
        config.env = {"SANDFLEET_POOL_SIZE": "0", **env}
        fleet = HostFleet(hosts, config, secured=secured, sentinel=sentinel, clocks=clocks, egress=egress)
        fleets.append(fleet)
        fleet.start()
        return fleet

    try:
        yield make
    finally:
        for fleet in fleets:
            fleet.stop()
