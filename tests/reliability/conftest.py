"""Fixtures of the reliability tests: a fleet of real workers on a Redis of the test's own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .harness import Fleet


@pytest.fixture
def make_fleet(tmp_path: Path, docker_engine: Any) -> Iterator[Callable[..., Fleet]]:
    """``make_fleet(redis_url, **env)``: a Fleet whose workers are stopped when the test ends."""
    fleets: list[Fleet] = []

    def make(redis_url: str, **env: str) -> Fleet:
        fleet = Fleet(redis_url, tmp_path / f"fleet-{len(fleets)}", env=env)
        fleets.append(fleet)
        return fleet

    try:
        yield make
    finally:
        for fleet in fleets:
            fleet.close()
