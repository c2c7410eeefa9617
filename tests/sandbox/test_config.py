"""SandboxConfig rules and the container spec built from it: pure, no engine needed."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from sandfleet.core.config import DEFAULT_IMAGE, SandboxConfig
from sandfleet.worker.sandbox.docker.backend import LABEL_CONFIG, LABEL_OWNER, LABEL_PERSISTENT, LABEL_ROLE
from sandfleet.worker.sandbox.docker.spec import (
    BOOT,
    SANDBOX_UID,
    Owner,
    base_env,
    command_env,
    container_kwargs,
)

OPTIONS = (
    "backend",
    "image",
    "cpu_limit",
    "memory_limit",
    "disk_limit",
    "pids_limit",
    "network",
    "persistent",
    "timeout",
    "workdir",
    "env",
    "allow_sudo",
    "runtime",
    "read_only_rootfs",
    "allow_hosts",
)
OWNER = Owner("testhost", 4242, 99)
GiB = 1024**3
MiB = 1024**2


def kwargs_of(config: SandboxConfig | None = None, **extra: object) -> dict:
    return container_kwargs(config or SandboxConfig(), owner=OWNER, host_ncpu=2, **extra)  # type: ignore[arg-type]


def refusal(data: dict) -> str:
    with pytest.raises(ValidationError) as caught:
        SandboxConfig.model_validate(data)
    return str(caught.value)


# ---- SandboxConfig ------------------------------------------------------------------------------


def test_options_are_exactly_the_documented_ones() -> None:
    assert tuple(SandboxConfig.model_fields) == OPTIONS


def test_defaults_are_the_locked_down_choice() -> None:
    config = SandboxConfig()
    assert config.backend == "docker"
    assert config.network == "none"
    assert config.cpu_limit == 2.0
    assert config.memory_limit == 4 * GiB
    assert config.disk_limit == 1 * GiB
    assert config.pids_limit == 256
    assert config.read_only_rootfs is True
    assert config.allow_sudo is False
    assert config.persistent is False
    assert config.workdir == "/workspace"
    assert config.image == DEFAULT_IMAGE == "sandfleet/sandbox:py3.11"
    assert config.env == {}
    assert config.docker_runtime == "runc"


@pytest.mark.parametrize("data", [{}, {"memory_limit": "512M"}, {"cpu_limit": 1, "pids_limit": 64}])
def test_partial_options_keep_network_none(data: dict) -> None:
    assert SandboxConfig.model_validate(data).network == "none"


def test_unknown_option_is_refused_listing_every_valid_option() -> None:
    message = refusal({"memory_limit": "512M", "colour": "blue"})
    assert "unknown option 'colour'" in message
    assert "valid options are: " + ", ".join(OPTIONS) in message


def test_network_mode_gets_a_hint() -> None:
    message = refusal({"network_mode": "none"})
    assert '\'network_mode\' (use `network` ("none", "restricted" or "full"))' in message
    assert "valid options are:" in message


@pytest.mark.parametrize(
    ("name", "hint"),
    [("mem_limit", "memory_limit"), ("cpus", "cpu_limit"), ("read_only", "read_only_rootfs")],
)
def test_other_tools_names_get_hints(name: str, hint: str) -> None:
    assert f"use `{hint}`" in refusal({name: 1})


def test_several_unknown_options_are_all_named() -> None:
    message = refusal({"foo": 1, "bar": 2})
    assert "unknown options 'foo', 'bar'" in message


@pytest.mark.parametrize(
    ("written", "size"),
    [
        ("512M", 512 * MiB),
        ("1G", GiB),
        ("1g", GiB),
        ("64m", 64 * MiB),
        (268435456, 256 * MiB),
        ("268435456", 256 * MiB),
        ("1.5G", 1536 * MiB),
        ("2GiB", 2 * GiB),
    ],
)
def test_sizes_accept_suffixes_and_bytes(written: object, size: int) -> None:
    assert SandboxConfig(memory_limit=written, disk_limit=written).memory_limit == size  # type: ignore[arg-type]
    assert SandboxConfig(disk_limit=written).disk_limit == size  # type: ignore[arg-type]


@pytest.mark.parametrize("written", ["12Q", "lots", "", "1.5.5G", "-512M"])
def test_bad_sizes_are_refused_with_the_accepted_forms(written: str) -> None:
    message = refusal({"memory_limit": written})
    assert "memory_limit" in message
    assert "not a size" in message
    assert "512M, 1G" in message


def test_negative_memory_is_refused_with_the_range() -> None:
    message = refusal({"memory_limit": -512 * MiB})
    assert "memory_limit must be between 32M and 1T" in message


def test_tiny_disk_is_refused_with_the_range() -> None:
    assert "disk_limit must be between 1M and 1T" in refusal({"disk_limit": 1000})


@pytest.mark.parametrize("pids", [0, -1, 7, 32769])
def test_pids_out_of_range_is_refused_with_the_range(pids: int) -> None:
    assert "pids_limit must be between 8 and 32768" in refusal({"pids_limit": pids})


def test_cpu_above_the_host_is_refused_with_the_range() -> None:
    host = os.cpu_count() or 1
    message = refusal({"cpu_limit": host + 1})
    assert f"cpu_limit must be between 0.01 and {host} (this host's CPUs)" in message
    assert SandboxConfig(cpu_limit=host).cpu_limit == host
    assert "cpu_limit must be between" in refusal({"cpu_limit": 0})


@pytest.mark.parametrize("network", ["host", "bridge", "None", ""])
def test_network_takes_only_the_three_modes(network: str) -> None:
    message = refusal({"network": network})
    assert "'none', 'restricted' or 'full'" in message


@pytest.mark.parametrize("workdir", ["relative", "/", "/proc", "/a/../b"])
def test_workdir_must_be_a_plain_absolute_folder(workdir: str) -> None:
    assert "workdir must be an absolute path" in refusal({"workdir": workdir})


def test_timeout_must_be_positive() -> None:
    assert "timeout must be between 0 and" in refusal({"timeout": 0})


def test_env_names_are_checked() -> None:
    assert "env names must be" in refusal({"env": {"A=B": "x"}})


@pytest.mark.parametrize(
    ("options", "runtime"),
    [
        ({}, "runc"),
        ({"backend": "gvisor"}, "runsc"),
        ({"backend": "gvisor", "network": "full"}, "runsc-net"),
        ({"runtime": "kata"}, "kata"),
    ],
)
def test_backend_picks_the_docker_runtime(options: dict, runtime: str) -> None:
    config = SandboxConfig.model_validate(options)
    assert config.docker_runtime == runtime
    assert config.is_gvisor == runtime.startswith("runsc")


def test_config_is_frozen() -> None:
    with pytest.raises(ValidationError):
        SandboxConfig().network = "full"  # type: ignore[misc]


# ---- container_kwargs: every security setting ------------------------------------------------------


def test_spec_drops_every_capability_and_privilege() -> None:
    kwargs = kwargs_of()
    assert kwargs["cap_drop"] == ["ALL"]
    assert "cap_add" not in kwargs
    assert kwargs["security_opt"] == ["no-new-privileges:true"]
    assert "privileged" not in kwargs
    assert kwargs["read_only"] is True
    assert (
        kwargs["network_disabled"] is True and "network_mode" not in kwargs
    )  # what it gives: test_network.py
    assert kwargs["ipc_mode"] == "private"
    assert kwargs["init"] is False  # the agent is pid 1: out of the program's reach, and it reaps
    assert kwargs["stop_signal"] == "SIGKILL"
    assert kwargs["log_config"] == {"type": "none", "config": {}}  # the host reads the attached stream
    assert kwargs["runtime"] == "runc"
    assert kwargs["image"] == DEFAULT_IMAGE
    assert "volumes" not in kwargs and "mounts" not in kwargs and "devices" not in kwargs


def test_spec_limits_memory_without_swap_cpu_and_pids() -> None:
    kwargs = kwargs_of(SandboxConfig(memory_limit="512M", pids_limit=64, cpu_limit=1.5))
    assert kwargs["mem_limit"] == 512 * MiB
    assert kwargs["memswap_limit"] == kwargs["mem_limit"]  # memory + swap == memory: swap off
    assert kwargs["pids_limit"] == 64
    assert kwargs["nano_cpus"] == 1_500_000_000


def test_spec_under_gvisor_limits_tasks_inside_and_keeps_a_host_backstop() -> None:
    runc = kwargs_of(SandboxConfig(pids_limit=64))
    gvisor = kwargs_of(SandboxConfig(pids_limit=64, backend="gvisor"))
    assert "nproc" not in {u["name"] for u in runc["ulimits"]}  # per user across the host under runc
    assert {"name": "nproc", "soft": 64, "hard": 64} in gvisor["ulimits"]
    assert gvisor["pids_limit"] >= 16 * 64  # the Sentry's own host threads count in the cgroup


def test_spec_clamps_cpu_to_the_engine() -> None:
    kwargs = container_kwargs(SandboxConfig(cpu_limit=2), owner=OWNER, host_ncpu=1)
    assert kwargs["nano_cpus"] == 1_000_000_000


def test_spec_sets_nofile_and_core_ulimits() -> None:
    ulimits = {u["name"]: (u["soft"], u["hard"]) for u in kwargs_of()["ulimits"]}
    assert ulimits["core"] == (0, 0)
    assert 0 < ulimits["nofile"][0] == ulimits["nofile"][1] <= 65536


def test_spec_runs_as_the_unprivileged_user_unless_sudo() -> None:
    assert kwargs_of()["user"] == f"{SANDBOX_UID}:{SANDBOX_UID}" == "10001:10001"
    assert kwargs_of(SandboxConfig(allow_sudo=True))["user"] == "0:0"


def test_spec_tmpfs_mounts_are_bounded_and_noexec() -> None:
    tmpfs = kwargs_of(SandboxConfig(disk_limit="16M"))["tmpfs"]
    assert set(tmpfs) == {"/workspace", "/tmp", "/var/tmp"}
    for options in tmpfs.values():
        assert {"rw", "nosuid", "nodev", "noexec"} <= set(options.split(","))
        assert "size=" in options
    assert f"size={16 * MiB}" in tmpfs["/workspace"].split(",")
    assert "uid=10001" in tmpfs["/workspace"].split(",") and "mode=0700" in tmpfs["/workspace"].split(",")
    assert "uid=0" in kwargs_of(SandboxConfig(allow_sudo=True))["tmpfs"]["/workspace"].split(",")
    assert "/data" in kwargs_of(SandboxConfig(workdir="/data"))["tmpfs"]


def test_spec_labels_identify_sandfleet_containers_and_their_owner() -> None:
    config = SandboxConfig()
    labels = kwargs_of(config, labels={"sandfleet.job": "j-1"})["labels"]
    assert labels[LABEL_ROLE] == "sandbox"
    assert labels[LABEL_OWNER] == "testhost:4242:99"
    assert labels[LABEL_CONFIG] == config.fingerprint()
    assert labels["sandfleet.job"] == "j-1"
    assert LABEL_PERSISTENT not in labels
    assert kwargs_of(SandboxConfig(persistent=True))["labels"][LABEL_PERSISTENT] == "1"
    assert Owner.parse(labels[LABEL_OWNER]) == OWNER


def test_spec_passes_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-leak")
    kwargs = kwargs_of(SandboxConfig(env={"GREETING": "hi"}))
    # the agent gets the base env only; the configured env goes to each command
    assert kwargs["environment"] == base_env(SandboxConfig())
    assert "GREETING" not in kwargs["environment"] and "OPENAI_API_KEY" not in kwargs["environment"]
    env = command_env(SandboxConfig(env={"GREETING": "hi"}))
    assert env["GREETING"] == "hi"
    assert "OPENAI_API_KEY" not in env
    assert set(env) == {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "GREETING"}


def test_spec_main_process_is_the_boot_loader_started_as_programs_are() -> None:
    kwargs = kwargs_of()
    assert kwargs["command"] == ["python3", "-s", "-c", BOOT]
    assert kwargs["stdin_open"] is True and kwargs["tty"] is False
    assert kwargs["working_dir"] == "/workspace"
    compile(BOOT, "boot", "exec")


@pytest.mark.parametrize(
    ("options", "asked"),
    [
        ({}, {"network_disabled": True}),
        ({"backend": "gvisor"}, {"network_disabled": True}),  # runsc, registered with --network=none
        ({"runtime": "kata"}, {"network_mode": "none"}),  # not proven: the engine's "none" network
        ({"runtime": "runsc-net"}, {"network_mode": "none"}),
        ({"network": "restricted", "allow_hosts": ["pypi.org"]}, {"network_mode": "sandfleet-egress"}),
        ({"network": "full"}, {"network_mode": "bridge"}),
        ({"network": "full", "backend": "gvisor"}, {"network_mode": "bridge"}),
    ],
)
def test_spec_network_is_asked_the_cheapest_proven_way(options: dict, asked: dict) -> None:
    """How each network is asked for; what the sandbox can then reach is tested from inside
    (test_network.py), and every sandbox's own view is checked at its start (isolation.py)."""
    kwargs = kwargs_of(SandboxConfig(**options))
    assert {k: v for k, v in kwargs.items() if k.startswith("network")} == asked


def test_owner_label_round_trips_and_detects_dead_owners() -> None:
    me = Owner.current()
    assert me.pid == os.getpid() and me.is_alive()
    assert Owner.parse(me.label()) == me
    assert not Owner(me.host, me.pid, me.started + 1).is_alive()  # same pid, another start: reused
    assert Owner("some-other-host", 1, 1).is_alive()  # unknown hosts count as alive
    assert Owner.parse("garbage") is None
