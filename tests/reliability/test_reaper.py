"""The reaper removes the containers of a killed owner, and none of a live owner's.

Owners are worker-like processes that open sandboxes through SandboxManager on the main engine and
sleep. Every container carries labels of this test run, so only ours are counted (and, in the
direct ``prune()`` case, only ours are even looked at: the engine is shared).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandfleet.fleet.local import LocalFleet

from .harness import note_figure, wait_for

pytestmark = [pytest.mark.slow]

LABEL_RUN = "sandfleet.test.run"
LABEL_NAME = "sandfleet.test.owner"
SESSIONS_PER_OWNER = 2
LIMIT_S = 60.0
REPO = Path(__file__).resolve().parents[2]

OWNER_SCRIPT = """
import signal, sys, time
from sandfleet.worker.sandbox.manager import SandboxManager

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
run, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
with SandboxManager() as manager:
    labels = {"sandfleet.test.run": run, "sandfleet.test.owner": name}
    ids = [manager.create_session(labels=labels).container_id for _ in range(count)]
    print(" ".join(ids), flush=True)
    while True:
        time.sleep(1)
"""


class Owners:
    """Owner processes of one test run; ``close`` stops them and removes whatever of ours is left."""

    def __init__(self) -> None:
        self.run = uuid.uuid4().hex[:10]
        self.processes: dict[str, subprocess.Popen[str]] = {}

    def start(self, name: str) -> list[str]:
        process = subprocess.Popen(
            [sys.executable, "-c", OWNER_SCRIPT, self.run, name, str(SESSIONS_PER_OWNER)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            start_new_session=True,
        )
        self.processes[name] = process
        assert process.stdout is not None
        ids = process.stdout.readline().split()
        assert len(ids) == SESSIONS_PER_OWNER, (
            f"owner {name} did not open its sandboxes (exit {process.poll()})"
        )
        return ids

    def kill(self, name: str) -> None:
        process = self.processes[name]
        os.kill(process.pid, signal.SIGKILL)
        process.wait()

    def containers(self, name: str | None = None) -> set[str]:
        """Ids of this run's containers (of one owner, or all) on the main engine."""
        label = f"{LABEL_NAME}={name}" if name else LABEL_RUN
        cmd = ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label={LABEL_RUN}={self.run}"]
        cmd += ["--filter", f"label={label}"]
        return set(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout.split())

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            if process.stdout is not None:
                process.stdout.close()
        left = self.containers()
        if left:  # ours only: they carry this run's label
            subprocess.run(["docker", "rm", "-f", *left], capture_output=True, timeout=60)


@pytest.fixture
def owners(docker_engine: Any) -> Iterator[Owners]:
    made = Owners()
    try:
        yield made
    finally:
        made.close()


class OnlyOurs:
    """A Docker client whose container list holds only this run's containers, for ``prune(client=...)``.

    It has no ``api``: prune's scan for orphaned runtime processes (main engine only) is not this
    test's business, and the engine is shared.
    """

    def __init__(self, client: Any, run: str) -> None:
        self._client = client
        self._run = run
        self.containers = self

    def list(self, **kwargs: Any) -> list[Any]:
        filters = dict(kwargs.pop("filters", {}))
        filters["label"] = [*([filters["label"]] if "label" in filters else []), f"{LABEL_RUN}={self._run}"]
        return self._client.containers.list(filters=filters, **kwargs)


def test_prune_removes_a_killed_owners_containers_and_keeps_a_live_owners(owners: Owners) -> None:
    from sandfleet.worker.sandbox.docker.backend import docker_client
    from sandfleet.worker.sandbox.docker.reaper import prune

    dead, live = set(owners.start("dead")), set(owners.start("live"))
    owners.kill("dead")
    assert owners.containers("dead") == dead  # still there: nothing reaped them yet
    began = time.monotonic()
    report = prune(client=OnlyOurs(docker_client(), owners.run))
    prune_s = time.monotonic() - began
    note_figure(
        "reaper_prune", {"removed": len(report.removed), "kept": len(report.kept), "prune_s": prune_s}
    )
    # Other tests' workers share this engine and reap dead owners every 15 s: one may take a container
    # between the kill and this prune (prune skips what is gone), but prune must take what is left.
    assert set(report.removed) <= dead and report.removed
    assert set(report.kept) == live
    assert owners.containers("dead") == set()
    assert owners.containers("live") == live


def test_a_workers_periodic_reaper_removes_a_killed_owners_containers_within_60_s(
    owners: Owners, redis_factory: Callable[..., Any], make_fleet: Callable[..., LocalFleet]
) -> None:
    fleet = make_fleet(redis_factory().url)
    worker = fleet.start_worker(concurrency=1, sandboxes=1)
    dead, live = set(owners.start("dead")), set(owners.start("live"))
    owners.kill("dead")
    killed_at = time.monotonic()
    reaped = wait_for(lambda: not owners.containers("dead"), LIMIT_S, 0.5)
    reaped_s = time.monotonic() - killed_at
    # The worker logs the removal after prune returns: give that line a moment to be written. Other
    # tests' workers share this engine and reap every 15 s too; whichever gets there first removes
    # them, and then this worker's reaper has found nothing of theirs left to remove.
    removed_logged = wait_for(lambda: "left by dead workers" in worker.log(), 10, 0.2)
    reaped_by_another = not removed_logged and os.environ.get("PYTEST_XDIST_WORKER") is not None
    note_figure(
        "reaper_worker",
        {"dead_owner_containers": len(dead), "reaped_s": reaped_s if reaped else None,
         "live_owner_containers_kept": len(owners.containers("live") & live), "logged": removed_logged},
    )  # fmt: skip
    assert reaped, f"not reaped within {LIMIT_S:g} s:\n{worker.log()[-3000:]}"
    assert removed_logged or reaped_by_another, worker.log()[-3000:]
    assert owners.containers("live") == live
    assert worker.alive()
