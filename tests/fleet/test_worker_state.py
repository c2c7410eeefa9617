"""The worker's process state: one object, made by the app factory, started in order and stopped in
reverse (the sandbox pool drains while the worker is still announced, then the presence goes)."""

from __future__ import annotations

import redis

from sandfleet.core.queue import TASK_NAME
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.worker.delivery.celery_app import create_app
from sandfleet.worker.delivery.state import current_state


class ServicesRecorder:
    """Stands in for EngineServices (whose close drains a sandbox pool): notes what was up then."""

    def __init__(self, client: redis.Redis, heartbeat_key: str) -> None:
        self.client, self.key, self.closed_while_announced = client, heartbeat_key, []

    def close(self) -> None:
        self.closed_while_announced.append(bool(self.client.exists(self.key)))


def test_the_app_is_made_by_a_function_with_its_own_state(settings: Settings) -> None:
    first, second = create_app(settings), create_app(settings)
    assert TASK_NAME in first.tasks and TASK_NAME in second.tasks
    assert first.state is not second.state and first.state.app is first
    assert current_state() is None  # constructing starts nothing


def test_start_announces_and_stop_undoes_it_in_reverse(settings: Settings, raw_redis: redis.Redis) -> None:
    keys = FleetKeys(settings.key_prefix)
    name = "state-test@host"
    state = create_app(settings).state
    state.start(name)
    try:
        assert current_state() is state
        assert raw_redis.exists(keys.heartbeat(name)) and name in raw_redis.smembers(keys.workers)
        services = ServicesRecorder(raw_redis, keys.heartbeat(name))
        state._services = services
    finally:
        state.stop()
    assert services.closed_while_announced == [True]  # the pool drained first, then the presence went
    assert not raw_redis.exists(keys.heartbeat(name)) and name not in raw_redis.smembers(keys.workers)
    assert current_state() is None
    state.stop()  # a second stop (a prefork child's shutdown after the worker's) does nothing
    assert services.closed_while_announced == [True]


def test_deliveries_running_here_are_counted_per_job(settings: Settings) -> None:
    running = create_app(settings).state.running
    with running.running("a") as first, running.running("a") as second, running.running("b") as other:
        assert (running.count("a"), running.count("b")) == (2, 1)
        assert (first, second, other) == (True, False, True)  # the second delivery of "a" is a duplicate
    assert running.count("a") == 0
