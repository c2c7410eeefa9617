"""Every container is removed after use; a crashed owner's leftovers are pruned, a live owner's kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

from .helpers import REPO, TEST_LABELS, container_exists, sandfleet

# Opens a session, says which container it got, and waits to be killed.
CRASHING_OWNER = f"""
import sys, time
from sandfleet.core.config import SandboxConfig
from sandfleet.worker.sandbox.manager import SandboxManager
session = SandboxManager(SandboxConfig(backend=sys.argv[1])).create_session(labels={TEST_LABELS!r})
print(session.container_id, flush=True)
time.sleep(600)
"""


def test_prune_removes_a_killed_owners_container_and_keeps_a_live_ones(
    backend: str, open_session: Any
) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", CRASHING_OWNER, backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    orphan = ""
    try:
        assert owner.stdout is not None
        orphan = owner.stdout.readline().strip()
        assert orphan, owner.stderr.read() if owner.stderr else ""
    finally:
        os.kill(owner.pid, signal.SIGKILL)  # the caller crashes mid-way: no finally, no cleanup
        owner.communicate(timeout=30)
    assert container_exists(orphan)  # left behind, as a crash leaves it
    live = open_session(backend).container_id

    done = sandfleet("sandbox", "prune", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # On a shared engine another process's prune may have taken the orphan first: then it is gone
    # without being in our report. Either way it was not kept, and the live owner's container was.
    assert orphan in report["removed"] or orphan not in report["kept"]
    assert live in report["kept"] and live not in report["removed"]
    assert not container_exists(orphan)
    assert container_exists(live)
