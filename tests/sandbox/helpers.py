"""Constants and small helpers shared by the sandbox tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sandfleet_testing import skip_or_fail as skip_or_fail

BACKENDS = ("docker", "gvisor")
RUNTIME_OF = {"docker": "runc", "gvisor": "runsc"}
# Besides Sandfleet's own labels: marks the containers these tests make, to tell them from others'.
# One value per test process (pytest-xdist runs several): each module's leftover check sees only its own.
TEST_LABELS = {"sandfleet.test": f"tests/sandbox/{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"}
REPO = Path(__file__).resolve().parents[2]
# The console script of the interpreter running the tests (the project's venv).
SANDFLEET = str(Path(sys.executable).with_name("sandfleet"))
IN_CI = bool(os.environ.get("CI"))


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


def container_exists(container_id: str) -> bool:
    from sandfleet.worker.sandbox.docker.backend import NotFoundError, docker_client

    try:
        docker_client().containers.get(container_id)
    except NotFoundError:
        return False
    return True


def plain_container_labels(role: str) -> dict[str, str]:
    """Labels for a test's own plain container: a role (the run's leftover check finds it) and this
    process as owner, so that no worker's reaper, running meanwhile for other modules, takes an
    ownerless container for a dead worker's and removes it under the test."""
    from sandfleet.worker.sandbox.docker.backend import LABEL_OWNER, LABEL_ROLE
    from sandfleet.worker.sandbox.docker.spec import Owner

    return {LABEL_ROLE: role, LABEL_OWNER: Owner.current().label(), **TEST_LABELS}


def owned_by(pid: int) -> list[str]:
    """Ids of the Sandfleet containers whose owner label names this process."""
    from sandfleet.worker.sandbox.docker.backend import LABEL_OWNER, LABEL_ROLE, docker_client
    from sandfleet.worker.sandbox.docker.spec import Owner

    # The raw list: ``containers.list`` inspects each one and fails when another's goes meanwhile.
    found = docker_client().api.containers(all=True, filters={"label": LABEL_ROLE})
    owners = {c["Id"]: Owner.parse((c.get("Labels") or {}).get(LABEL_OWNER, "")) for c in found}
    return [cid for cid, owner in owners.items() if owner and owner.pid == pid]


def run_cli(
    *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the CLI; also return the containers its process left behind (there must be none)."""
    process = subprocess.Popen(
        [SANDFLEET, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
    stdout, stderr = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), owned_by(
        process.pid
    )
