"""Helpers shared by the benchmark scripts: summaries, a labelled pool, the runtimes to compare."""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

RUNTIMES = {"runc": "docker", "runsc": "gvisor"}  # Docker runtime -> SandboxConfig backend
BENCH_LABEL = "sandfleet.benchmark"


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """Median, p95, mean and min of samples given in seconds, in milliseconds."""
    ms = sorted(s * 1000 for s in samples_s)
    p95 = statistics.quantiles(ms, n=20)[18] if len(ms) >= 2 else ms[0]
    return {
        "n": len(ms),
        "median": statistics.median(ms),
        "p95": p95,
        "mean": statistics.fmean(ms),
        "min": ms[0],
    }


def paired_difference(first: Sequence[float], second: Sequence[float]) -> tuple[float, float, float]:
    """Median, p25 and p75 of ``second[i] - first[i]``, for samples taken in turns (each pair saw the
    same moment of a shared host). A difference of two noisy medians can take either sign: its spread
    says whether it means anything."""
    deltas = [b - a for a, b in zip(first, second, strict=True)]
    if len(deltas) < 2:
        return deltas[0], deltas[0], deltas[0]
    q1, q2, q3 = statistics.quantiles(deltas, n=4)
    return q2, q1, q3


def median_difference_interval(
    first: Sequence[float], second: Sequence[float], resamples: int = 1000, seed: int = 0
) -> tuple[float, float, float]:
    """``median(second) - median(first)`` with a 95 % bootstrap interval, for samples not taken in
    pairs (blocks of calls); seeded, so one run's figures can be printed again."""
    rng = random.Random(seed)
    spread = sorted(
        statistics.median(rng.choices(second, k=len(second)))
        - statistics.median(rng.choices(first, k=len(first)))
        for _ in range(resamples)
    )
    low, high = spread[int(0.025 * (resamples - 1))], spread[int(0.975 * (resamples - 1))]
    return statistics.median(second) - statistics.median(first), low, high


def fmt(stats: dict[str, float]) -> str:
    return (
        f"median {stats['median']:8.3f} ms   p95 {stats['p95']:8.3f} ms   "
        f"mean {stats['mean']:8.3f} ms   min {stats['min']:8.3f} ms   (n={int(stats['n'])})"
    )


@contextmanager
def labelled_pool(name: str, **options: Any) -> Iterator[Any]:
    """A SandboxPool whose containers carry ``sandfleet.benchmark=name``; closed (drained) afterwards."""
    from sandfleet.worker.sandbox.pool import SandboxPool

    with SandboxPool(labels={BENCH_LABEL: name}, **options) as pool:
        yield pool


def wait_until(condition: Callable[[], bool], timeout_s: float = 30.0, every_s: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout_s
    while not (ok := condition()) and time.monotonic() < deadline:
        time.sleep(every_s)
    return bool(ok)


def engine_runtimes() -> set[str]:
    from sandfleet.worker.sandbox.docker.backend import engine_info

    return set(engine_info().runtimes)


MODEL_SERVER = """
import json, sys
from sandfleet.worker.llm.scripted.script import parse_script
from sandfleet.worker.llm.scripted.server import ReplayServer
with ReplayServer(parse_script(json.loads(sys.stdin.readline())), latency_s=0.0) as server:
    print(server.base_url, flush=True)
    sys.stdin.read()
"""


@contextmanager
def model_server(script: dict[str, Any]) -> Iterator[tuple[str, int]]:
    """A replay model server answering from ``script``, in a process of its own (so a worker's CPU
    is the worker's alone): yields its base URL and pid; stopped when stdin closes."""
    import json
    import subprocess
    import sys

    server = subprocess.Popen(
        [sys.executable, "-c", MODEL_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps(script) + "\n")
        server.stdin.flush()
        yield server.stdout.readline().strip(), server.pid
    finally:
        if server.stdin:
            server.stdin.close()
        server.wait(timeout=10)


def served_model_env(base_url: str) -> dict[str, str]:
    """Worker settings for a model reached at ``base_url`` with the openai client (model ``openai:replay``)."""
    return {"SANDFLEET_MODEL_BASE_URL": base_url, "SANDFLEET_MODEL_API_KEY": "replay"}
