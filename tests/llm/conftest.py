"""Fixtures for the model tests: scripts on disk, real replay servers, real openai clients, settings
built explicitly (never from the developer's environment)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from sandfleet.core.settings import Settings
from sandfleet.worker.llm.scripted.registry import stop_shared_replay_servers
from sandfleet.worker.llm.scripted.script import parse_script
from sandfleet.worker.llm.scripted.server import ReplayServer

MODEL_ENV_VARS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "SANDFLEET_MODEL_API_KEY", "SANDFLEET_MODEL_BASE_URL")


@pytest.fixture(autouse=True)
def _no_model_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test sees the developer's key or endpoint; every replay:FILE server stops after its test."""
    for name in MODEL_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    yield
    stop_shared_replay_servers()


@pytest.fixture
def make_settings() -> Callable[..., Settings]:
    """Settings with no key and no base URL unless given."""

    def build(**overrides: Any) -> Settings:
        fields: dict[str, Any] = {
            "model_api_key": None,
            "model_base_url": None,
            "model_request_timeout_s": 10.0,
            "model_max_retries": 2,
        }
        fields.update(overrides)
        return Settings(**fields)

    return build


@pytest.fixture
def write_script(tmp_path: Path) -> Callable[..., Path]:
    """Write a script as JSON (default) or YAML and return its path."""
    counter = iter(range(1000))

    def write(script: dict[str, Any], *, fmt: str = "json") -> Path:
        path = tmp_path / f"script{next(counter)}.{fmt}"
        text = json.dumps(script) if fmt == "json" else yaml.safe_dump(script)
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def start_server() -> Iterator[Callable[..., ReplayServer]]:
    """Start a replay server for a script given as a dict; stopped after the test."""
    servers: list[ReplayServer] = []

    def start(script: dict[str, Any], *, latency_s: float = 0.0) -> ReplayServer:
        server = ReplayServer(parse_script(script), latency_s=latency_s)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def openai_client() -> Iterator[Callable[[ReplayServer], openai.OpenAI]]:
    """The official client, unchanged, pointed at a replay server; closed after the test."""
    clients: list[openai.OpenAI] = []

    def make(server: ReplayServer) -> openai.OpenAI:
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
