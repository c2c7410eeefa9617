"""Drive a fleet with N jobs through the producer and collect what happened.

Every job carries one batch id, whatever the submission mode, so progress is one ``HGETALL`` of the
batch's counts and the records are found by batch afterwards. Modes: ``rate`` (one ``submit`` every
1/R s), ``burst`` (``submit`` as fast as one thread can) and ``batch`` (one ``submit_batch``).

Redis commands are counted from ``INFO commandstats`` just before the first submit and just after
the last job ended. The count includes the load test's own calls (INFO, progress polls), which are
known and reported, and the fleet's idle background (heartbeats, broker polls), measured over a
short idle window before the run.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import redis

from sandfleet.core.batch_creator import CREATOR_FIELD
from sandfleet.core.redis_connect import connect
from sandfleet.core.replies import text
from sandfleet.fleet.loadtest.phases import record_summary
from sandfleet.fleet.loadtest.sampler import FleetSampler, Samples
from sandfleet.fleet.loadtest.stats import parse_commandstats
from sandfleet.producer.client import Client, new_batch_id

PROGRESS_INTERVAL_S = 0.5
RATE_WINDOW_S = 5.0
RECORD_CHUNK = 500
FAILED_STATES = ("failed", "timed_out", "refused")


@dataclass(frozen=True)
class LoadPlan:
    """What to submit and how. ``rate`` None with ``batch`` False means burst."""

    jobs: int
    question: str
    tools: list[str]
    model: str | None
    sandbox: dict[str, Any] = field(default_factory=dict)
    rate: float | None = None
    batch: bool = False
    timeout_s: float = 600.0
    warmup: int = 0
    idle_window_s: float = 2.0

    @property
    def mode(self) -> str:
        return "batch" if self.batch else (f"rate {self.rate:g}/s" if self.rate else "burst")

    def spec(self, batch_id: str) -> dict[str, Any]:
        spec: dict[str, Any] = {"question": self.question, "tools": self.tools, "batch_id": batch_id}
        if self.model:
            spec["model"] = self.model
        if self.sandbox:
            spec["sandbox"] = self.sandbox
        return spec


@dataclass
class RunData:
    """Raw observations of one run, for the report."""

    plan: LoadPlan
    batch_id: str
    started_at: float = 0.0  # epoch s, just before the first submit
    submitted_at: float = 0.0  # the last submit returned
    finished_at: float = 0.0  # every job ended (or the wait gave up)
    finished: bool = False
    jobs: list[dict[str, Any]] = field(default_factory=list)  # record summaries
    commands_before: dict[str, int] = field(default_factory=dict)
    commands_after: dict[str, int] = field(default_factory=dict)
    idle_calls_per_s: float = 0.0
    redis_cpu_s: float | None = None  # Redis' own CPU (user + sys) over the run
    redis_memory_bytes: int | None = None  # used_memory growth over the run (records kept)
    own_calls: int = 0
    progress: list[tuple[float, int, int]] = field(default_factory=list)  # (epoch s, done, failed)
    samples: Samples = field(default_factory=Samples)


class ProgressLine:
    """One updating line on ``stream``: done, failed, in flight, rate over the last few seconds."""

    def __init__(self, total: int, stream: TextIO | None) -> None:
        self.total = total
        self.stream = stream
        self._width = 0

    def show(self, history: list[tuple[float, int, int]], counts: dict[str, int]) -> None:
        if self.stream is None or not history:
            return
        now, done, failed = history[-1]
        past = next(((t, d) for t, d, _ in history if t >= now - RATE_WINDOW_S), (now, done))
        rate = (done - past[1]) / (now - past[0]) if now > past[0] else 0.0
        text = (
            f"loadtest: {done}/{self.total} done, {failed} failed, {counts.get('running', 0)} running, "
            f"{counts.get('queued', 0)} queued | {rate:.1f} jobs/s | {now - history[0][0]:.0f} s"
        )
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def end(self) -> None:
        if self.stream is not None and self._width:
            self.stream.write("\n")
            self.stream.flush()


def command_snapshot(client: redis.Redis) -> dict[str, int]:
    return parse_commandstats(client.info("commandstats"))


def redis_cpu_s(client: redis.Redis) -> float:
    """CPU seconds the Redis server used so far (user + system)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def warm_up(client: Client, plan: LoadPlan, count: int, timeout_s: float) -> None:
    """Run ``count`` jobs first (not measured), so pools are warm and model servers started."""
    if count <= 0:
        return
    batch_id = new_batch_id()
    handle = client.submit_batch([plan.spec(batch_id) for _ in range(count)], batch_id=batch_id)
    handle.wait(timeout=timeout_s)


def run_load(
    client: Client,
    plan: LoadPlan,
    *,
    sampler: FleetSampler | None = None,
    progress_stream: TextIO | None = sys.stderr,
    on_progress: Callable[[int], None] | None = None,
) -> RunData:
    """Submit ``plan.jobs`` jobs, wait for them (at most ``plan.timeout_s``), and collect records.

    ``on_progress(done)`` is called from the progress thread at each poll (a fault injector's cue).
    """
    warm_up(client, plan, plan.warmup, plan.timeout_s)
    stats_client = connect(client.records_url, client.settings)
    data = RunData(plan=plan, batch_id=new_batch_id())
    try:
        if plan.idle_window_s > 0:
            first = command_snapshot(stats_client)
            time.sleep(plan.idle_window_s)
            second = command_snapshot(stats_client)
            idle = sum(second.values()) - sum(first.values()) - 1  # the second INFO counts itself
            data.idle_calls_per_s = max(0, idle) / plan.idle_window_s
        memory_before = int(stats_client.info("memory")["used_memory"])
        cpu_before = redis_cpu_s(stats_client)
        data.commands_before = command_snapshot(stats_client)
        data.own_calls = 1  # that INFO commandstats shows in the after snapshot (the other INFOs do not)
        if sampler is not None:
            sampler.start()
        data.started_at = time.time()
        counts_key = client.keys.batch_counts(data.batch_id)
        line = ProgressLine(plan.jobs, progress_stream)
        waiter = _ProgressWatcher(stats_client, counts_key, data, line, on_progress)
        waiter.start()
        _submit_all(client, plan, data.batch_id)
        data.submitted_at = time.time()
        data.finished = waiter.wait(data.started_at + plan.timeout_s)
        data.finished_at = time.time()
        data.commands_after = command_snapshot(stats_client)
        data.redis_cpu_s = redis_cpu_s(stats_client) - cpu_before
        data.redis_memory_bytes = int(stats_client.info("memory")["used_memory"]) - memory_before
        data.own_calls += waiter.polls
        if sampler is not None:
            data.samples = sampler.stop()
        data.jobs = collect_records(client, data.batch_id)
    finally:
        if sampler is not None:
            sampler.stop()
        stats_client.close()
    return data


def _submit_all(client: Client, plan: LoadPlan, batch_id: str) -> None:
    if plan.batch:
        client.submit_batch([plan.spec(batch_id) for _ in range(plan.jobs)], batch_id=batch_id)
        return
    began = time.monotonic()
    for index in range(plan.jobs):
        if plan.rate:
            delay = began + index / plan.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        client.submit(plan.spec(batch_id))


class _ProgressWatcher:
    """Polls the batch's counts in a thread, keeps the (time, done, failed) history, draws the line."""

    def __init__(
        self,
        redis_client: redis.Redis,
        key: str,
        data: RunData,
        line: ProgressLine,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self._on_progress = on_progress
        self._redis = redis_client
        self._key = key
        self._data = data
        self._line = line
        self._all_done = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="loadtest-progress", daemon=True)
        self.polls = 0

    def start(self) -> None:
        self._thread.start()

    def wait(self, deadline: float) -> bool:
        """True when every job ended before ``deadline`` (epoch s)."""
        ok = self._all_done.wait(max(0.0, deadline - time.time()))
        self._stop.set()
        self._thread.join(timeout=5)
        self._line.end()
        return ok

    def _loop(self) -> None:
        total = self._data.plan.jobs
        while not self._stop.is_set():
            try:
                raw = self._redis.hgetall(self._key)
            except redis.RedisError:  # Redis failing over (--kill-redis-primary): poll again
                self._stop.wait(PROGRESS_INTERVAL_S)
                continue
            self.polls += 1
            counts = {text(k): int(v) for k, v in raw.items() if text(k) != CREATOR_FIELD}
            failed = sum(counts.get(s, 0) for s in FAILED_STATES)
            done = counts.get("succeeded", 0) + failed
            self._data.progress.append((time.time(), done, failed))
            self._line.show(self._data.progress, counts)
            if self._on_progress is not None:
                self._on_progress(done)
            if done >= total:
                self._all_done.set()
                return
            self._stop.wait(PROGRESS_INTERVAL_S)


def collect_records(client: Client, batch_id: str) -> list[dict[str, Any]]:
    """Summaries (see :func:`record_summary`) of every job of the batch, in submission order."""
    job_ids = client.reader.batch_job_ids(batch_id)
    out: list[dict[str, Any]] = []
    for start in range(0, len(job_ids), RECORD_CHUNK):
        records = client.reader.records(job_ids[start : start + RECORD_CHUNK])
        out.extend(record_summary(r.model_dump(mode="json")) for r in records)
    return out
