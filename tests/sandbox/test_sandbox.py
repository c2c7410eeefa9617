"""A real sandbox under runc and runsc: commands, the user, the read-only root, files, and what Docker made."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import pytest

from sandfleet.core.errors import SandboxError

from .helpers import RUNTIME_OF, TEST_LABELS, container_exists, sandfleet

MiB = 1024**2


def backend_of(session: Any) -> str:
    return session.config.backend


def test_python_runs(shared_session: Any) -> None:
    result = shared_session.execute("python3 --version", timeout=30)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("Python 3.11")
    assert not result.timed_out


def test_the_agent_runs_the_hosts_precompiled_bytecode(shared_session: Any) -> None:
    hello = shared_session._container.hello
    assert hello["booted_from"] == "bytecode"  # the image's Python 3.11 matches the host's
    assert hello["syscall_filter"] and hello["not_dumpable"]


def test_commands_run_as_the_unprivileged_user(shared_session: Any) -> None:
    result = shared_session.execute("id -u", timeout=30)
    assert (result.exit_code, result.stdout.strip()) == (0, "10001")
    result = shared_session.execute(["python3", "-c", "import os; print(os.geteuid(), os.getegid())"])
    assert result.stdout == "10001 10001\n"


def test_root_filesystem_is_read_only(shared_session: Any) -> None:
    result = shared_session.execute("touch /usr/hello", timeout=30)
    assert result.exit_code != 0
    assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr
    probe = shared_session.execute(
        ["python3", "-c", "import os\ntry:\n open('/usr/hello','w')\nexcept OSError as e: print(e.errno)"]
    )
    assert probe.stdout.strip() in ("30", "13")  # EROFS, or EACCES when the check comes first


def test_writing_the_workspace_with_a_command(shared_session: Any) -> None:
    result = shared_session.execute(["sh", "-c", "echo from-a-command > /workspace/note.txt && cat note.txt"])
    assert (result.exit_code, result.stdout) == (0, "from-a-command\n")
    assert shared_session.read_file("/workspace/note.txt") == b"from-a-command\n"


def test_write_file_and_read_back(shared_session: Any) -> None:
    shared_session.write_file("note.txt", "from the host\n")
    assert shared_session.read_file("note.txt") == b"from the host\n"
    result = shared_session.execute("cat /workspace/note.txt")
    assert result.stdout == "from the host\n"


def test_write_file_of_20_mb(shared_session: Any) -> None:
    data = os.urandom(20 * MiB)
    shared_session.write_file("/workspace/big.bin", data)
    check = shared_session.execute(
        ["python3", "-c", "import hashlib; print(hashlib.sha256(open('big.bin','rb').read()).hexdigest())"]
    )
    assert check.stdout.strip() == hashlib.sha256(data).hexdigest()
    assert hashlib.sha256(shared_session.read_file("big.bin")).digest() == hashlib.sha256(data).digest()
    shared_session.execute("rm /workspace/big.bin")


def test_write_file_creates_missing_folders(shared_session: Any) -> None:
    shared_session.write_file("deep/er/still/file.txt", b"x")
    assert "deep/er/still/file.txt" in shared_session.list_files()
    assert shared_session.list_files("/workspace/deep") == ["er/still/file.txt"]
    # Renamed into place: no temporary file is left beside it.
    assert shared_session.list_files("/workspace/deep/er/still") == ["file.txt"]


def test_write_file_outside_the_writable_mounts_fails(shared_session: Any) -> None:
    with pytest.raises(SandboxError, match=r"/usr/lib/evil\.py"):
        shared_session.write_file("/usr/lib/evil.py", "print('x')")


def test_tmpfs_is_noexec(shared_session: Any) -> None:
    shared_session.write_file("run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert shared_session.execute("/workspace/run.sh").exit_code != 0
    assert shared_session.execute("sh /workspace/run.sh").stdout == "ran\n"


def check_inspect(attrs: dict[str, Any], backend: str) -> None:
    """The settings as Docker reports them (``docker inspect``'s HostConfig names). The network is
    checked from inside the sandbox instead (test_network.py; the CLI's "Network" below)."""
    assert attrs["ReadonlyRootfs"] is True
    assert attrs["NanoCpus"] == int(min(2, os.cpu_count() or 1) * 1e9)
    assert attrs["Memory"] == 4 * 1024**3
    assert attrs["MemorySwap"] == attrs["Memory"]
    if backend == "docker":
        assert attrs["PidsLimit"] == 256
    else:  # gVisor: 256 tasks inside its kernel (RLIMIT_NPROC); the cgroup is a backstop for its threads
        assert {"Name": "nproc", "Soft": 256, "Hard": 256} in attrs["Ulimits"]
        assert attrs["PidsLimit"] >= 4096
    assert attrs["SecurityOpt"] == ["no-new-privileges:true"]
    assert set(attrs["Tmpfs"]) == {"/workspace", "/tmp", "/var/tmp"}
    assert "size=1073741824" in attrs["Tmpfs"]["/workspace"]
    assert all("noexec" in options for options in attrs["Tmpfs"].values())
    assert attrs["CapDrop"] == ["ALL"]
    assert not attrs["CapAdd"]
    assert attrs["Runtime"] == RUNTIME_OF[backend]


def test_inspect_shows_every_setting(shared_session: Any) -> None:
    attrs = shared_session.inspect()
    host = attrs["HostConfig"]
    check_inspect(host, backend_of(shared_session))
    assert host["Init"] is False  # the agent is the container's init (pid 1)
    assert attrs["Config"]["StopSignal"] == "SIGKILL"
    assert host["Privileged"] is False
    assert host["LogConfig"]["Type"] == "none"  # nothing the agent sends is logged to the host's disk
    assert attrs["Config"]["User"] == "10001:10001"
    assert attrs["Config"]["Labels"]["sandfleet.role"] == "sandbox"
    assert attrs["Config"]["Labels"]["sandfleet.test"] == TEST_LABELS["sandfleet.test"]
    assert not attrs["Mounts"]  # nothing of the host is mounted in


def test_cli_inspect_reports_every_setting_and_the_effective_uid(backend: str) -> None:
    done = sandfleet("sandbox", "inspect", "-o", f"backend={backend}", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    check_inspect(report, backend)
    assert report["User"] == "10001:10001"
    assert report["EffectiveUid"] == 10001
    assert report["EffectiveGid"] == 10001
    network = report["Network"]  # what was asked, what Docker made, what the sandbox sees
    assert network["Requested"] == "none"
    assert (network["NetworkMode"], network["NetworkDisabled"]) == ("default", True)
    assert network["Interfaces"] == ["lo"] and set(network["RoutesThrough"]) <= {"lo"}
    assert network["NamespaceOfItsOwn"] is True and network["Verified"] is True
    assert network["Nameservers"] == []
    assert not container_exists(report["Id"])  # inspect removes its sandbox


def test_cli_inspect_reports_a_bridged_network_as_it_is(docker_engine: object) -> None:
    done = sandfleet("sandbox", "inspect", "-o", "network=full", "--json")
    assert done.returncode == 0, done.stderr
    network = json.loads(done.stdout)["Network"]
    assert (network["Requested"], network["NetworkMode"], network["NetworkDisabled"]) == (
        "full",
        "bridge",
        False,
    )
    assert "eth0" in network["Interfaces"] and network["Verified"] is None


def test_allow_sudo_runs_as_root_still_without_capabilities(backend: str, open_session: Any) -> None:
    session = open_session(backend, allow_sudo=True)
    program = (
        "import ctypes, os\n"
        "print(os.geteuid(), ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))\n"  # PR_GET_NO_NEW_PRIVS
        "print(open('/proc/self/status').read())\n"
    )
    lines = session.execute(["python3", "-c", program]).stdout.splitlines()
    assert lines[0] == "0 1"  # root, with no-new-privileges
    status = dict(line.split(":\t", 1) for line in lines[1:] if ":\t" in line)
    assert int(status["CapEff"], 16) == 0
    assert int(status["CapBnd"], 16) == 0
    assert session.execute("touch /usr/hello").exit_code != 0  # root, but the root stays read-only


def test_session_close_removes_the_container(backend: str) -> None:
    from sandfleet.core.config import SandboxConfig
    from sandfleet.worker.sandbox.manager import SandboxManager

    with (
        pytest.raises(RuntimeError, match="caller crashed"),
        SandboxManager(SandboxConfig(backend=backend)) as m,
    ):
        session = m.create_session(labels=TEST_LABELS)
        container_id = session.container_id
        assert container_exists(container_id)
        raise RuntimeError("caller crashed")
    assert not container_exists(container_id)


def test_a_sandbox_its_engine_killed_before_the_program_is_transient_not_the_jobs_failure(
    backend: str,
) -> None:
    """A file request to a sandbox the engine killed (an engine that stops takes its containers)
    raises SandboxUnavailableError, which the job retries like a missing engine; it used to be a
    SandboxError, which failed the job (seen in tests/reliability/test_docker_outage.py)."""
    import subprocess

    from sandfleet.core.config import SandboxConfig
    from sandfleet.core.errors import SandboxUnavailableError
    from sandfleet.worker.sandbox.manager import SandboxManager

    with SandboxManager(SandboxConfig(backend=backend)) as manager:
        session = manager.create_session(labels=TEST_LABELS)
        subprocess.run(["docker", "kill", session.container_id], check=True, capture_output=True)
        with pytest.raises(SandboxUnavailableError, match="stopped by its engine"):
            session.write_file("program.py", "print(1)")
