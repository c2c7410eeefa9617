"""Pure statistics for load tests: percentiles, per-phase summaries, failures, Redis command deltas.

No I/O and no clock here: everything takes plain values, so it is unit-tested without a fleet.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

QUANTILES = (("p50", 50.0), ("p95", 95.0), ("p99", 99.0))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between ranks (numpy's default).

    Raises:
        ValueError: no values, or ``q`` outside 0..100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"q must be within 0..100, got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    if low == high:
        return float(ordered[low])
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """``{"count", "mean", "p50", "p95", "p99", "max"}`` of ``values`` (None figures when empty)."""
    if not values:
        return {"count": 0, "mean": None, **{name: None for name, _ in QUANTILES}, "max": None}
    return {
        "count": len(values),
        "mean": sum(values) / len(values),
        **{name: percentile(values, q) for name, q in QUANTILES},
        "max": float(max(values)),
    }


def phase_summaries(
    per_job: Iterable[Mapping[str, float]], phases: Sequence[str]
) -> dict[str, dict[str, float | int | None]]:
    """Summaries per phase, in ``phases`` order, over the jobs that have that phase."""
    samples: dict[str, list[float]] = {p: [] for p in phases}
    for job in per_job:
        for phase in phases:
            if phase in job:
                samples[phase].append(job[phase])
    return {phase: summarize(values) for phase, values in samples.items()}


def failures_by_kind(jobs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Jobs that did not succeed, counted by error kind (``unfinished`` for jobs with no final state)."""
    kinds: Counter[str] = Counter()
    for job in jobs:
        if job.get("status") == "succeeded":
            continue
        if job.get("ended_at") is None:
            kinds["unfinished"] += 1
        else:
            kinds[job.get("error_kind") or job.get("status") or "unknown"] += 1
    return dict(kinds.most_common())


def throughput(count: int, started: float, ended: float) -> float | None:
    """Jobs per second over ``[started, ended]``; None when the interval is empty."""
    span = ended - started
    return count / span if count and span > 0 else None


def completion_times(ended_at: Iterable[float | None], started: float) -> list[float]:
    """Seconds from ``started`` at which each job ended, sorted; unfinished jobs left out."""
    return sorted(t - started for t in ended_at if t is not None)


def windowed_rate(times: Sequence[float], now: float, window_s: float) -> float:
    """Events per second among ``times`` within the last ``window_s`` seconds before ``now``."""
    if window_s <= 0:
        raise ValueError("window_s must be positive")
    return sum(1 for t in times if now - window_s < t <= now) / window_s


def parse_commandstats(info: Mapping[str, Any]) -> dict[str, int]:
    """``{command: calls}`` from redis-py's ``INFO commandstats`` dict (``cmdstat_get: {calls: ..}``)."""
    out: dict[str, int] = {}
    for key, value in info.items():
        if key.startswith("cmdstat_") and isinstance(value, Mapping):
            out[key.removeprefix("cmdstat_")] = int(value.get("calls", 0))
    return out


def command_delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """Calls per command between two snapshots, largest first, zero deltas left out."""
    delta = {cmd: after.get(cmd, 0) - before.get(cmd, 0) for cmd in set(before) | set(after)}
    return dict(sorted(((c, n) for c, n in delta.items() if n), key=lambda item: (-item[1], item[0])))


def commands_per_job(
    delta: Mapping[str, int],
    jobs: int,
    *,
    own_calls: int = 0,
    idle_rate_per_s: float = 0.0,
    duration_s: float = 0.0,
) -> dict[str, float | int | None]:
    """Redis commands per job from a commandstats delta.

    ``raw`` divides every call by ``jobs``. ``net`` first takes away the measuring side's own calls
    (``own_calls``: INFO, progress polls) and the fleet's idle background (heartbeats, broker polls)
    at ``idle_rate_per_s`` over ``duration_s``.
    """
    total = sum(delta.values())
    if jobs <= 0:
        return {"total_calls": total, "raw": None, "net": None}
    background = idle_rate_per_s * duration_s
    return {
        "total_calls": total,
        "own_calls": own_calls,
        "background_calls": round(background),
        "raw": total / jobs,
        "net": max(0.0, total - own_calls - background) / jobs,
    }
