"""Fixtures of the engine tests: real replay servers over HTTP, the real ``openai`` client, real Docker.

engine_services  module: one EngineServices (pool_size 1, max_sandboxes 2) with the example tools
                 (orders, files, side) and the injected-data tool, settings built explicitly (no key,
                 no base URL, one model retry); skips without a Docker engine; fails if it leaves a
                 container behind
replay           function: ``replay(script) -> ReplayServer`` started on 127.0.0.1 with no latency
data_dir         function: an empty folder that SANDFLEET_DATA_DIR points at (the outbox lands there)
orders_dir       function: the same, holding the reference orders.csv

No test sees the developer's model key or endpoint: they are removed from the environment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandfleet.core.config import DEFAULT_IMAGE
from sandfleet.worker.llm.scripted.registry import stop_shared_replay_servers
from sandfleet.worker.llm.scripted.script import parse_script
from sandfleet.worker.llm.scripted.server import ReplayServer
from sandfleet.worker.tools.examples.scenario import write_reference_data

from .helpers import TOOL_MODULES, containers_of_this_process, engine_settings, skip_or_fail

MODEL_ENV_VARS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "SANDFLEET_MODEL_API_KEY", "SANDFLEET_MODEL_BASE_URL")


@pytest.fixture(autouse=True)
def _no_model_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in MODEL_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    yield
    stop_shared_replay_servers()


@pytest.fixture(scope="module")
def engine_services(docker_engine: Any) -> Iterator[Any]:
    """One EngineServices per test module: warm containers are shared, each run still gets a fresh one."""
    from sandfleet.worker.engine import EngineOptions, EngineServices
    from sandfleet.worker.tools.registry import ToolRegistry

    if DEFAULT_IMAGE not in docker_engine.images:
        skip_or_fail(f"image {DEFAULT_IMAGE} is missing; build it with `sandfleet images build`")
    registry = ToolRegistry.from_modules(TOOL_MODULES)
    services = EngineServices.start(
        engine_settings(), EngineOptions(registry=registry, pool_size=1, max_sandboxes=2)
    )
    try:
        yield services
    finally:
        services.close()
    left = containers_of_this_process()
    assert not left, f"the engine left containers behind: {left}"


@pytest.fixture
def replay() -> Iterator[Callable[[dict[str, Any]], ReplayServer]]:
    servers: list[ReplayServer] = []

    def start(script: dict[str, Any]) -> ReplayServer:
        server = ReplayServer(parse_script(script), latency_s=0.0)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    monkeypatch.setenv("SANDFLEET_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def orders_dir(data_dir: Path) -> Path:
    write_reference_data(data_dir)
    return data_dir
