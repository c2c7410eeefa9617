"""What the workers' Prometheus endpoints say after a load test: scraped over HTTP, summed over the
workers, and told in a few lines (``sandfleet loadtest --metrics URL``, or every local worker's)."""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

SCRAPE_TIMEOUT_S = 5.0


def scrape(url: str) -> dict[str, float]:
    """``{"name{label=value,...}": value}`` of every sample at ``url`` (Prometheus text format).

    Raises:
        OSError: the endpoint cannot be reached.
    """
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def scrape_all(urls: Iterable[str]) -> tuple[dict[str, float], list[str]]:
    """The samples of every URL summed (gauges too: live sandboxes add up), and the URLs that failed."""
    total: dict[str, float] = defaultdict(float)
    failed = []
    for url in urls:
        try:
            for key, value in scrape(url).items():
                total[key] += value
        except OSError as e:
            failed.append(f"{url}: {e}")
    return dict(total), failed


def by_label(samples: dict[str, float], name: str) -> dict[str, float]:
    """``{"label=value,...": value}`` of one metric's samples."""
    prefix = name + "{"
    return {k[len(prefix) : -1]: v for k, v in samples.items() if k.startswith(prefix)}


def summarize(samples: dict[str, float], failed: list[str] | None = None) -> dict[str, Any]:
    """The figures worth printing: jobs by status and mode, mean seconds by phase, tokens, tool calls,
    repairs, limits hit, sandboxes (live, warm, created and failed by runtime)."""
    phases = {}
    for labels, total in by_label(samples, "sandfleet_job_phase_seconds_sum").items():
        count = samples.get(f"sandfleet_job_phase_seconds_count{{{labels}}}", 0.0)
        if count:
            phases[labels.removeprefix("phase=")] = round(total / count, 4)
    return {
        "jobs": by_label(samples, "sandfleet_jobs_total"),
        "mean_phase_s": phases,
        "tokens": by_label(samples, "sandfleet_model_tokens_total"),
        "model_calls": samples.get("sandfleet_model_calls_total", 0.0),
        "tool_calls": by_label(samples, "sandfleet_tool_calls_total"),
        "repairs": samples.get("sandfleet_repairs_total", 0.0),
        "limits_hit": by_label(samples, "sandfleet_limits_hit_total"),
        "sandboxes_live": samples.get("sandfleet_sandboxes_live", 0.0),
        "sandboxes_warm": samples.get("sandfleet_sandboxes_warm", 0.0),
        "sandbox_creations": by_label(samples, "sandfleet_sandbox_creations_total"),
        "sandbox_failures": by_label(samples, "sandfleet_sandbox_failures_total"),
        "unreachable": failed or [],
    }


def format_metrics(summary: dict[str, Any]) -> str:
    """A few lines for the terminal."""

    def pairs(values: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:g}" for k, v in sorted(values.items())) or "none"

    lines = [
        "worker metrics (Prometheus, summed over the workers):",
        f"  jobs: {pairs(summary['jobs'])}",
        f"  mean seconds by phase: {pairs(summary['mean_phase_s'])}",
        f"  model: {summary['model_calls']:g} calls; tokens {pairs(summary['tokens'])}",
        f"  tool calls: {pairs(summary['tool_calls'])}; repairs {summary['repairs']:g}",
        f"  limits hit: {pairs(summary['limits_hit'])}",
        f"  sandboxes: {summary['sandboxes_live']:g} live, {summary['sandboxes_warm']:g} warm; "
        f"created {pairs(summary['sandbox_creations'])}; failed {pairs(summary['sandbox_failures'])}",
    ]
    lines += [f"  unreachable: {u}" for u in summary["unreachable"]]
    return "\n".join(lines)
