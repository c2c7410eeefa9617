"""The reaper removes sandboxes that never started, or exited, long ago — whoever owns them."""

from __future__ import annotations

from typing import Any

import pytest

from sandfleet.worker.sandbox.docker import reaper
from sandfleet.worker.sandbox.docker.spec import Owner


def test_a_created_but_never_started_sandbox_of_a_live_owner_is_removed_once_stale(
    docker_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandfleet.worker.sandbox.docker.backend import LABEL_OWNER, LABEL_ROLE, docker_client

    client = docker_client()
    labels = {LABEL_ROLE: "sandbox", LABEL_OWNER: Owner.current().label(), "sandfleet.test": "stale-reaper"}
    never_started = client.containers.create(
        "sandfleet/sandbox:py3.11", ["true"], labels=labels, network_mode="none"
    )
    running = client.containers.run(
        "sandfleet/sandbox:py3.11", ["sleep", "60"], labels=labels, network_mode="none", detach=True
    )
    try:
        mine = {"label": [LABEL_ROLE, "sandfleet.test=stale-reaper"]}

        class OnlyMine:  # prune sees only this test's containers on the shared engine
            api = client.api

            class containers:
                @staticmethod
                def list(**kwargs: Any) -> list[Any]:
                    return client.containers.list(all=True, filters=mine, ignore_removed=True)

        fresh = reaper.prune(client=OnlyMine)  # type: ignore[arg-type]
        assert never_started.id in fresh.kept and running.id in fresh.kept  # a live owner, not stale yet
        monkeypatch.setattr(reaper, "STALE_AFTER_S", 0.0)
        stale = reaper.prune(client=OnlyMine)  # type: ignore[arg-type]
        assert never_started.id in stale.removed
        assert running.id in stale.kept  # running: the live owner still uses it
    finally:
        for container in (never_started, running):
            try:
                container.remove(force=True)
            except Exception:
                pass
