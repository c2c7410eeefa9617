"""The operator's policy on sandbox options (sandfleet/worker/sandbox/policy.py): pure, no engine needed.

Deny by default for every SandboxConfig option a job could widen its sandbox with; each refusal names
the option and the SANDFLEET_POLICY_* variable, and setting that very variable (read from the
environment, as a worker reads it) is what lets the same job through. Replays get network none and the
local policy. The hostile tests through a real worker are in tests/security/test_hostile_sandbox_options.py.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from sandfleet.core.config import DATA_SCIENCE_IMAGE, SandboxConfig
from sandfleet.core.errors import PolicyViolationError
from sandfleet.core.settings import DEFAULT_POLICY_RUNTIMES, Settings
from sandfleet.worker.sandbox.policy import check_sandbox_policy, policy_problems, replay_sandbox

# Each widening a job could ask for: its options, the refusal the default policy gives, and the
# environment of an operator who allows it.
WIDENINGS: dict[str, tuple[dict[str, Any], str, dict[str, str]]] = {
    "allow_sudo": (
        {"allow_sudo": True},
        "sandbox allow_sudo is not allowed by the operator (SANDFLEET_POLICY_ALLOW_SUDO=false)",
        {"SANDFLEET_POLICY_ALLOW_SUDO": "true"},
    ),
    "read_only_rootfs": (
        {"read_only_rootfs": False},
        "sandbox read_only_rootfs=false is not allowed by the operator "
        "(SANDFLEET_POLICY_ALLOW_WRITABLE_ROOTFS=false)",
        {"SANDFLEET_POLICY_ALLOW_WRITABLE_ROOTFS": "true"},
    ),
    "runtime": (
        {"runtime": "kata"},
        "sandbox runtime 'kata' is not allowed by the operator "
        "(SANDFLEET_POLICY_RUNTIMES=runc,runsc,runsc-net,runsc-egress)",
        {"SANDFLEET_POLICY_RUNTIMES": "runc,kata"},
    ),
    "env": (
        {"env": {"LD_PRELOAD": "/tmp/x.so", "PATH": "/tmp"}},
        "sandbox env LD_PRELOAD, PATH is not allowed by the operator (SANDFLEET_POLICY_ENV_NAMES is empty)",
        {"SANDFLEET_POLICY_ENV_NAMES": "PATH,LD_*"},
    ),
    "workdir": (
        {"workdir": "/etc"},
        "sandbox workdir '/etc' is not allowed by the operator (SANDFLEET_POLICY_WORKDIRS=/workspace)",
        {"SANDFLEET_POLICY_WORKDIRS": "/workspace,/etc"},
    ),
    "cpu_limit": (
        {"cpu_limit": 1},
        "sandbox cpu_limit 1 is above the operator's ceiling of 0.5 (SANDFLEET_POLICY_MAX_CPUS)",
        {"SANDFLEET_POLICY_MAX_CPUS": "1"},
    ),
    "memory_limit": (
        {"memory_limit": "16G"},
        "sandbox memory_limit 16G is above the operator's ceiling of 8G (SANDFLEET_POLICY_MAX_MEMORY)",
        {"SANDFLEET_POLICY_MAX_MEMORY": "16G"},
    ),
    "disk_limit": (
        {"disk_limit": "4G"},
        "sandbox disk_limit 4G is above the operator's ceiling of 2G (SANDFLEET_POLICY_MAX_DISK)",
        {"SANDFLEET_POLICY_MAX_DISK": "4G"},
    ),
    "pids_limit": (
        {"pids_limit": 4096},
        "sandbox pids_limit 4096 is above the operator's ceiling of 512 (SANDFLEET_POLICY_MAX_PIDS)",
        {"SANDFLEET_POLICY_MAX_PIDS": "4096"},
    ),
    "timeout": (
        {"timeout": 1200},
        "sandbox timeout 1200 s is above the operator's ceiling of 600 s "
        "(SANDFLEET_POLICY_MAX_SANDBOX_TIMEOUT_S)",
        {"SANDFLEET_POLICY_MAX_SANDBOX_TIMEOUT_S": "1200"},
    ),
    "network": (
        {"network": "full"},
        "sandbox network 'full' is not allowed by the operator (SANDFLEET_POLICY_NETWORKS=none)",
        {"SANDFLEET_POLICY_NETWORKS": "none,full"},
    ),
    "allow_hosts": (
        {"network": "restricted", "allow_hosts": ["pypi.org"]},
        "network 'restricted' needs the operator to allow hosts (SANDFLEET_POLICY_ALLOW_HOSTS is empty)",
        {"SANDFLEET_POLICY_NETWORKS": "none,restricted", "SANDFLEET_POLICY_ALLOW_HOSTS": "pypi.org"},
    ),
    "image": (
        {"image": "alpine:latest"},
        "sandbox image 'alpine:latest' is not allowed by the operator "
        "(SANDFLEET_POLICY_IMAGES=sandfleet/sandbox:py3.11,sandfleet/sandbox-ds:py3.11)",
        {"SANDFLEET_POLICY_IMAGES": "sandfleet/sandbox:py3.11,alpine:*"},
    ),
}
# Options that widen nothing by themselves: backend picks a runtime (checked as runtime); persistent is
# refused for every job, whatever the policy (below).
NOT_A_WIDENING = {"backend", "persistent"}
# The operator of a refusal, where not the default: e.g. a CPU ceiling below every host's CPU count (a
# cpu_limit above the host's is refused by SandboxConfig already, so the default ceiling of 4 cannot be
# passed on a small host).
REFUSING = {
    "cpu_limit": {"SANDFLEET_POLICY_MAX_CPUS": "0.5"},
    "allow_hosts": {"SANDFLEET_POLICY_NETWORKS": "none,restricted"},  # else the network is refused first
}


@pytest.fixture
def operator(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Settings as a worker reads them from its environment: ``operator(VAR=value, ...)``."""
    for name in list(os.environ):
        if name.startswith("SANDFLEET_"):
            monkeypatch.delenv(name)

    def settings(**env: str) -> Settings:
        for name in list(os.environ):
            if name.startswith("SANDFLEET_"):
                monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return Settings()

    return settings


def test_every_option_of_the_sandbox_has_a_policy_decision() -> None:
    assert set(SandboxConfig.model_fields) == set(WIDENINGS) | NOT_A_WIDENING


@pytest.mark.parametrize("option", WIDENINGS)
def test_each_widening_is_refused_by_default_naming_option_and_variable(operator: Any, option: str) -> None:
    options, expected, _allow = WIDENINGS[option]
    with pytest.raises(PolicyViolationError) as caught:
        check_sandbox_policy(SandboxConfig.model_validate(options), operator(**REFUSING.get(option, {})))
    assert str(caught.value) == expected


@pytest.mark.parametrize("option", WIDENINGS)
def test_the_variable_the_refusal_names_is_the_one_that_allows_it(operator: Any, option: str) -> None:
    options, expected, allow = WIDENINGS[option]
    named = set(re.findall(r"SANDFLEET_POLICY_[A-Z_]+", expected))
    assert named <= set(allow), "the variable the message names is the one that allows it"
    assert policy_problems(SandboxConfig.model_validate(options), operator(**allow)) == []


def test_the_defaults_of_the_project_pass_the_default_policy(operator: Any) -> None:
    """What the project's own tests, demo and compose file ask of a job's sandbox (grep -o and sandbox=)."""
    settings = operator()
    for options in (
        {},
        {"backend": "gvisor"},
        {"image": DATA_SCIENCE_IMAGE},
        {"memory_limit": "256M", "disk_limit": "64M"},
        {"cpu_limit": 0.5, "pids_limit": 64, "timeout": 60, "workdir": "/workspace/job"},
    ):
        assert policy_problems(SandboxConfig.model_validate(options), settings) == [], options


def test_a_job_may_narrow_but_a_lookalike_is_not_within(operator: Any) -> None:
    settings = operator(SANDFLEET_POLICY_ENV_NAMES="LANG,TZ_*", SANDFLEET_POLICY_WORKDIRS="/workspace")
    assert (
        policy_problems(SandboxConfig(env={"LANG": "C", "TZ_NAME": "UTC"}, workdir="/workspace/a"), settings)
        == []
    )
    problems = policy_problems(SandboxConfig(env={"TZ": "UTC", "lang": "C"}, workdir="/workspace2"), settings)
    assert problems == [
        "sandbox env TZ, lang is not allowed by the operator (SANDFLEET_POLICY_ENV_NAMES=LANG,TZ_*)",
        "sandbox workdir '/workspace2' is not allowed by the operator (SANDFLEET_POLICY_WORKDIRS=/workspace)",
    ]


def test_every_problem_is_named_at_once(operator: Any) -> None:
    """``-o allow_sudo=true -o read_only_rootfs=false`` is refused naming both, not one at a time."""
    with pytest.raises(PolicyViolationError) as caught:
        check_sandbox_policy(SandboxConfig(allow_sudo=True, read_only_rootfs=False), operator())
    assert str(caught.value) == (
        "sandbox allow_sudo is not allowed by the operator (SANDFLEET_POLICY_ALLOW_SUDO=false); "
        "sandbox read_only_rootfs=false is not allowed by the operator "
        "(SANDFLEET_POLICY_ALLOW_WRITABLE_ROOTFS=false)"
    )


def test_a_persistent_sandbox_is_refused_whatever_the_policy(operator: Any) -> None:
    wide = operator(
        SANDFLEET_POLICY_ALLOW_SUDO="true",
        SANDFLEET_POLICY_ALLOW_WRITABLE_ROOTFS="true",
        SANDFLEET_POLICY_NETWORKS="none,restricted,full",
        SANDFLEET_POLICY_ENV_NAMES="*",
        SANDFLEET_POLICY_WORKDIRS="/",
        SANDFLEET_POLICY_IMAGES="*",
    )
    assert policy_problems(SandboxConfig(persistent=True), wide) == [
        "sandbox persistent is not allowed: jobs run in single-use sandboxes (no setting allows it)"
    ]


def test_the_backend_is_judged_by_the_runtime_it_picks(operator: Any) -> None:
    only_runc = operator(SANDFLEET_POLICY_RUNTIMES="runc")
    assert policy_problems(SandboxConfig(backend="gvisor"), only_runc) == [
        "sandbox runtime 'runsc' (backend gvisor) is not allowed by the operator (SANDFLEET_POLICY_RUNTIMES=runc)"
    ]
    assert policy_problems(SandboxConfig(backend="gvisor"), operator()) == []


def test_an_empty_list_is_the_default_never_anything(operator: Any) -> None:
    settings = operator(
        SANDFLEET_POLICY_RUNTIMES="", SANDFLEET_POLICY_IMAGES="", SANDFLEET_POLICY_WORKDIRS=""
    )
    assert tuple(settings.policy_runtimes) == DEFAULT_POLICY_RUNTIMES
    assert policy_problems(SandboxConfig(runtime="kata", image="alpine", workdir="/etc"), settings) == [
        "sandbox image 'alpine' is not allowed by the operator "
        "(SANDFLEET_POLICY_IMAGES=sandfleet/sandbox:py3.11,sandfleet/sandbox-ds:py3.11)",
        "sandbox runtime 'kata' is not allowed by the operator "
        "(SANDFLEET_POLICY_RUNTIMES=runc,runsc,runsc-net,runsc-egress)",
        "sandbox workdir '/etc' is not allowed by the operator (SANDFLEET_POLICY_WORKDIRS=/workspace)",
    ]


def test_a_relative_workdir_setting_is_refused(operator: Any) -> None:
    with pytest.raises(ValueError, match="workdirs must be absolute folders, got data"):
        operator(SANDFLEET_POLICY_WORKDIRS="/workspace,data")


# ---- replays ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["docker", "gvisor"])
def test_a_replay_gets_network_none_even_where_the_policy_allows_more(operator: Any, backend: str) -> None:
    wide = operator(SANDFLEET_POLICY_NETWORKS="none,restricted,full", SANDFLEET_POLICY_ALLOW_HOSTS="pypi.org")
    for recorded in (
        {"backend": backend, "network": "full"},
        {"backend": backend, "network": "restricted", "allow_hosts": ["pypi.org"]},
    ):
        config = replay_sandbox(recorded, wide)
        assert (config.network, config.allow_hosts) == ("none", ())
        assert config.docker_runtime == ("runc" if backend == "docker" else "runsc")  # not runsc-net/-egress


def test_a_replay_is_refused_what_the_local_policy_refuses(operator: Any) -> None:
    forged = {"network": "full", "allow_sudo": True, "read_only_rootfs": False}
    with pytest.raises(PolicyViolationError) as caught:
        replay_sandbox(forged, operator())
    assert str(caught.value) == (
        "sandbox allow_sudo is not allowed by the operator (SANDFLEET_POLICY_ALLOW_SUDO=false); "
        "sandbox read_only_rootfs=false is not allowed by the operator "
        "(SANDFLEET_POLICY_ALLOW_WRITABLE_ROOTFS=false)"
    )
    allowing = operator(SANDFLEET_POLICY_ALLOW_SUDO="true", SANDFLEET_POLICY_ALLOW_WRITABLE_ROOTFS="true")
    config = replay_sandbox(forged, allowing)
    assert (config.allow_sudo, config.read_only_rootfs, config.network) == (True, False, "none")


def test_a_recorded_sandbox_that_is_not_valid_here_is_refused(operator: Any) -> None:
    with pytest.raises(
        PolicyViolationError,
        match="the recorded sandbox options are not valid here: options: unknown option 'privileged'",
    ):
        replay_sandbox({"privileged": True}, operator())
