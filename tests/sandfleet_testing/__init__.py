"""Helpers shared by several test packages (importable as ``sandfleet_testing``: pytest puts tests/ on
sys.path for the root conftest.py). Fixtures stay in the conftest files.

- this module: skip-or-fail, waiting for a condition, program sources, container checks;
- ``sandfleet_testing.workers``: real ``sandfleet worker`` processes (``FleetWorker``, ``start_worker``,
  ``WorkerFactory``, the one behind the ``fleet_worker`` fixtures) and their cleanup;
- ``sandfleet_testing.approvers``: approver key pairs and the approvers file a gating worker trusts.
"""

from __future__ import annotations

import os
import textwrap
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

GONE_WITHIN_S = 10.0  # removal runs on a background thread after a run returns

# Program-side source that finds the two bridge pipes in /proc/self/fd (the stub pops
# SANDFLEET_BRIDGE_FDS), for programs that speak the bridge protocol by hand: SEND, RECV = bridge_fds().
FIND_BRIDGE_FDS = """
def bridge_fds():
    send = recv = None
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
            continue
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        except OSError:
            continue
        if target.startswith("pipe:"):
            if mode == os.O_WRONLY:
                send = fd
            elif mode == os.O_RDONLY:
                recv = fd
    return send, recv
"""


def skip_or_fail(reason: str) -> None:
    """Skip locally; fail in CI, where every prerequisite must be present."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: a missing prerequisite is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


T = TypeVar("T")


def wait_until(condition: Callable[[], object], timeout_s: float = 30.0, every_s: float = 0.05) -> bool:
    """Poll ``condition()`` until it is true (True) or ``timeout_s`` passed (False, after one last look):
    for a test that asserts with its own message."""
    deadline = time.monotonic() + timeout_s
    while not (ok := condition()) and time.monotonic() < deadline:
        time.sleep(every_s)
    return bool(ok)


def wait_for(
    predicate: Callable[[], T], timeout_s: float = 60.0, what: str = "condition", every_s: float = 0.05
) -> T:
    """Poll ``predicate()`` until it returns a true value, and return that value; after ``timeout_s``
    the test fails naming ``what`` it waited for."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(every_s)


def program(source: str) -> str:
    """A program's source, dedented, so tests can indent it with the test."""
    return textwrap.dedent(source).lstrip()


def container_gone(client: Any, container_id: str, within_s: float = GONE_WITHIN_S) -> bool:
    """True once Docker no longer knows the container, polled for up to ``within_s``."""
    import docker.errors

    deadline = time.monotonic() + within_s
    while True:
        try:
            client.containers.get(container_id)
        except docker.errors.NotFound:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
