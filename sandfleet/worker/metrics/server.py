"""The worker's ``/metrics`` endpoint: ``prometheus_client``'s own HTTP server, in a daemon thread of
the main process, for the worker's registry only."""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import start_http_server

from sandfleet.core.settings import Settings
from sandfleet.worker.metrics.registry import WorkerMetrics

log = logging.getLogger("sandfleet.worker.metrics")


class MetricsServer:
    """A started metrics endpoint; :meth:`stop` closes it."""

    def __init__(self, httpd: Any, thread: Any, url: str) -> None:
        self._httpd = httpd
        self._thread = thread
        self.url = url

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def start_metrics(settings: Settings, metrics: WorkerMetrics) -> MetricsServer | None:
    """Serve ``metrics`` on ``settings.metrics_address:metrics_port`` (None when the port is 0).

    Raises:
        OSError: the port cannot be bound (taken, or not allowed).
    """
    if not settings.metrics_port:
        return None
    httpd, thread = start_http_server(
        settings.metrics_port, settings.metrics_address, registry=metrics.registry
    )
    url = f"http://{settings.metrics_address}:{settings.metrics_port}/metrics"
    log.info("metrics at %s", url)
    return MetricsServer(httpd, thread, url)
