"""What reports on the jobs a worker ends: its Prometheus metrics (sandfleet/worker/metrics/) and the completion
webhooks (sandfleet/worker/webhooks/), each a job-end hook (:class:`MetricsHook`, :class:`WebhookHook`) of
the worker's ``JobEnd`` (sandfleet/worker/delivery/job_end.py).

:class:`JobReporting` is owned by ``WorkerState``: built with the settings (nothing started),
:meth:`JobReporting.start` when the worker starts consuming, :meth:`JobReporting.stop` when it stops.
The metrics exist only when ``SANDFLEET_METRICS_PORT`` is set, so a worker without them pays nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sandfleet.core.settings import Settings
from sandfleet.core.signing import KeyRing
from sandfleet.core.store import JobStore, Transition
from sandfleet.worker.delivery.job_end import JobEnd, JobEndHook, JobEnding

log = logging.getLogger("sandfleet.worker")


class JobReporting:
    """Metrics and webhooks of one worker process. ``pool_stats`` reads the sandbox pool's figures,
    ``mcp_status`` the MCP servers' states."""

    def __init__(
        self,
        settings: Settings,
        pool_stats: Callable[[], dict[str, Any] | None],
        mcp_status: Callable[[], list[Any] | None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.metrics: Any = None  # WorkerMetrics, when the metrics port is set
        self.webhooks: Any = None  # Webhooks, once started
        self._server: Any = None
        if settings.metrics_port:
            from sandfleet.worker.metrics import WorkerMetrics

            self.metrics = WorkerMetrics(pool_stats, mcp_status)

    def start(self, store: JobStore, job_end: JobEnd, ring: Callable[[], KeyRing] | None = None) -> None:
        """Serve the metrics (an unusable port is logged, not fatal) and hook both into ``job_end``.
        ``ring``: the key set the webhook outbox's sweep verifies chains with (None: no sweep)."""
        if self.webhooks is not None:
            return
        if self.metrics is not None:
            from sandfleet.worker.metrics import start_metrics

            job_end.add(MetricsHook(self.metrics))
            try:
                self._server = start_metrics(self.settings, self.metrics)
            except OSError as e:
                log.error(
                    "metrics: cannot listen on %s:%d (%s); set SANDFLEET_METRICS_PORT to a free port",
                    self.settings.metrics_address, self.settings.metrics_port, e,
                )  # fmt: skip
        from sandfleet.worker.webhooks import Webhooks

        on_sent = self.metrics.webhook_sent if self.metrics is not None else None
        worker = store.signer.worker if store.signer is not None else ""
        self.webhooks = Webhooks(self.settings, store.redis, worker=worker, ring=ring, on_sent=on_sent)
        job_end.add(WebhookHook(self.webhooks))

    def sweep_outbox(self) -> None:
        """Send the fleet's committed webhooks that no live worker is sending (after each recovery
        sweep; sandfleet/worker/webhooks/sweep.py). Logged, never raised."""
        if self.webhooks is None:
            return
        try:
            self.webhooks.sweep()
        except Exception as e:  # Redis away: the next sweep tries again
            log.warning("sweeping the webhook outbox failed: %s", e)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        if self.webhooks is not None:
            self.webhooks.close()


class MetricsHook(JobEndHook):
    """Counts each job this process recorded the end of (never a late duplicate twice)."""

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics  # WorkerMetrics

    def on_recorded(self, ending: JobEnding) -> None:
        record = ending.final_record()  # the final record: its stamps give the queue wait
        if record is not None:
            self.metrics.job_ended(record)


class WebhookHook(JobEndHook):
    """Commits a job's completion webhooks in its chain before the seal, sends them after its record."""

    def __init__(self, webhooks: Any) -> None:
        self.webhooks = webhooks  # Webhooks

    def before_seal(self, ending: JobEnding) -> None:
        record = ending.known_record()  # the delivery's copy: its spec names the webhooks
        spec = record.spec if record is not None else None
        if record is not None and spec is not None and (spec.webhook or spec.batch_webhook):
            self.webhooks.before_seal(record, ending.result, ending.store.audit_sink(ending.job_id))

    def on_recorded(self, ending: JobEnding) -> None:
        self.webhooks.job_ended(ending.job_id)

    def on_end(self, ending: JobEnding) -> None:
        if ending.outcome != Transition.APPLIED:  # another delivery wrote the record: its POSTs count
            self.webhooks.discard(ending.job_id)
