"""Every benchmark script runs to the end on a tiny workload and prints its figures, as CI runs them.

No figure is asserted, not even its sign (a difference of two noisy timings on a tiny workload can
come out negative): figures match ``-?\\d``. What is asserted is
that each script still works end to end and prints the line that carries its result, and where a
script checks correctness (nothing lost, nothing left in the broker) that the check holds. The
kill -9 benchmark's twin is tests/reliability/test_worker_kill.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]

SMOKE_RUNS = {  # script: (tiny arguments, what its output must show)
    "sandbox_cold_start": (["--runs", "2"], r"total / raw"),
    "bridge_roundtrip": (
        ["--calls", "20", "--orders-calls", "3", "--poll-calls", "3"],
        r"polling / bridge: median",
    ),
    "acquisition": (["--runs", "3"], r"cold / warm: median"),
    "mcp_bridge": (
        ["--calls", "20", "--rounds", "1"],
        r"\[http\][\s\S]*bridge adds: p50 [+-]?[\d.]+ ms \(95% interval [+-]?[\d.]+\.\.[+-]?[\d.]+ ms\)",
    ),
    "mcp_changes": (
        ["--changes", "2", "--pings", "5"],
        r"\[http\][\s\S]*new job sees the tool \(no rate limit\): median +[\d.]+ ms[\s\S]*host CPU per ping: \d+ us",
    ),
    "run_overhead": (["--runs", "3", "--cold-runs", "2"], r"through ProgramRuntime\.run"),
    "engine_overhead": (["--jobs", "10"], r"overhead share of total"),
    "cpu_per_job": (["--jobs", "6", "--rounds", "1", "--runs", "2"], r"runtime / raw churn throughput: \d"),
    "small_tasks": (
        ["--tasks", "6", "--sizes", "3,6"],
        r"batch of +6: fleet [\d.]+ jobs/s, raw [\d.]+ jobs/s, fleet/raw [\d.]+[\s\S]*overall: fleet",
    ),
    "fleet_vs_churn": (
        ["--jobs", "4", "--rounds", "1"],
        r"raw disabled \(network_disabled=True\): [\d.]+ jobs/s -> fleet/raw \d+\.\d\d[\s\S]*"
        r"raw none \(network_mode=\"none\"\): [\d.]+ jobs/s -> fleet/raw \d+\.\d\d",
    ),
    "job_latency": (["--jobs", "3", "--pause", "0.2"], r"3 sequential trivial jobs"),
    "jobs_in_flight": (
        ["--jobs", "10", "--latency", "0.3", "--churn-runs", "4"],
        r"10/10 succeeded[\s\S]*wall / bound: \d+\.\d\d",
    ),
    "several_workers": (
        ["--jobs", "12", "--workers", "2", "--latency", "0.3"],
        r"broker queue left: 0, unacked left: 0\nevery job: one final record, one done signal, "
        r"one final audit event; none lost",
    ),
    "runc_vs_runsc": (["--jobs", "3"], r"runsc / runc cost per job"),
    "replay_batch": (
        ["--jobs", "6", "--per-job", "2"],
        r"replay --batch vs one replay per job: \d+\.\dx faster[\s\S]*events/s[\s\S]*"
        r"every replay matched and every job verified",
    ),
    "shell_exec": (
        ["--runs", "5", "--jobs", "3", "--turns", "2"],
        r"docker exec / sandbox_exec: median \d+\.\dx[\s\S]*engine overhead per chat turn[\s\S]*audit to redis",
    ),
    "failover": (
        ["--rounds", "1", "--jobs", "6", "--job-seconds", "0.5"],
        r"failover: the fleet works again [\d.]+ s after the kill \(median; worst [\d.]+ s\), 0 lost, 0 done twice",
    ),
    "oci_runtimes": (["--cycles", "1"], r"\n  runc +\d+ +\d+\.\.\d+"),
    "container_options": (["--cycles", "1", "--runtimes", "runc"], r"the agent: start, hello, remove +\d+"),
    "cli_startup": (
        ["--cycles", "1"],
        r"sandbox run -- true / docker run --rm \.\.\. true: \d+\.\d\d[\s\S]*"
        r"run print1\.py / docker run --rm \.\.\. python3 -c <print1>: \d+\.\d\d",
    ),
    "worker_startup": (
        ["--cycles", "1"],
        r"sandfleet worker -c 1 \(spawn -> ready\) +wall median +\d+ ms[^\n]*CPU median +\d+ ms",
    ),
    "input_caps": (
        ["--repeat", "20", "--big-mb", "0.1"],
        r"depth check of[\s\S]*uniqueItems over 1,000 objects: one pass",
    ),
    "burst": (
        ["--jobs", "6", "--rounds", "1", "--idle", "1", "--latency", "0.3"],
        r"spread latency, pool fixed pool_size: warm leases \d+/6",
    ),
    "cancel": (["--rounds", "2", "--busy", "1"], r"cancel -> container gone: +median +[\d.]+ ms"),
    "approvals": (
        ["--jobs", "3", "--concurrency", "4", "--sandboxes", "2", "--loop-jobs", "2", "--baseline-jobs", "2"],
        r"jobs succeeded 3/3[\s\S]*"
        r"shell jobs \(n=2\)  containers held while waiting 0 [\s\S]*succeeded 2/2[\s\S]*"
        r"chat  jobs \(n=2\)  containers held while waiting 0 [\s\S]*succeeded 2/2[\s\S]*"
        r"loop modes: containers held while waiting shell 0, chat 0 \(target 0\); decision-to-running p50 "
        r"shell \d+ ms \(to the session restored \d+ ms[\s\S]*chat \d+ ms[\s\S]*"
        r"decision-to-running p50 \d+ ms[\s\S]*"
        r"decision-to-running p50 signed \d+ ms, unsigned \d+ ms",
    ),
    "artifacts": (
        ["--pairs", "1", "--warmup-pairs", "0", "--mib", "1", "--pause", "0.1"],
        r"code-action artifact round trip p50: -?\d+ ms[\s\S]*"
        r"shell artifact round trip p50: -?\d+ ms, spread over pairs -?\d+\.\.-?\d+ ms[\s\S]*"
        r"round trip p50, code-action \| shell: -?\d+ \| -?\d+ ms",
    ),
    "egress": (
        ["--requests", "20", "--megabytes", "5", "--transfers", "1", "--sandboxes", "2"],
        r"added +p50 [+-]?[\d.]+ +paired p25\.\.p75 [+-]?[\d.]+\.\.[+-]?[\d.]+[\s\S]*ratio \d+\.\d\d[\s\S]*"
        r"counters' share: IPv6 route \+ 2 counter reads = [\d.]+ ms of start \+ stop \d+ ms: ratio \d\.\d{3}",
    ),
    "sanitise": (
        ["--calls", "100", "--kib", "2", "--rounds", "1"],
        r"ASCII job id +\d+ chars: +[\d.]+ us per call[\s\S]*json_text +[\d.]+ us: ratio \d+\.\d\d",
    ),
    "metrics_overhead": (
        ["--rounds", "1", "--jobs", "2"],
        r"ratio on/off \d+\.\d{3}[\s\S]*jobs not succeeded: 0[\s\S]*metrics work per job: [\d.]+ us",
    ),
    "webhook_outbox": (
        ["--rounds", "1"],
        r"seal -> POST received, normal: +p50 -?[\d.]+ ms[\s\S]*kill -> POST received \(outbox\): +p50 -?[\d.]+ s",
    ),
    "hosts": (  # one host of its own (an engine in a network namespace): 4 jobs, none lost or done twice
        ["--jobs", "4", "--sizes", "1", "--sandboxes", "2"],
        r"\n +1 +2 +4 +4 +0 +0 +[\d.]+ +1\.00 +-\n",
    ),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", sorted(SMOKE_RUNS))
def test_benchmark_runs_and_prints_its_figures(script: str, docker_engine: Any, redis_binary: str) -> None:
    args, expected = SMOKE_RUNS[script]
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{script}.py"), *args],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(expected, done.stdout), done.stdout[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_every_benchmark_script_has_a_smoke_run(docker_engine: object) -> None:
    scripts = {p.stem for p in (REPO / "benchmarks").glob("*.py") if not p.stem.startswith("_")}
    # ab.py runs another benchmark against two commits (a worktree and a venv each): a driver, not a figure
    assert scripts - {"kill_workers", "ab"} == set(SMOKE_RUNS)
