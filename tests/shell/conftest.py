"""Fixtures of the shell-mode tests: real session sandboxes under runc and gVisor, and their tools.

keeper       function: a SessionKeeper (max 2 sessions) closed after the test; fails if a session
             container of this test outlives it
backend      parametrized "docker" (runc) and "gvisor" (runsc; skips locally, fails in CI without it)
open_tools   function: ``open_tools(**caps) -> ShellTools`` on a fresh session of ``backend``
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sandfleet_testing import skip_or_fail

from sandfleet.core.config import DEFAULT_IMAGE, SandboxConfig, ToolLoopSettings
from sandfleet.core.settings import Settings
from sandfleet.worker.engine.shell.keeper import SessionKeeper
from sandfleet.worker.engine.shell.tools import PackageSources, ShellTools

from .helpers import gone, shell_settings


@pytest.fixture(params=["docker", "gvisor"])
def backend(request: pytest.FixtureRequest, docker_engine: Any) -> str:
    info = request.getfixturevalue("gvisor") if request.param == "gvisor" else docker_engine
    if DEFAULT_IMAGE not in info.images:
        skip_or_fail(f"image {DEFAULT_IMAGE} is missing; build it with `sandfleet images build`")
    return str(request.param)


@pytest.fixture
def keeper(docker_engine: Any) -> Iterator[SessionKeeper]:
    sessions = SessionKeeper(shell_settings())
    yield sessions
    sessions.close()


@pytest.fixture
def job_id() -> str:
    return f"shell-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def open_tools(keeper: SessionKeeper, backend: str, job_id: str) -> Iterator[Callable[..., ShellTools]]:
    opened: list[ShellTools] = []

    def open_(
        *, settings: Settings | None = None, lifetime_s: float = 120, idle_s: float = 120, **caps: Any
    ) -> ShellTools:
        session = keeper.open(
            SandboxConfig(backend=backend), job_id=job_id, lifetime_s=lifetime_s, idle_s=idle_s, wait_s=30
        )
        tools = ShellTools(
            session,
            caps=ToolLoopSettings(**caps),
            settings=settings or keeper.settings,
            deadline=time.monotonic() + 600,
            sources=PackageSources("none", keeper.wheelhouse),
        )
        opened.append(tools)
        return tools

    yield open_
    for tools in opened:
        keeper.close_session(tools.session)
    assert all(gone(t.session.container.id) for t in opened), "a session sandbox outlived its test"
