"""deploy/bootstrap.sh: valid bash, and a second run on a ready host succeeds quickly."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = REPO / "deploy" / "bootstrap.sh"
SECOND_RUN_BUDGET_S = 15.0


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
@pytest.mark.docker
def test_second_run_on_a_ready_host(docker_engine) -> None:
    """The host is ready (deploy/test.sh ran the bootstrap first, or it was set up by hand)."""
    started = time.monotonic()
    proc = subprocess.run(["bash", str(BOOTSTRAP)], capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ready" in proc.stderr
    assert took < SECOND_RUN_BUDGET_S, f"second run took {took:.1f} s"
