"""Fixtures of the reliability tests: a fleet of real workers on a Redis of the test's own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandfleet.fleet.local import LocalFleet

from .harness import reliability_fleet


@pytest.fixture
def make_fleet(tmp_path: Path, docker_engine: Any) -> Iterator[Callable[..., LocalFleet]]:
    """``make_fleet(redis_url, **env)``: a LocalFleet whose workers are stopped when the test ends."""
    fleets: list[LocalFleet] = []

    def make(redis_url: str, **env: str) -> LocalFleet:
        fleet = reliability_fleet(redis_url, tmp_path / f"fleet-{len(fleets)}", **env)
        fleets.append(fleet)
        return fleet

    try:
        yield make
    finally:
        for fleet in fleets:
            fleet.stop()
