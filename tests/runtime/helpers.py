"""Constants and small helpers shared by the runtime tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sandfleet_testing import container_gone as container_gone
from sandfleet_testing import program as program
from sandfleet_testing import skip_or_fail as skip_or_fail
from sandfleet_testing import wait_until as wait_until

BACKENDS = ("docker", "gvisor")
# Besides Sandfleet's own labels: marks the containers these tests make, to tell them from others'
# (each test process its own, so one process's end-of-session check never counts another's).
TEST_LABEL = "sandfleet.test"
TEST_LABELS = {TEST_LABEL: f"tests/runtime/{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"}
BRIDGE_TOOLS = Path(__file__).with_name("bridge_tools.py")
REPO = Path(__file__).resolve().parents[2]
SANDFLEET = str(Path(sys.executable).with_name("sandfleet"))


def sandfleet(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the ``sandfleet`` CLI in a subprocess, from the repository."""
    return subprocess.run(
        [SANDFLEET, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def labelled(client, key: str, value: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Ids of every container (running or not) carrying the label ``key=value``."""
    # sparse: no inspect per container, which would race with removals going on meanwhile
    return [c.id for c in client.containers.list(all=True, sparse=True, filters={"label": f"{key}={value}"})]
