"""Package installs through the allow-list from a private mirror: shell mode's ``sandbox_install_package``
in a restricted session sandbox (runc and gVisor) installs a wheel this test builds from a PEP 503
index on the test HTTPS service (SANDFLEET_EGRESS_PIP_INDEX_URL, its CA from SANDFLEET_EGRESS_CA_FILE,
pip itself from the operator's wheelhouse: the images have no pip). A session whose allow-list lacks
the mirror gets the proxy's refusal, named in the tool's error and in the session's denials."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox.helpers import BACKENDS
from sandfleet_testing import skip_or_fail
from sandfleet_testing.wheels import DEBIAN_WHEELS, publish

from sandfleet.core.config import SandboxConfig, ToolLoopSettings
from sandfleet.core.settings import get_settings
from sandfleet.worker.engine.shell.keeper import SessionKeeper
from sandfleet.worker.engine.shell.tools import PackageSources, ShellTools

PACKAGE = "sfmirrorpkg"


@pytest.fixture(scope="module")
def pip_wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator's wheelhouse holding pip alone (the packages come from the mirror)."""
    pips = sorted(DEBIAN_WHEELS.glob("pip-*.whl"))
    if not pips:
        skip_or_fail(f"no pip wheel in {DEBIAN_WHEELS} (apt-get install python3-pip-whl)")
    folder = tmp_path_factory.mktemp("pip-wheelhouse")
    shutil.copyfile(pips[-1], folder / pips[-1].name)
    folder.chmod(0o755)
    return folder


@pytest.fixture
def keeper(egress_env: dict[str, Any], pip_wheelhouse: Path) -> Iterator[SessionKeeper]:
    settings = get_settings().model_copy(update={"wheelhouse_dir": str(pip_wheelhouse), "max_sessions": 2})
    sessions = SessionKeeper(settings)
    yield sessions
    sessions.close()


def tools_for(keeper: SessionKeeper, backend: str, allow_hosts: list[str]) -> ShellTools:
    config = SandboxConfig(backend=backend, network="restricted", allow_hosts=allow_hosts)
    session = keeper.open(
        config, job_id=f"mirror-test-{uuid.uuid4().hex[:8]}", lifetime_s=180, idle_s=180, wait_s=30
    )
    return ShellTools(
        session,
        caps=ToolLoopSettings(),
        settings=keeper.settings,
        deadline=time.monotonic() + 300,
        sources=PackageSources("restricted", keeper.wheelhouse),
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_install_from_the_private_mirror_through_the_proxy(
    keeper: SessionKeeper, service: Any, backend: str
) -> None:
    publish(service.index, PACKAGE, "1.0", "VALUE = 'from the mirror'\n")
    tools = tools_for(keeper, backend, ["mirror.egress.test"])
    message = tools.sandbox_install_package(f"{PACKAGE}==1.0")
    assert message.startswith(f"installed {PACKAGE}==1.0 from the package index through the egress proxy")
    done = tools.sandbox_exec(f"python3 -c 'import {PACKAGE}; print({PACKAGE}.VALUE)'")
    assert done["stdout"] == "from the mirror\n", done
    assert tools.session.network_denied == []
    # pip asked the mirror for the project page and the wheel, through the proxy, by name.
    env = tools.sandbox_exec("env | grep -E '^(PIP_INDEX_URL|PIP_CERT|HTTPS_PROXY)=' | sort")["stdout"]
    assert (
        "PIP_INDEX_URL=https://mirror.egress.test/simple" in env
        and "PIP_CERT=/opt/sandfleet/egress/ca.pem" in env
    )
    keeper.close_session(tools.session)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mirror_off_the_list_fails_with_the_proxys_refusal(
    keeper: SessionKeeper, service: Any, backend: str
) -> None:
    publish(service.index, PACKAGE, "1.0", "VALUE = 'from the mirror'\n")
    tools = tools_for(keeper, backend, ["api.egress.test"])
    with pytest.raises(RuntimeError) as refused:
        tools.sandbox_install_package(f"{PACKAGE}==1.0")
    message = str(refused.value)
    assert message.startswith(
        f"pip could not install {PACKAGE}==1.0: the egress proxy refused mirror.egress.test:443 "
        "(the name is not in the allow-list)"
    ), message
    assert {(d["host"], d["port"]) for d in tools.session.network_denied} == {("mirror.egress.test", 443)}
    assert "network" in tools.session.limits_hit
    assert tools.sandbox_exec(f"python3 -c 'import {PACKAGE}'")["exit_code"] == 1
    keeper.close_session(tools.session)
