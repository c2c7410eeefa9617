"""Fixtures of the MCP tests: real MCP servers (the PyPI reference servers over stdio, the tests' own
servers over stdio and streamable HTTP), a git repository and the reference data.

lab_http   module: tests/mcp_tools/servers/lab.py over streamable HTTP (its data folder has orders.csv)
odd_http   module: tests/mcp_tools/servers/odd.py over streamable HTTP
git_repo   function: a fresh git repository with two commits
lab_data   module: the folder of the reference orders the lab server reads
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandfleet_testing import skip_or_fail

from .helpers import LAB, ODD, HttpServer, make_repo


@pytest.fixture(scope="module")
def lab_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sandfleet.worker.tools.examples.scenario import write_reference_data

    folder = tmp_path_factory.mktemp("lab-data")
    write_reference_data(folder)
    return folder


@pytest.fixture(scope="module")
def lab_http(lab_data: Path) -> Iterator[HttpServer]:
    server = HttpServer(LAB, "--data", str(lab_data)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def odd_http() -> Iterator[HttpServer]:
    server = HttpServer(ODD).start()
    yield server
    server.stop()


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        skip_or_fail("git is not installed (deploy/bootstrap.sh installs it)")
    return make_repo(tmp_path / "repo")


@pytest.fixture(scope="module")
def pool(docker_engine: Any) -> Iterator[object]:
    """A sandbox pool for the module's programs (its containers carry this package's label)."""
    from sandfleet.core.config import DEFAULT_IMAGE
    from sandfleet.worker.sandbox.pool import SandboxPool

    if DEFAULT_IMAGE not in docker_engine.images:
        skip_or_fail(f"image {DEFAULT_IMAGE} is missing; build it with `sandfleet images build`")
    with SandboxPool(pool_size=1, max_live=4, labels={"sandfleet.test": "tests/mcp_tools"}) as shared:
        yield shared
