"""The thin engine client (docker/engine_api.py) makes the sandbox the SDK makes, and reads its end and
the engine's errors as the SDK path does: run against the real engine under runc and runsc."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import SandboxError
from sandfleet.worker.sandbox.docker import engine_api
from sandfleet.worker.sandbox.docker.backend import DockerBackend

from .helpers import TEST_LABELS

# What decides the isolation, as the engine reports it (``docker inspect``), besides labels and ids.
HOST_FIELDS = (
    "ReadonlyRootfs",
    "CapAdd",
    "CapDrop",
    "SecurityOpt",
    "PidsLimit",
    "Memory",
    "MemorySwap",
    "NanoCpus",
    "Runtime",
    "Tmpfs",
    "Ulimits",
    "IpcMode",
    "NetworkMode",
    "Init",
    "Privileged",
    "Binds",
    "Devices",
    "LogConfig",
)
CONFIG_FIELDS = ("User", "Env", "Cmd", "WorkingDir", "Hostname", "NetworkDisabled", "StopSignal", "Image")


@pytest.mark.parametrize(
    ("docker_host", "path"),
    [
        (None, "/var/run/docker.sock"),
        ("", "/var/run/docker.sock"),
        ("unix:///run/user/1000/docker.sock", "/run/user/1000/docker.sock"),
        ("tcp://127.0.0.1:2376", None),
        ("ssh://me@host", None),
    ],
)
def test_only_unix_sockets_are_the_thin_clients(docker_host: str | None, path: str | None) -> None:
    assert engine_api.socket_path(docker_host) == path


@pytest.fixture
def both_backends(docker_engine: Any) -> Iterator[tuple[DockerBackend, DockerBackend]]:
    thin = DockerBackend(thin=True)
    assert thin.client_for(SandboxConfig()).__class__ is engine_api.EngineClient
    yield thin, DockerBackend()


def test_the_thin_client_makes_the_sdks_sandbox(backend: str, both_backends: Any) -> None:
    """The same config through either client: the engine holds the same container, and it runs."""
    config = SandboxConfig(backend=backend, pids_limit=64, memory_limit="256M")
    views = []
    for made_by in both_backends:
        sandbox = made_by.start(config, labels=TEST_LABELS)
        try:
            done = sandbox.execute(["python3", "-c", "import os; print(os.geteuid())"], timeout=30)
            assert (done.exit_code, done.stdout) == (0, "10001\n")
            attrs = sandbox.inspect()
        finally:
            sandbox.destroy()
        views.append(
            (
                {k: attrs["HostConfig"].get(k) for k in HOST_FIELDS},
                {k: attrs["Config"].get(k) for k in CONFIG_FIELDS},
            )
        )
    assert views[0] == views[1]
    assert views[0][0]["CapDrop"] == ["ALL"] and views[0][0]["ReadonlyRootfs"] is True


def test_a_kill_through_the_engine_is_read_from_its_events(both_backends: Any) -> None:
    """``ended`` reads the engine's event log (a chunked answer) through the thin client too."""
    thin, _ = both_backends
    sandbox = thin.start(SandboxConfig(), labels=TEST_LABELS)
    engine = thin.client_for(sandbox.config)
    try:
        engine.call("POST", f"/containers/{sandbox.id}/kill", doing="kill")
        end = sandbox.handle.ended()
    finally:
        sandbox.destroy()
    assert end.exit_code == 137 and end.killed_from_outside and not end.oom_killed


def test_errors_of_the_engine_are_the_backends(both_backends: Any) -> None:
    thin, _ = both_backends
    engine = thin.client_for(SandboxConfig())
    with pytest.raises(engine_api.EngineNotFoundError) as caught:
        engine.inspect_container("sandfleet-no-such-container")
    assert caught.value.status_code == 404 and "no-such-container" in caught.value.explanation
    with pytest.raises(engine_api.EngineImageNotFoundError):
        engine.images.get("sandfleet/no-such-image:0")
    with pytest.raises(SandboxError, match="Docker runtime 'nonexistent' is not registered"):
        thin.start(SandboxConfig(runtime="nonexistent"), labels=TEST_LABELS)


def test_a_missing_socket_is_no_engine(tmp_path: Any) -> None:
    engine = engine_api.EngineClient(str(tmp_path / "nothing.sock"))
    with pytest.raises(engine_api.EngineConnectionError) as caught:
        engine.ping()
    assert caught.value.strerror == "No such file or directory"


def test_an_info_asked_for_early_is_the_engines_and_so_is_its_error(
    tmp_path: Any, docker_engine: Any
) -> None:
    """``prefetch_info`` (the one-off commands ask while their modules load) changes when, not what."""
    engine = engine_api.from_env()
    assert engine is not None
    engine.prefetch_info()
    assert sorted(engine.info()["Runtimes"]) == sorted(docker_engine.runtimes)
    assert "Runtimes" in engine.info()  # taken once; later calls ask again
    gone = engine_api.EngineClient(str(tmp_path / "nothing.sock"))
    gone.prefetch_info()
    with pytest.raises(engine_api.EngineConnectionError, match="No such file or directory"):
        gone.info()
