"""The code-action engine: turns a JobSpec into a JobResult (see loop.py)."""

from sandfleet.worker.engine.loop import AuditSink, ListAudit, NullAudit, run_job
from sandfleet.worker.engine.services import EngineServices

__all__ = ["AuditSink", "EngineServices", "ListAudit", "NullAudit", "run_job"]
