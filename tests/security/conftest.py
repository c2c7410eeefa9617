"""Fixtures of the security tests: a sandbox pool, a program runner per runtime, the results file.

pool          module: a SandboxPool (pool_size 1) for the module's runs, labelled as these tests'
run           function: ``run(source, runtime="runc", tools=None, sandbox=None, **settings)`` -> RunResult
runtime       function: "runc" or "runsc"; a test taking it runs under both
docker_client session: the Docker SDK client

Every run is followed by the leftover check: its container is gone (NotFound) and, under runsc, no
host process mentions its id any more.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sandfleet.core.config import DEFAULT_IMAGE, CodeActionSettings, SandboxConfig

from .helpers import BACKEND_OF, RUNTIMES, TEST_LABELS, assert_no_leftovers, skip_or_fail, write_results


@pytest.fixture(scope="session", autouse=True)
def security_results_file() -> Iterator[None]:
    yield
    write_results()


def require_runtime(info: Any, runtime: str) -> None:
    if runtime not in info.runtimes:
        skip_or_fail(f"{runtime} is not registered")
    if DEFAULT_IMAGE not in info.images:
        skip_or_fail(f"image {DEFAULT_IMAGE} is missing; build it with `sandfleet images build`")


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest, docker_engine: Any) -> str:
    require_runtime(docker_engine, request.param)
    return request.param


@pytest.fixture(scope="session")
def docker_client(docker_engine: Any) -> Iterator[Any]:
    import docker

    client = docker.from_env()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def pool(request: pytest.FixtureRequest, docker_engine: Any, docker_client: Any) -> Iterator[Any]:
    from sandfleet.worker.sandbox.pool import SandboxPool

    require_runtime(docker_engine, "runc")
    labels = {**TEST_LABELS, "sandfleet.test.module": request.module.__name__}
    with SandboxPool(pool_size=1, max_live=6, labels=labels) as shared:
        yield shared


def sandbox_config(runtime: str, **options: Any) -> SandboxConfig:
    return SandboxConfig(backend=BACKEND_OF[runtime], **options)  # type: ignore[arg-type]


@pytest.fixture
def run(pool: Any, docker_client: Any) -> Callable[..., Any]:
    """Run one program; afterwards assert that its container and (runsc) its processes are gone."""
    from sandfleet.worker.program.bridge import allow_all
    from sandfleet.worker.program.runtime import ProgramRuntime
    from sandfleet.worker.tools.registry import ToolRegistry

    def run_one(
        source: str,
        runtime: str = "runc",
        *,
        registry: Any = None,
        tools: list[str] | None = None,
        sandbox: dict[str, Any] | None = None,
        policy: Any = None,
        check_leftovers: bool = True,
        **settings: Any,
    ) -> Any:
        settings.setdefault("exec_timeout", 20)
        program_runtime = ProgramRuntime(pool, registry or ToolRegistry(), policy or allow_all)
        result = program_runtime.run(
            source,
            config=sandbox_config(runtime, **(sandbox or {})),
            settings=CodeActionSettings(**settings),
            tools=tools,
            job_id=f"sec-{uuid.uuid4().hex[:8]}",
        )
        if check_leftovers:
            assert_no_leftovers(docker_client, result.container_id)
        return result

    return run_one
