"""The create body both engine clients send (spec.create_body) is the one the Docker SDK made from the
same container kwargs: the thin client (engine_api.py) changes how the engine is reached, never what
the sandbox is. Pure: no engine needed."""

from __future__ import annotations

from typing import Any

import docker
import pytest
from docker.models.containers import _create_container_args

from sandfleet.core.config import SandboxConfig
from sandfleet.worker.sandbox.docker.spec import Owner, container_kwargs, create_body

OWNER = Owner("testhost", 4242, 99)
API_VERSION = "1.41"  # Docker 20.10's, the oldest engine bootstrap installs
CONFIGS = [
    pytest.param({}, id="default"),
    pytest.param({"backend": "gvisor"}, id="gvisor"),
    pytest.param({"backend": "gvisor", "network": "full"}, id="gvisor-full"),
    pytest.param({"network": "full"}, id="runc-full"),
    pytest.param({"runtime": "crun"}, id="other-runtime-network-none"),
    pytest.param({"allow_sudo": True, "read_only_rootfs": False}, id="sudo-writable-root"),
    pytest.param(
        {"memory_limit": "512M", "disk_limit": "64M", "pids_limit": 64, "cpu_limit": 0.5}, id="limits"
    ),
    pytest.param({"env": {"A": "1", "B": "two words"}, "workdir": "/work"}, id="env-workdir"),
]


def sdk_body(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What ``docker.DockerClient.containers.create(**kwargs)`` posts, with the SDK's nulls left out
    (the engine reads a null as absent)."""
    client = docker.APIClient(base_url="unix:///nonexistent.sock", version=API_VERSION)
    args = _create_container_args({**kwargs, "version": API_VERSION})
    config = client.create_container_config(**args)
    return without_nulls(dict(config))


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    return value


@pytest.mark.parametrize("options", CONFIGS)
def test_the_body_is_the_sdks(options: dict[str, Any]) -> None:
    kwargs = container_kwargs(SandboxConfig(**options), owner=OWNER, host_ncpu=2, labels={"x": "y"})
    assert create_body(kwargs) == sdk_body(kwargs)


def test_read_only_mounts_are_the_sdks_binds() -> None:
    kwargs = container_kwargs(
        SandboxConfig(), owner=OWNER, host_ncpu=2, read_only_mounts={"/srv/wheels": "/wheels"}
    )
    body = create_body(kwargs)
    assert body == sdk_body(kwargs)
    assert body["HostConfig"]["Binds"] == ["/srv/wheels:/wheels:ro"]


@pytest.mark.parametrize(
    "left_out",
    [
        ("ulimits",),
        ("log_config",),
        ("environment",),
        ("tmpfs", "hostname", "ipc_mode"),
        ("security_opt", "cap_drop"),
    ],
)
def test_kwargs_left_out_are_left_out_as_the_sdk_does(left_out: tuple[str, ...]) -> None:
    """benchmarks/container_options.py and the isolation probe create variants without some options."""
    kwargs = container_kwargs(SandboxConfig(), owner=OWNER, host_ncpu=2)
    kwargs = {k: v for k, v in kwargs.items() if k not in left_out}
    assert create_body(kwargs) == sdk_body(kwargs)


def test_the_hardening_reaches_the_body() -> None:
    """What the isolation tests prove from inside is asked for in the body (read here by name)."""
    body = create_body(container_kwargs(SandboxConfig(pids_limit=64), owner=OWNER, host_ncpu=2))
    host = body["HostConfig"]
    assert body["User"] == "10001:10001" and body["NetworkDisabled"] is True
    assert host["ReadonlyRootfs"] is True and host["CapDrop"] == ["ALL"]
    assert host["SecurityOpt"] == ["no-new-privileges:true"] and host["PidsLimit"] == 64
    assert host["Memory"] == host["MemorySwap"] == 4 * 1024**3 and host["Runtime"] == "runc"


def test_an_option_with_no_translation_is_refused() -> None:
    """A new hardening option in container_kwargs cannot be dropped silently on the way to the engine."""
    kwargs = container_kwargs(SandboxConfig(), owner=OWNER, host_ncpu=2)
    with pytest.raises(ValueError, match="no translation to the Engine API: \\['device_cgroup_rules'\\]"):
        create_body({**kwargs, "device_cgroup_rules": ["c 1:3 r"]})
