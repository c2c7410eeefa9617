"""What a worker measures, in its own ``CollectorRegistry`` (never the process-global one).

Jobs, phases, tool calls, tokens, repairs, limits and webhooks are counted from each ended job's final
record (:meth:`WorkerMetrics.job_ended`, a few increments per job). Live and warm sandboxes and sandbox
creations and failures by runtime are read from the sandbox pool at scrape time
(:class:`SandboxCollector`), so creating a container costs nothing extra; the MCP servers' states
(up, tools, restarts, list changes, the last ping) likewise from the MCP sessions
(:class:`McpCollector`, from the worker's first job on, when its servers start).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sandfleet.core.records import JobRecord

# Seconds: from a fast tool call to a slow model or a long program.
PHASE_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)
# Phase label -> the JobResult.timings key it comes from (queue_wait comes from the record's stamps).
PHASES = {
    "model": "model_s",
    "acquire": "acquire_s",
    "run": "run_s",
    "tool_calls": "tool_s",
    "total": "total_s",
}
OK, ERROR = "ok", "error"


class WorkerMetrics:
    """The worker's metrics. ``pool_stats`` returns the sandbox pool's figures, ``mcp_status`` the MCP
    servers' ServerStatus rows (None: not started)."""

    def __init__(
        self,
        pool_stats: Callable[[], dict[str, Any] | None] = lambda: None,
        mcp_status: Callable[[], list[Any] | None] = lambda: None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.jobs = Counter(
            "sandfleet_jobs", "Jobs ended here, by status and mode", ["status", "mode"], registry=r
        )
        self.phase = Histogram(
            "sandfleet_job_phase_seconds",
            "Seconds per job spent in each phase (queue_wait, model, acquire, run, tool_calls, total)",
            ["phase"],
            buckets=PHASE_BUCKETS_S,
            registry=r,
        )
        self.tool_calls = Counter(
            "sandfleet_tool_calls",
            "Tool calls of ended jobs, by tool and outcome",
            ["tool", "outcome"],
            registry=r,
        )
        self.tool_call_seconds = Histogram(
            "sandfleet_tool_call_seconds",
            "Seconds one tool call took on the host",
            buckets=PHASE_BUCKETS_S,
            registry=r,
        )
        self.tokens = Counter(
            "sandfleet_model_tokens", "Model tokens of ended jobs, by kind", ["kind"], registry=r
        )
        self.model_calls = Counter("sandfleet_model_calls", "Model calls of ended jobs", registry=r)
        self.repairs = Counter("sandfleet_repairs", "Repair attempts of ended jobs", registry=r)
        self.limits = Counter(
            "sandfleet_limits_hit", "Limits ended jobs hit, by limit", ["limit"], registry=r
        )
        self.webhooks = Counter(
            "sandfleet_webhooks",
            "Completion webhooks, by outcome (delivered, failed)",
            ["outcome"],
            registry=r,
        )
        self.registry.register(SandboxCollector(pool_stats))
        self.registry.register(McpCollector(mcp_status))

    def job_ended(self, record: JobRecord) -> None:
        """Count one ended job from its final record."""
        result = record.result
        mode = (result.mode.value if result is not None and result.mode else None) or (
            record.spec.mode.value if record.spec is not None else "unknown"
        )
        self.jobs.labels(record.status.value, mode).inc()
        queued, running = record.timestamps.get("queued"), record.timestamps.get("running")
        if queued is not None and running is not None:
            self.phase.labels("queue_wait").observe(max(0.0, running - queued))
        if result is None:
            return
        for phase, key in PHASES.items():
            if key in result.timings:
                self.phase.labels(phase).observe(result.timings[key])
        limits = set(result.limits_hit)
        for attempt in result.attempts:
            limits.update(attempt.limits_hit)
            for call in attempt.tool_calls:
                self.tool_calls.labels(call.tool, OK if call.ok else ERROR).inc()
                self.tool_call_seconds.observe(call.duration_ms / 1000.0)
        for turn in result.turns:
            for fcall in turn.calls:
                self.tool_calls.labels(fcall.tool, OK if fcall.ok else ERROR).inc()
                self.tool_call_seconds.observe(fcall.duration_ms / 1000.0)
        for limit in limits:
            self.limits.labels(str(limit)).inc()
        self.tokens.labels("prompt").inc(result.usage.prompt_tokens)
        self.tokens.labels("completion").inc(result.usage.completion_tokens)
        self.model_calls.inc(result.usage.model_calls)
        self.repairs.inc(result.repairs)

    def webhook_sent(self, delivered: bool) -> None:
        self.webhooks.labels("delivered" if delivered else "failed").inc()


class SandboxCollector(Collector):
    """Sandbox gauges and counters, read from the pool's own figures when Prometheus scrapes."""

    def __init__(self, pool_stats: Callable[[], dict[str, Any] | None]) -> None:
        self._pool_stats = pool_stats

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked: the families depend on the pool's state

    def collect(self) -> Iterator[Metric]:
        stats = self._pool_stats() or {}
        yield GaugeMetricFamily(
            "sandfleet_sandboxes_live",
            "Sandbox containers alive (warm, busy, starting)",
            value=stats.get("live", 0),
        )
        yield GaugeMetricFamily(
            "sandfleet_sandboxes_warm",
            "Warm sandbox containers waiting for a program",
            value=stats.get("idle", 0),
        )
        created = CounterMetricFamily(
            "sandfleet_sandbox_creations", "Sandbox containers started, by runtime", labels=["runtime"]
        )
        for runtime, count in sorted(stats.get("started_by_runtime", {}).items()):
            created.add_metric([runtime], count)
        yield created
        failed = CounterMetricFamily(
            "sandfleet_sandbox_failures",
            "Sandbox containers that failed to start, by runtime",
            labels=["runtime"],
        )
        for runtime, count in sorted(stats.get("failed_by_runtime", {}).items()):
            failed.add_metric([runtime], count)
        yield failed


class McpCollector(Collector):
    """One series per MCP server, read from the sessions' status when Prometheus scrapes."""

    def __init__(self, mcp_status: Callable[[], list[Any] | None]) -> None:
        self._mcp_status = mcp_status

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        statuses = self._mcp_status() or []
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "up": GaugeMetricFamily(
                "sandfleet_mcp_server_up", "1 if the MCP server is connected, else 0", labels=["server"]
            ),
            "tools": GaugeMetricFamily(
                "sandfleet_mcp_server_tools", "Tools the MCP server offers now", labels=["server"]
            ),
            "restarts": CounterMetricFamily(
                "sandfleet_mcp_server_restarts", "Reconnections (stdio: restarts)", labels=["server"]
            ),
            "notified": CounterMetricFamily(
                "sandfleet_mcp_list_changed", "List-changed notifications received", labels=["server"]
            ),
            "refreshes": CounterMetricFamily(
                "sandfleet_mcp_list_refreshes",
                "Listings read after list-changed notifications",
                labels=["server"],
            ),
            "ping_ms": GaugeMetricFamily(
                "sandfleet_mcp_ping_seconds", "The last answered ping's round trip", labels=["server"]
            ),
        }
        for status in statuses:
            labels = [status.name]
            families["up"].add_metric(labels, 1.0 if status.up else 0.0)
            families["tools"].add_metric(labels, status.tools)
            families["restarts"].add_metric(labels, status.restarts)
            families["notified"].add_metric(labels, status.notified)
            families["refreshes"].add_metric(labels, status.refreshes)
            if status.ping_ms is not None:
                families["ping_ms"].add_metric(labels, status.ping_ms / 1000.0)
        yield from families.values()
