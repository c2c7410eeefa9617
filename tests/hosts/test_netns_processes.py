"""What a killed multi-host run left is found by network namespace, not by command line: redis-server
(the control namespace's Redis and Sentinels) rewrites its process title, so its command line no
longer names the run's folder (``sandfleet fleet down``, hosts.clean_run)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

from reliability.harness import wait_for

from sandfleet.fleet import netns


def test_a_process_is_found_by_its_namespace_whatever_its_command_line(
    skip_or_fail: Callable[[str], None],
) -> None:
    if os.geteuid() != 0:
        skip_or_fail("network namespaces need root")
    name = f"sfh-t{os.getpid()}"  # not a run number: no other process's clean-up takes it
    netns.add_namespace(name)
    inside = subprocess.Popen([*netns.enter(name), "sleep", "60"])
    outside = subprocess.Popen(["sleep", "60"])
    try:
        assert wait_for(lambda: inside.pid in netns.processes_in(name), 10)
        assert outside.pid not in netns.processes_in(name)
        assert netns.processes_in("sfh-no-such-namespace") == set()
    finally:
        for process in (inside, outside):
            process.kill()
            process.wait()
        netns.delete_namespace(name)
