"""The worker's Docker client keeps its connections to the engine (issue 25): the SDK keeps one
connection pool per request URL, so each call naming a container opened a new connection. Calls
that take their socket over (the agent's attach) must keep a connection of their own, never lent
to another call: the sandbox attaches on a connection it opens for that alone."""

from __future__ import annotations

from typing import Any

import pytest

from sandfleet.core.config import SandboxConfig
from sandfleet.worker.sandbox.docker.backend import (
    DockerBackend,
    _connect,
    hijacked,
    plain_call,
    shares_connections,
)

from .helpers import TEST_LABELS


def test_hijacking_calls_are_told_apart() -> None:
    base = "http+docker://localhost/v1.41"
    assert hijacked(f"{base}/containers/abc/attach?stdin=1&stream=1")
    assert hijacked(f"{base}/exec/abc/start")
    for plain in ("/containers/abc/start", "/containers/abc/json", "/containers/create?name=x", "/_ping"):
        assert not hijacked(base + plain)


def test_sandboxes_share_one_connection_and_each_attach_has_its_own(docker_engine: Any) -> None:
    client = _connect(None)  # a client of its own: the shared one's counts depend on other tests
    try:
        adapter = client.api._custom_adapter
        assert shares_connections(adapter) and client.api.trust_env is False
        made: list[Any] = []  # the connections the shared pool opens after the ping's
        new_connection = adapter.shared._new_conn
        adapter.shared._new_conn = lambda: made.append(new_connection()) or made[-1]
        client.api.attach_socket = lambda *_a, **_k: pytest.fail("attached through the SDK")
        backend = DockerBackend(client)  # attaches on a connection of its own (attach_unix)
        for _ in range(2):
            sandbox = backend.start(SandboxConfig(), labels=TEST_LABELS)
            try:
                assert sandbox.execute(["true"], timeout=30).exit_code == 0
            finally:
                sandbox.destroy()
        # 2 x (create, start, remove, ...) on the ping's connection (the SDK's pools: one a call),
        # or one more if the engine closed that one; each attach in a pool of its own, held by its
        # response alone, whose connection the agent's channel owns: never in a pool others use.
        assert len(made) <= 1 and adapter.shared.pool.qsize() == adapter.max_pool_size
        assert not adapter.pools  # nothing kept per URL
        # start and remove went straight on the pool: a plain call answers without the SDK
        assert plain_call(client, "DELETE", f"/containers/{'0' * 64}?force=1", (204, 404))
        assert not plain_call(client, "DELETE", f"/containers/{'0' * 64}?force=1", (204,))
    finally:
        client.close()
