"""Each way a sandbox cannot be made gives its own clear error, and nothing is started."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import SandboxError

from .helpers import REPO, TEST_LABELS, owned_by, run_cli, sandfleet

NO_DAEMON = "unix:///tmp/sandfleet-no-daemon.sock"
VALID_OPTIONS = (
    "valid options are: backend, image, cpu_limit, memory_limit, disk_limit, pids_limit, network, persistent, "
    "timeout, workdir, env, allow_sudo, runtime, read_only_rootfs"
)


def test_unknown_option_exits_2_with_the_valid_options(docker_engine: Any) -> None:
    done, left = run_cli("sandbox", "run", "-o", "network_mode=none", "--", "true")
    assert done.returncode == 2
    assert 'unknown option \'network_mode\' (use `network` ("none", "restricted" or "full"))' in done.stderr
    assert VALID_OPTIONS in done.stderr
    assert left == []


def test_unknown_option_without_a_hint(docker_engine: Any) -> None:
    done = sandfleet("sandbox", "run", "-o", "flavour=vanilla", "--", "true")
    assert done.returncode == 2
    assert "unknown option 'flavour'" in done.stderr and VALID_OPTIONS in done.stderr


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "memory_limit=12Q",
            "memory_limit: not a size: '12Q' (use bytes or a number with K, M, G or T, e.g. 512M, 1G)",
        ),
        ("disk_limit=lots", "disk_limit: not a size: 'lots'"),
        ("memory_limit=1K", "memory_limit: memory_limit must be between 32M and 1T, got 1024 bytes"),
        ("pids_limit=0", "pids_limit: pids_limit must be between 8 and 32768, got 0"),
        ("cpu_limit=1000", "cpu_limit must be between 0.01 and"),
        ("badpair", "expected KEY=VALUE, got 'badpair'"),
    ],
)
def test_bad_values_exit_2_with_the_reason(docker_engine: Any, option: str, message: str) -> None:
    done = sandfleet("sandbox", "run", "-o", option, "--", "true")
    assert done.returncode == 2
    assert message in done.stderr


def test_missing_runtime_names_the_registered_ones(docker_engine: Any) -> None:
    from sandfleet.worker.sandbox.manager import SandboxManager

    with (
        SandboxManager(SandboxConfig(runtime="nonexistent")) as manager,
        pytest.raises(SandboxError) as caught,
    ):
        manager.create_session(labels=TEST_LABELS)
    message = str(caught.value)
    assert "Docker runtime 'nonexistent' is not registered with the engine" in message
    assert "registered runtimes: " + ", ".join(sorted(docker_engine.runtimes)) in message
    assert owned_by(os.getpid()) == []

    done, left = run_cli("sandbox", "run", "-o", "runtime=nonexistent", "--", "true")
    assert done.returncode == 1
    assert "registered runtimes: " in done.stderr and "runc" in done.stderr
    assert left == []


def test_missing_image_says_how_to_build_it(docker_engine: Any) -> None:
    done, left = run_cli("sandbox", "run", "-o", "image=sandfleet/no-such-image:0", "--", "true")
    assert done.returncode == 1
    assert "sandbox image 'sandfleet/no-such-image:0' is not on this engine" in done.stderr
    assert "sandfleet images build" in done.stderr
    assert left == []


def test_stopped_daemon_fails_closed(docker_engine: Any) -> None:
    assert not os.path.exists(NO_DAEMON.removeprefix("unix://"))
    done, left = run_cli("sandbox", "run", "--", "true", env={"DOCKER_HOST": NO_DAEMON})
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "Error: Sandbox backend 'docker' is not available: cannot connect to the engine "
        "(No such file or directory). Make sure Docker is installed and running."
    )
    assert left == []  # and on the real engine, nothing was started by that process


def test_stopped_daemon_raises_the_transient_error(docker_engine: object) -> None:
    program = (
        "from sandfleet.core.errors import SandboxUnavailableError, TransientError\n"
        "from sandfleet.worker.sandbox.manager import SandboxManager\n"
        "try:\n"
        "    SandboxManager().create_session()\n"
        "except SandboxUnavailableError as e:\n"
        "    assert isinstance(e, TransientError)\n"
        "    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DOCKER_HOST": NO_DAEMON},
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Sandbox backend 'docker' is not available: ")
    assert done.stdout.rstrip().endswith(". Make sure Docker is installed and running.")


def test_without_the_docker_sdk_the_install_hint(docker_engine: object) -> None:
    program = (
        "import sys\n"
        "sys.modules['docker'] = None\n"  # `import docker` now raises: as if it were not installed
        "from sandfleet.core.errors import SandboxError\n"
        "from sandfleet.worker.sandbox.docker import backend as engine\n"
        "from sandfleet.worker.sandbox.manager import SandboxManager\n"
        "assert engine.docker is None\n"
        "try:\n"
        "    SandboxManager().create_session()\n"
        "except SandboxError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "The 'docker' package is required for the sandbox. Install it with: pip install 'sandfleet[worker]'\n"
    )
