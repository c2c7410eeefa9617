"""The isolation probe (docker/probe.py), on which benchmarks/oci_runtimes.py's verdict "isolates as
runc does" stands: it sees the sandbox runc makes from spec.py's options as locked down, and each
weakened option as the weakness it is, so an equal view means something."""

from __future__ import annotations

from typing import Any

import pytest

from sandfleet.core.config import SandboxConfig

from .helpers import plain_container_labels


def sandbox_options(**changes: Any) -> dict[str, Any]:
    """spec.container_kwargs of a default runc sandbox, owned by this process, with ``changes``."""
    from sandfleet.worker.sandbox.docker import backend as engine
    from sandfleet.worker.sandbox.docker.spec import Owner, container_kwargs

    kwargs = container_kwargs(SandboxConfig(), owner=Owner.current(), host_ncpu=engine.engine_info().ncpu)
    return {**kwargs, "labels": {**kwargs["labels"], **plain_container_labels("sandbox")}, **changes}


def view(**changes: Any) -> dict[str, Any]:
    from sandfleet.worker.sandbox.docker.backend import docker_client
    from sandfleet.worker.sandbox.docker.probe import isolation_view

    return isolation_view(docker_client(), sandbox_options(**changes))


@pytest.fixture(scope="module")
def sandbox_view(docker_engine: Any) -> dict[str, Any]:
    return view()


def test_the_probe_sees_the_sandbox_locked_down(sandbox_view: dict[str, Any]) -> None:
    seen = sandbox_view
    assert seen["ids"][:2] == [10001, 10001]
    assert seen["status"]["CapEff"] == seen["status"]["CapBnd"] == "0000000000000000"
    assert seen["status"]["NoNewPrivs"] == "1" and seen["status"]["Seccomp"] == "2"
    assert set(seen["syscalls"].values()) <= {"EPERM", "ENOSYS", "EACCES"}, seen["syscalls"]
    assert seen["writable"] == {
        "/probe": "EROFS",
        "/etc/probe": "EROFS",
        "/tmp/probe": "written",
        "/workspace/probe": "written",
    }
    assert seen["interfaces"] == ["lo"]
    assert seen["cgroup"]["pids"] == str(SandboxConfig().pids_limit)
    assert ["/", "overlay", ["ro"]] in seen["mounts"]


@pytest.mark.parametrize(
    ("changes", "aspect"),
    [
        ({"cap_drop": None}, "status"),  # Docker's default capabilities
        ({"security_opt": []}, "status"),  # no no-new-privileges
        ({"read_only": False}, "writable"),
        ({"network_disabled": False, "network_mode": "bridge"}, "interfaces"),
        ({"pids_limit": None}, "cgroup"),
        ({"user": "0:0"}, "ids"),
    ],
    ids=["capabilities", "no-new-privileges", "writable root", "a network", "no pids limit", "root"],
)
def test_a_weakened_sandbox_looks_weaker_to_the_probe(
    sandbox_view: dict[str, Any], changes: dict[str, Any], aspect: str
) -> None:
    from sandfleet.worker.sandbox.docker.probe import view_differences

    assert aspect in view_differences(sandbox_view, view(**changes))
