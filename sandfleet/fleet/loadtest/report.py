"""The load test's report: ``report.json`` (figures and every job's phases) and a text summary."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from sandfleet.core.queue import redact_url
from sandfleet.fleet.loadtest.driver import RunData
from sandfleet.fleet.loadtest.phases import PHASES
from sandfleet.fleet.loadtest.stats import (
    command_delta,
    commands_per_job,
    completion_times,
    failures_by_kind,
    phase_summaries,
    throughput,
)

SCHEMA_VERSION = 1
TOP_COMMANDS = 20
MIB = 1024**2


def build_report(data: RunData, fleet: dict[str, Any]) -> dict[str, Any]:
    """Everything measured in one run, as plain JSON-able data.

    ``fleet`` describes what was driven: ``{"local": bool, "redis_url", "workers", ...}``.
    """
    jobs = data.jobs
    ended = [j for j in jobs if j["ended_at"] is not None]
    succeeded = sum(1 for j in jobs if j["status"] == "succeeded")
    last_end = max((j["ended_at"] for j in ended), default=data.finished_at)
    delta = command_delta(data.commands_before, data.commands_after)
    samples = data.samples
    rss_peaks = samples.peak_rss_by_pid()
    return {
        "schema_version": SCHEMA_VERSION,
        "mode": data.plan.mode,
        "fleet": {**fleet, "redis_url": redact_url(str(fleet.get("redis_url", "")))},
        "plan": {
            "jobs": data.plan.jobs,
            "model": data.plan.model,
            "tools": data.plan.tools,
            "sandbox": data.plan.sandbox,
            "warmup": data.plan.warmup,
        },
        "batch_id": data.batch_id,
        "finished": data.finished,
        "counts": {
            "submitted": data.plan.jobs,
            "recorded": len(jobs),
            "done": len(ended),
            "succeeded": succeeded,
            "failed": len(ended) - succeeded,
            "unfinished": data.plan.jobs - len(ended),
        },
        "wall_s": data.finished_at - data.started_at,
        "submit_s": data.submitted_at - data.started_at,
        "throughput_jobs_per_s": throughput(len(ended), data.started_at, last_end),
        "phases_s": phase_summaries((j["phases"] for j in jobs), PHASES),
        "failures_by_kind": failures_by_kind(jobs),
        "peak_live_containers": samples.peak_containers(),
        "containers_counted": fleet.get("containers_counted", "sandfleet.role containers on this engine"),
        "worker_rss_bytes": (
            {
                "peak_total": samples.peak_total_rss(),
                "peak_per_worker": {str(pid): peak for pid, peak in rss_peaks.items()},
            }
            if rss_peaks
            else None
        ),
        "redis": {
            "commands_per_job": commands_per_job(
                delta,
                len(ended),
                own_calls=data.own_calls,
                idle_rate_per_s=data.idle_calls_per_s,
                duration_s=data.finished_at - data.started_at,
            ),
            "idle_calls_per_s": data.idle_calls_per_s,
            "cpu_s": data.redis_cpu_s,
            "memory_bytes_per_job": (data.redis_memory_bytes / len(ended))
            if data.redis_memory_bytes and ended
            else None,
            "cpu_ms_per_job": (data.redis_cpu_s * 1000 / len(ended)) if data.redis_cpu_s and ended else None,
            "top_commands": dict(list(delta.items())[:TOP_COMMANDS]),
        },
        "jobs_per_worker": dict(Counter(j["worker"] or "-" for j in jobs).most_common()),
        "max_deliveries": max((j["deliveries"] for j in jobs), default=0),
        "max_attempts": max((j["attempts"] for j in jobs), default=0),
        "completions_s": completion_times((j["ended_at"] for j in jobs), data.started_at),
        "started_at": data.started_at,
        "jobs": jobs,
    }


def write_report(report: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f}"


def format_summary(report: dict[str, Any]) -> str:
    """The human summary: counts, throughput, a phase table in milliseconds, failures, resources."""
    counts = report["counts"]
    tput = report["throughput_jobs_per_s"]
    lines = [
        f"{counts['done']}/{counts['submitted']} jobs ended ({counts['succeeded']} succeeded, "
        f"{counts['failed']} failed, {counts['unfinished']} unfinished) in {report['wall_s']:.1f} s, "
        f"mode {report['mode']}",
        f"throughput: {tput:.2f} jobs/s" if tput else "throughput: -",
        "",
        f"{'phase (ms)':<24}{'p50':>9}{'p95':>9}{'p99':>9}{'max':>9}{'n':>7}",
    ]
    for phase, s in report["phases_s"].items():
        lines.append(
            f"{phase:<24}{_ms(s['p50']):>9}{_ms(s['p95']):>9}{_ms(s['p99']):>9}{_ms(s['max']):>9}{s['count']:>7}"
        )
    failures = report["failures_by_kind"]
    lines += ["", "failures by kind: " + (", ".join(f"{k} {v}" for k, v in failures.items()) or "none")]
    peak = report["peak_live_containers"]
    lines.append(f"peak live containers: {'-' if peak is None else peak} ({report['containers_counted']})")
    rss = report["worker_rss_bytes"]
    if rss:
        per = ", ".join(f"{b / MIB:.0f}" for b in rss["peak_per_worker"].values())
        lines.append(f"worker RSS peak: {rss['peak_total'] / MIB:.0f} MiB in all (per worker MiB: {per})")
    else:
        lines.append("worker RSS: unknown (the fleet was not started here)")
    cpj = report["redis"]["commands_per_job"]
    if cpj["raw"] is not None:
        lines.append(
            f"Redis commands per job: {cpj['net']:.1f} net ({cpj['raw']:.1f} raw; own calls {cpj['own_calls']}, "
            f"idle background {report['redis']['idle_calls_per_s']:.1f}/s)"
        )
    cpu_ms = report["redis"]["cpu_ms_per_job"]
    if cpu_ms:
        lines.append(
            f"Redis CPU per job: {cpu_ms:.2f} ms (one Redis core at this mix: ~{1000 / cpu_ms:,.0f} jobs/s, "
            "idle background included)"
        )
    return "\n".join(lines)
