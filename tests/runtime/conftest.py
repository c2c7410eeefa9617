"""Fixtures of the runtime tests: real containers, the real bridge, a real tools module.

pool            module: one SandboxPool (pool_size 1) shared by a module's tests; closed at its end
registry        module: the tools of bridge_tools.py, loaded by file path like any tools module
run             function: ``run(source, backend="docker", tools=None, **settings)`` -> RunResult
docker_client   session: the Docker SDK client, to check what exists on the engine
backend         function: "docker" (runc) or "gvisor" (runsc); a test taking it runs under both

Every container made here carries TEST_LABELS; at the end of the session none may be left.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sandfleet.core.config import DEFAULT_IMAGE, CodeActionSettings, SandboxConfig

from .helpers import BACKENDS, BRIDGE_TOOLS, TEST_LABEL, TEST_LABELS, skip_or_fail, wait_until

_ENGINE_USED: list[bool] = []  # set once a test reaches the engine: only then is the check worth a CLI call


def require_backend(info: Any, backend: str) -> None:
    """The engine's ``info`` has runsc (for gvisor) and the sandbox image, or skip locally / fail in CI."""
    if backend == "gvisor" and "runsc" not in info.runtimes:
        skip_or_fail("runsc is not registered")
    if DEFAULT_IMAGE not in info.images:
        skip_or_fail(f"image {DEFAULT_IMAGE} is missing; build it with `sandfleet images build`")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, docker_engine: Any) -> str:
    require_backend(docker_engine, request.param)
    return request.param


@pytest.fixture(scope="session")
def docker_client(docker_engine: Any) -> Iterator[Any]:
    import docker

    client = docker.from_env()
    _ENGINE_USED.append(True)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session", autouse=True)
def no_runtime_test_containers() -> Iterator[None]:
    """After the session, no container made by these tests exists (others' containers aside)."""
    yield
    if not _ENGINE_USED:
        return
    key, value = next(iter(TEST_LABELS.items()))
    left: list[str] = []

    def none_left() -> bool:
        proc = subprocess.run(
            ["docker", "ps", "-aq", "--filter", f"label={key}={value}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        left[:] = proc.stdout.split()
        return proc.returncode == 0 and not left

    assert wait_until(none_left, timeout_s=10, every_s=0.5), (
        f"containers of tests/runtime left behind: {left}"
    )


@pytest.fixture(scope="module")
def pool(request: pytest.FixtureRequest, docker_engine: Any, docker_client: Any) -> Iterator[Any]:
    from sandfleet.worker.sandbox.pool import SandboxPool

    require_backend(docker_engine, "docker")
    labels = {**TEST_LABELS, f"{TEST_LABEL}.module": request.module.__name__}
    with SandboxPool(pool_size=1, max_live=4, labels=labels) as shared:
        yield shared


@pytest.fixture(scope="module")
def registry() -> Any:
    from sandfleet.worker.tools.registry import ToolRegistry

    return ToolRegistry.from_modules([str(BRIDGE_TOOLS)])


@pytest.fixture
def run(pool: Any, registry: Any) -> Callable[..., Any]:
    """``run(source, backend="docker", tools=None, policy=None, job_id=None, **settings)`` -> RunResult."""
    from sandfleet.worker.program.bridge import allow_all
    from sandfleet.worker.program.runtime import ProgramRuntime

    def run_one(
        source: str,
        backend: str = "docker",
        tools: list[str] | None = None,
        policy: Any = None,
        job_id: str | None = None,
        registry_: Any = None,
        **settings: Any,
    ) -> Any:
        runtime = ProgramRuntime(pool, registry_ or registry, policy or allow_all)
        settings.setdefault("exec_timeout", 20)
        return runtime.run(
            source,
            config=SandboxConfig(backend=backend),
            settings=CodeActionSettings(**settings),
            tools=tools,
            job_id=job_id or f"test-{uuid.uuid4().hex[:8]}",
        )

    return run_one
