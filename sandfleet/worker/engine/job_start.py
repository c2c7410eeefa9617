"""One job as its mode takes it: the spec, its id, the worker's services, its audit, when it began.

Every step of every mode reads these; they travel together so that no step takes them one by one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sandfleet.core.audit_sink import AuditSink
from sandfleet.core.contracts import JobSpec
from sandfleet.worker.engine.services import EngineServices


@dataclass(frozen=True)
class JobStart:
    """One job as its mode takes it (``began``: time.perf_counter() when it did)."""

    spec: JobSpec
    job_id: str
    services: EngineServices
    audit: AuditSink
    base_url: str | None = None
    began: float = field(default_factory=time.perf_counter)

    @property
    def model_name(self) -> str:
        """The model the job names, else the worker's default."""
        return self.spec.model or self.services.settings.model

    def total_s(self) -> float:
        return time.perf_counter() - self.began
