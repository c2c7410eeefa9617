"""The worker's hold on a sandbox's network namespace (sandfleet/worker/egress/netns.py), against a
scratch namespace of this test's own (``unshare --net``): entered through the descriptor after its
process is gone, never through a pid that leads to the worker's own namespace, never after release."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest
from sandbox.helpers import skip_or_fail

from sandfleet.worker.egress.netns import NetnsError, SandboxNetns


@pytest.fixture
def scratch() -> Iterator[subprocess.Popen[bytes]]:
    """A process alone in a new network namespace (only ``lo``, down)."""
    if os.geteuid() != 0:
        skip_or_fail("the namespace tests need root (unshare --net, setns)")
    process = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    try:
        for _ in range(250):  # until unshare has exec'd sleep inside the new namespace
            if os.readlink(f"/proc/{process.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                break
            time.sleep(0.02)
        yield process
    finally:
        process.kill()
        process.wait()


def test_the_namespace_is_entered_through_the_descriptor_after_its_process_is_gone(
    scratch: subprocess.Popen[bytes],
) -> None:
    netns = SandboxNetns.open(scratch.pid)
    try:
        scratch.kill()
        scratch.wait()
        assert not os.path.exists(f"/proc/{scratch.pid}")
        shown = netns.run(["ip", "-o", "link", "show"])
        assert shown.returncode == 0 and [
            line.split(":")[1].strip() for line in shown.stdout.splitlines()
        ] == ["lo"]
        inode = netns.call(lambda: os.stat("/proc/thread-self/ns/net").st_ino)
        assert inode != os.stat("/proc/self/ns/net").st_ino  # the thread was in the scratch namespace
    finally:
        netns.close()


def test_a_pid_in_the_workers_own_namespace_is_refused(scratch: subprocess.Popen[bytes]) -> None:
    """A container's pid reused by a host process must never lead the filter to the host's namespace."""
    with pytest.raises(NetnsError, match="worker's own network namespace"):
        SandboxNetns.open(os.getpid())


def test_a_gone_pid_is_refused(scratch: subprocess.Popen[bytes]) -> None:
    scratch.kill()
    scratch.wait()
    with pytest.raises(NetnsError, match="cannot open the sandbox's network namespace"):
        SandboxNetns.open(scratch.pid)


def test_a_released_namespace_is_never_entered_again(scratch: subprocess.Popen[bytes]) -> None:
    """After close its descriptor number may belong to another file: run and call refuse."""
    netns = SandboxNetns.open(scratch.pid)
    netns.close()
    netns.close()  # idempotent
    with pytest.raises(NetnsError, match="released"):
        netns.run(["ip", "link"])
    with pytest.raises(NetnsError, match="released"):
        netns.call(lambda: None)
