"""The warm pool as runs see it: fresh containers, warm leases, the cap on live containers, a clean
close, and a warm count that follows demand (up to the cap) and shrinks back when idle."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sandfleet.core.config import CodeActionSettings, SandboxConfig

from .helpers import TEST_LABEL, TEST_LABELS, labelled, wait_until

TRIVIAL = "print('RESULT: 1')\n"
SETTINGS = CodeActionSettings(exec_timeout=20)


@pytest.fixture
def make_pool(docker_client: Any) -> Iterator[Any]:
    """``make_pool(pool_size, max_live)`` -> (pool, its unique label value); closed after the test."""
    from sandfleet.worker.sandbox.pool import SandboxPool

    made: list[Any] = []

    def make(pool_size: int, max_live: int, **options: Any) -> tuple[Any, str]:
        value = uuid.uuid4().hex
        pool = SandboxPool(
            pool_size=pool_size,
            max_live=max_live,
            labels={**TEST_LABELS, f"{TEST_LABEL}.pool": value},
            **options,
        )
        made.append(pool)
        return pool, value

    try:
        yield make
    finally:
        for pool in made:
            pool.close()


def runtime_of(pool: Any) -> Any:
    from sandfleet.worker.program.runtime import ProgramRuntime

    return ProgramRuntime(pool)


def test_fifty_runs_get_fifty_fresh_containers(pool: Any, docker_client: Any) -> None:
    runtime = runtime_of(pool)
    ids = []
    for _ in range(50):
        done = runtime.run(TRIVIAL, settings=SETTINGS)
        assert done.ok, (done.failure(), done.stderr)
        ids.append(done.container_id)

    assert len(set(ids)) == 50
    existing = lambda: {c.id for c in docker_client.containers.list(all=True, sparse=True)}  # noqa: E731
    assert wait_until(lambda: not set(ids) & existing(), timeout_s=15), "used containers are removed"


def test_a_run_with_an_empty_pool_starts_a_cold_container(make_pool: Any) -> None:
    pool, _ = make_pool(pool_size=0, max_live=1)

    done = runtime_of(pool).run(TRIVIAL, settings=SETTINGS)

    assert done.ok and not done.warm
    assert pool.stats()["idle"] == 0


def test_a_refilled_pool_gives_a_warm_lease(make_pool: Any) -> None:
    pool, _ = make_pool(pool_size=2, max_live=4)
    config = SandboxConfig()
    pool.warm(config)
    runtime = runtime_of(pool)
    for _ in range(2):
        assert wait_until(lambda: pool.stats()["idle"] >= 1, timeout_s=20), pool.stats()
        before = pool.stats()
        done = runtime.run(TRIVIAL, config=config, settings=SETTINGS)
        assert done.ok and done.warm
        after = pool.stats()  # counted, not timed: a warm lease takes an idle container, starts none
        assert (after["warm_leases"], after["cold_leases"]) == (
            before["warm_leases"] + 1,
            before["cold_leases"],
        )


def test_max_live_is_never_exceeded(make_pool: Any) -> None:
    pool, _ = make_pool(pool_size=1, max_live=2)
    runtime = runtime_of(pool)
    results: list[Any] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(2):
                results.append(
                    runtime.run("import time; time.sleep(0.1); print('RESULT: 1')", settings=SETTINGS)
                )
        except BaseException as e:  # surfaced below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not errors
    assert len(results) == 12 and all(r.ok for r in results)
    assert len({r.container_id for r in results}) == 12
    assert pool.stats()["peak_live"] <= 2


def test_close_leaves_no_container(make_pool: Any, docker_client: Any) -> None:
    pool, value = make_pool(pool_size=2, max_live=3)
    pool.warm(SandboxConfig())
    runtime_of(pool).run(TRIVIAL, settings=SETTINGS)
    assert wait_until(lambda: pool.stats()["idle"] >= 1, timeout_s=20)
    assert labelled(docker_client, f"{TEST_LABEL}.pool", value)

    pool.close()

    assert labelled(docker_client, f"{TEST_LABEL}.pool", value) == []
    assert pool.stats()["live"] == 0


class HeldStarts:
    """A backend whose container starts wait for ``go`` (set by the test) before they begin: a start
    outlasting close(), as one waiting for a slow agent's hello does."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.go, self.entered = backend, threading.Event(), threading.Event()

    def start(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        self.go.wait(60)
        return self.backend.start(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


def test_a_start_that_outlives_close_removes_its_container(
    make_pool: Any, docker_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the filler handed its late container to the removers close() had shut down; the
    submit raised in the filler thread and the running container stayed on the host."""
    from sandfleet.worker.sandbox import pool as pool_module
    from sandfleet.worker.sandbox.backends import backend_named

    monkeypatch.setattr(pool_module, "CLOSE_WAIT_S", 0.2)  # close() stops waiting for the start
    held = HeldStarts(backend_named())
    pool, value = make_pool(pool_size=1, max_live=2, backend=held)
    pool.warm(SandboxConfig())
    assert held.entered.wait(10), "the filler began a start"

    pool.close()
    held.go.set()  # the start goes on after close() returned

    assert wait_until(lambda: pool.stats()["started_total"] == 1, timeout_s=30), pool.stats()
    assert wait_until(lambda: labelled(docker_client, f"{TEST_LABEL}.pool", value) == [], timeout_s=30)
    assert pool.stats()["live"] == 0


def test_a_run_released_after_close_is_removed(make_pool: Any, docker_client: Any) -> None:
    pool, value = make_pool(pool_size=0, max_live=1)
    lease = pool.acquire(SandboxConfig())
    pool.close()

    pool.release(lease.container)  # before: RuntimeError from the shut-down removers, container kept

    assert labelled(docker_client, f"{TEST_LABEL}.pool", value) == []
    assert pool.stats()["live"] == 0


def idle_containers(client: Any, value: str) -> int:
    """Containers of this pool on the engine that run and are not leased: what the pool keeps warm."""
    return len(client.containers.list(sparse=True, filters={"label": f"{TEST_LABEL}.pool={value}"}))


def test_jobs_in_flight_are_served_warm_and_the_idle_pool_shrinks_back(
    make_pool: Any, docker_client: Any
) -> None:
    """Four jobs say they will want a sandbox (``expecting``): the pool warms four, not pool_size's
    one, so all four runs get a warm lease; a window after the demand ends it is back at one."""
    pool, value = make_pool(pool_size=1, max_live=4, demand_window_s=3.0)
    config = SandboxConfig()
    pool.warm(config)
    assert wait_until(lambda: pool.stats()["idle"] == 1, timeout_s=30), pool.stats()
    runtime = runtime_of(pool)
    with contextlib.ExitStack() as jobs:
        for _ in range(4):
            jobs.enter_context(pool.expecting(config))
        assert pool.warm_target(config) == 4
        assert wait_until(lambda: pool.stats()["idle"] == 4, timeout_s=60), pool.stats()
        assert idle_containers(docker_client, value) == 4  # really started on the engine
        done: list[Any] = []
        threads = [
            threading.Thread(target=lambda: done.append(runtime.run(TRIVIAL, settings=SETTINGS)))
            for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert len(done) == 4 and all(run.ok and run.warm for run in done), [(r.ok, r.warm) for r in done]
    assert pool.stats()["peak_live"] <= 4
    # The jobs are over: within the window the pool refills for the demand it saw, then shrinks.
    assert wait_until(lambda: pool.warm_target(config) == 1, timeout_s=10)
    assert wait_until(
        lambda: pool.stats()["idle"] == 1 and idle_containers(docker_client, value) == 1, timeout_s=30
    ), pool.stats()


def test_held_runs_count_as_demand_without_any_hint(make_pool: Any) -> None:
    """Three runs at once (no ``expecting``): after them the pool keeps three warm for the window."""
    pool, _ = make_pool(pool_size=1, max_live=4, demand_window_s=60.0)
    config = SandboxConfig()
    leases = [pool.acquire(config) for _ in range(3)]
    assert pool.warm_target(config) == 1  # three wanted, three held: one idle more is the floor
    for lease in leases:
        pool.release(lease.container)
    assert pool.warm_target(config) == 3
    assert wait_until(lambda: pool.stats()["idle"] == 3, timeout_s=60), pool.stats()
    again = [pool.acquire(config) for _ in range(3)]
    assert all(lease.warm for lease in again)
    for lease in again:
        pool.release(lease.container)


def test_a_pool_that_does_not_follow_demand_keeps_exactly_pool_size(make_pool: Any) -> None:
    pool, _ = make_pool(pool_size=1, max_live=4, follow_demand=False)
    config = SandboxConfig()
    with contextlib.ExitStack() as jobs:
        for _ in range(4):
            jobs.enter_context(pool.expecting(config))
        assert pool.warm_target(config) == 1
        assert wait_until(lambda: pool.stats()["idle"] == 1, timeout_s=30)
        time.sleep(1.0)  # time enough to start more, were it going to
        assert pool.stats()["idle"] == 1 and pool.stats()["live"] == 1
