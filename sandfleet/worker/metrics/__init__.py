"""Prometheus metrics of one worker (the standard ``prometheus_client``), served on
``SANDFLEET_METRICS_PORT`` (0: off) at ``http://ADDRESS:PORT/metrics``.

The rest of the worker calls a few small functions: :func:`start_metrics` (from ``WorkerState.start``)
and, through ``WorkerState.reporters``, :meth:`WorkerMetrics.job_ended` with the final record of each
job a delivery here ended. Sandbox figures are read from the pool when Prometheus scrapes, so the hot
path pays nothing for them. What is measured: metrics/registry.py; the server: metrics/server.py.

Why one registry in the main process, not ``prometheus_client``'s multiprocess mode: ``sandfleet
worker`` always runs Celery's thread pool (jobs mostly wait on the model, so threads in one process
are the fleet's concurrency), so every job of a worker runs in the process that serves its metrics and
one in-memory registry is exact. Multiprocess mode would need a shared directory set before the client
is imported, files per child, and could not serve gauges read live from the sandbox pool.
"""

from sandfleet.worker.metrics.registry import WorkerMetrics
from sandfleet.worker.metrics.server import MetricsServer, start_metrics

__all__ = ["MetricsServer", "WorkerMetrics", "start_metrics"]
