"""The load test's count of live containers, from the engine's event stream, against real sandboxes."""

from __future__ import annotations

from typing import Any

from sandfleet_testing import wait_until

from sandfleet.core.config import SandboxConfig
from sandfleet.fleet.loadtest.sampler import LiveContainers
from sandfleet.worker.sandbox.backends import backend_named
from sandfleet.worker.sandbox.docker.spec import Owner


def test_live_containers_follow_starts_and_deaths_of_their_owners_only(docker_engine: Any) -> None:
    mine = Owner.current()
    stranger = Owner("another-host", 1, 1)
    already = backend_named().start(SandboxConfig(), owner=mine)  # running before counting starts
    counter = LiveContainers({mine.label()})
    assert counter.start()
    started = []
    try:
        assert counter.series[-1][1] == 1  # seeded from docker ps
        started = [backend_named().start(SandboxConfig(), owner=o) for o in (mine, mine, stranger)]
        assert wait_until(lambda: counter.series[-1][1] == 3)
        for sandbox in (already, *started):
            sandbox.destroy()
        assert wait_until(lambda: counter.series[-1][1] == 0)
    finally:
        for sandbox in (already, *started):
            sandbox.destroy()
        counter.stop()
    assert max(live for _, live in counter.series) == 3  # the stranger's container never counted
