"""sandbox_install_package: from the operator's read-only wheelhouse (pip itself from a wheel there), and a
clear refusal when the sandbox has neither a network nor a wheelhouse. Real sessions, runc and gVisor."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandfleet_testing import skip_or_fail
from sandfleet_testing.wheels import DEBIAN_WHEELS, make_wheel

from sandfleet.core.config import SandboxConfig, ToolLoopSettings
from sandfleet.worker.engine.shell.keeper import SessionKeeper
from sandfleet.worker.engine.shell.tools import PackageSources, ShellTools

from .helpers import shell_settings


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Path:
    pips = sorted(DEBIAN_WHEELS.glob("pip-*.whl"))
    if not pips:
        skip_or_fail(f"no pip wheel in {DEBIAN_WHEELS} (apt-get install python3-pip-whl)")
    folder = tmp_path / "wheelhouse"
    folder.mkdir()
    (folder / pips[-1].name).write_bytes(pips[-1].read_bytes())
    make_wheel(folder, "tinypkg", "1.0", "VALUE = 42\n")
    folder.chmod(0o777)  # writable by anyone: only the read-only mount can stop the sandbox writing there
    return folder


@pytest.fixture
def keeper_with(docker_engine: object) -> Iterator[list[SessionKeeper]]:
    keepers: list[SessionKeeper] = []
    yield keepers
    for keeper in keepers:
        keeper.close()


def tools_on(keeper: SessionKeeper, backend: str, job_id: str) -> ShellTools:
    session = keeper.open(
        SandboxConfig(backend=backend), job_id=job_id, lifetime_s=120, idle_s=120, wait_s=30
    )
    return ShellTools(
        session,
        caps=ToolLoopSettings(),
        settings=keeper.settings,
        deadline=time.monotonic() + 300,
        sources=PackageSources("none", keeper.wheelhouse),
    )


def test_install_from_the_operators_wheelhouse(
    wheelhouse: Path, keeper_with: list[SessionKeeper], backend: str, job_id: str
) -> None:
    keeper = SessionKeeper(shell_settings(wheelhouse_dir=str(wheelhouse)))
    keeper_with.append(keeper)
    tools = tools_on(keeper, backend, job_id)
    assert tools.sandbox_exec("python3 -c 'import tinypkg'")["exit_code"] == 1  # not there yet
    message = tools.sandbox_install_package("tinypkg==1.0")
    assert message.startswith("installed tinypkg==1.0 from the operator's wheelhouse")
    done = tools.sandbox_exec("python3 -c 'import tinypkg; print(tinypkg.VALUE)'")
    assert done["stdout"] == "42\n", done
    # The wheelhouse is mounted read-only: the sandbox cannot change what the next job installs.
    write = tools.sandbox_exec("echo bad > /opt/sandfleet/wheelhouse/evil.whl")
    assert write["exit_code"] != 0 and "Read-only file system" in write["stderr"]
    assert not (wheelhouse / "evil.whl").exists()
    with pytest.raises(RuntimeError, match="pip could not install nosuchpkg"):
        tools.sandbox_install_package("nosuchpkg")


def test_no_network_and_no_wheelhouse_is_a_clear_refusal(
    keeper: SessionKeeper, backend: str, job_id: str
) -> None:
    tools = tools_on(keeper, backend, job_id)
    with pytest.raises(
        PermissionError, match=r"no network \(network=none\) and the operator mounted no wheelhouse"
    ):
        tools.sandbox_install_package("requests")


@pytest.mark.parametrize("name", ["requests; rm -rf /", "-e .", "pkg==1.0 other", "", "../x"])
def test_a_name_that_is_not_a_package_is_refused(keeper: SessionKeeper, job_id: str, name: str) -> None:
    tools = tools_on(keeper, "docker", job_id)
    with pytest.raises(ValueError, match="give a package name"):
        tools.sandbox_install_package(name)
