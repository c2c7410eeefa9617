"""deploy/bootstrap.sh: valid bash, and a second run on a ready host only checks.

"Only checks" is asserted by what the run did (nothing installed, started, registered or built), not by
how long it took: a duration depends on the host's load and would fail a landing at random."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "deploy" / "bootstrap.sh"
# What the bootstrap prints when it changes something; a second run on a ready host prints none of them.
DOING = (
    "installing ",
    "creating virtual environment",
    "starting dockerd",
    "starting redis-server",
    "registered runsc",
    ": building",
)


@pytest.mark.parametrize("script", ["bootstrap.sh", "test.sh"])
def test_scripts_parse(script: str) -> None:
    proc = subprocess.run(["bash", "-n", str(REPO / "deploy" / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_ci_runs_the_readme_test_command() -> None:
    run = REPO / ".ci" / "run"
    assert os.access(run, os.X_OK)
    assert "bash deploy/test.sh" in run.read_text()
    assert "bash deploy/test.sh" in (REPO / "README.md").read_text()


@pytest.mark.slow
def test_second_run_on_a_ready_host(docker_engine) -> None:
    """The host is ready (deploy/test.sh ran the bootstrap first, or it was set up by hand)."""
    env = {**os.environ, "SANDFLEET_DATA_SCIENCE": "1"}  # as deploy/test.sh ran it: every image is there
    proc = subprocess.run(["bash", str(BOOTSTRAP)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ready" in proc.stderr
    done = [line for line in proc.stderr.splitlines() if any(word in line for word in DOING)]
    assert not done, "a second run on a ready host changed something:\n" + "\n".join(done)
