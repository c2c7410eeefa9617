"""Fixtures of the sandbox tests: real containers under runc ("docker") and runsc ("gvisor").

Tests that apply to both runtimes take ``backend`` (or ``shared_session``) and so run once per
backend. The gVisor variant is skipped only when ``runsc`` is not registered, and in CI that is a
failure (see tests/conftest.py). Every container made here carries TEST_LABELS besides Sandfleet's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sandfleet.core.config import DEFAULT_IMAGE, SandboxConfig

from .helpers import BACKENDS, TEST_LABELS, skip_or_fail


def require_backend(info: Any, backend: str) -> None:
    """The engine's ``info`` has runsc (for gvisor) and the sandbox image, or skip locally / fail in CI."""
    if backend == "gvisor" and "runsc" not in info.runtimes:
        skip_or_fail("runsc is not registered")
    if DEFAULT_IMAGE not in info.images:
        skip_or_fail(f"image {DEFAULT_IMAGE} is missing; build it with `sandfleet images build`")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, docker_engine: Any) -> str:
    """ "docker" (runc) or "gvisor" (runsc): a test taking it runs under both."""
    require_backend(docker_engine, request.param)
    return request.param


@pytest.fixture(scope="module", params=BACKENDS)
def shared_session(request: pytest.FixtureRequest, docker_engine: Any) -> Iterator[Any]:
    """One default sandbox per backend, shared by the tests of a module that need no fresh one."""
    from sandfleet.worker.sandbox.manager import SandboxManager

    require_backend(docker_engine, request.param)
    with SandboxManager(SandboxConfig(backend=request.param)) as manager:
        yield manager.create_session(labels=TEST_LABELS)


@pytest.fixture
def open_session(docker_engine: Any) -> Iterator[Callable[..., Any]]:
    """``open_session(backend, **options)`` -> a fresh session, closed when the test ends."""
    from sandfleet.worker.sandbox.manager import SandboxManager

    managers: list[Any] = []

    def open_one(backend: str, **options: Any) -> Any:
        manager = SandboxManager(SandboxConfig(backend=backend, **options))
        managers.append(manager)
        return manager.create_session(labels=TEST_LABELS)

    try:
        yield open_one
    finally:
        for manager in managers:
            manager.close()


@pytest.fixture(scope="module", autouse=True)
def no_containers_of_ours_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each module that used the engine: no container labelled TEST_LABELS is left (CLI runs are
    checked by run_cli).

    tests/conftest.py checks every Sandfleet container at the end of the session; on an engine shared
    with other people's runs that includes theirs, so this check looks only at ours.
    """
    yield
    ran = [i for i in request.session.items if i.path == request.path and i.get_closest_marker("docker")]
    if not ran:
        return  # a module of pure tests (or run with -m "not docker"): it asked nothing of the engine
    from sandfleet.core.errors import SandfleetError
    from sandfleet.worker.sandbox.docker.backend import docker_client

    try:
        client = docker_client()
    except SandfleetError:
        return  # no engine (or no SDK): nothing can be left
    wanted = [f"{k}={v}" for k, v in TEST_LABELS.items()]
    ours = {c["Id"][:12] for c in client.api.containers(all=True, filters={"label": wanted})}
    assert not ours, f"containers of tests/sandbox left behind: {sorted(ours)}"
