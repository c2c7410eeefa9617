"""What the egress end-to-end modules share: the module fleet they run jobs on, and ``sandfleet audit
--verify`` run as a user would."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from sandfleet_testing.workers import SANDFLEET, FleetWorker

from sandfleet.core.settings import Settings


@dataclass
class EgressFleet:
    worker: FleetWorker
    settings: Settings
    model: str


def audit_verify(settings: Settings, job_id: str) -> subprocess.CompletedProcess[str]:
    """``sandfleet audit JOB --verify`` as a user runs it, with the fleet's Redis and prefix only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")}
    env |= {"SANDFLEET_REDIS_URL": settings.redis_url, "SANDFLEET_KEY_PREFIX": settings.key_prefix}
    return subprocess.run(
        [SANDFLEET, "audit", job_id, "--verify"], env=env, capture_output=True, text=True, timeout=60
    )
