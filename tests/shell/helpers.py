"""Helpers of the shell-mode tests (fixtures are in conftest.py): settings, and session containers
as the docker CLI sees them."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from sandfleet.core.settings import Settings


def shell_settings(**overrides: Any) -> Settings:
    fields: dict[str, Any] = {"model_api_key": None, "model_base_url": None, "max_sessions": 2}
    fields.update(overrides)
    return Settings(**fields)


def session_containers(job_id: str) -> list[str]:
    """Ids of existing containers labelled as this job's session (the docker CLI, not the SDK)."""
    done = subprocess.run(
        ["docker", "ps", "-aq", "--no-trunc", "--filter", f"label=sandfleet.job={job_id}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return done.stdout.split()


def gone(container_id: str, timeout_s: float = 10.0) -> bool:
    """Whether the container is removed (within a few seconds: removal may still be under way)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = subprocess.run(["docker", "inspect", container_id], capture_output=True, timeout=30)
        if done.returncode != 0:
            return True
        time.sleep(0.2)
    return False
