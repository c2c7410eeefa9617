"""Smoke test of ``sandfleet loadtest --local``: a small run end to end, as CI runs it.

It starts its own redis-server and worker, so it needs Docker, the sandbox image and redis-server.
No timing is asserted: only that every job ended well and the report has its parts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandfleet.fleet.loadtest.phases import PHASES

pytestmark = [pytest.mark.slow]
JOBS = 50
RUN_TIMEOUT_S = 280


@pytest.mark.timeout(RUN_TIMEOUT_S + 20)
def test_local_loadtest_writes_report_and_plot(tmp_path: Path, docker_engine: Any, redis_binary: str) -> None:
    out = tmp_path / "report"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDFLEET_")}
    env["SANDFLEET_CLIENT_STATE_DIR"] = os.environ["SANDFLEET_CLIENT_STATE_DIR"]  # tests/conftest.py
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from sandfleet.cli import main; main(prog_name='sandfleet')",
            "loadtest",
            "--local",
            "--jobs",
            str(JOBS),
            "--burst",
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"loadtest failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["done"] == JOBS
    assert report["counts"]["succeeded"] == JOBS
    assert report["counts"]["failed"] == 0
    assert report["failures_by_kind"] == {}
    for phase in PHASES:
        summary = report["phases_s"][phase]
        assert summary["count"] == JOBS, phase
        assert set(summary) >= {"p50", "p95", "p99", "max"}
    assert report["redis"]["commands_per_job"]["raw"] > 0
    assert report["worker_rss_bytes"]["peak_total"] > 0
    assert report["peak_live_containers"] is not None
    assert (out / "report.png").stat().st_size > 0
    assert "throughput" in proc.stdout
