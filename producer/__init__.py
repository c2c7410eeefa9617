"""Sandfleet's producer: job contracts, the client that enqueues them, and the CLI.

Importing this package pulls in neither ``docker`` nor ``openai``.
"""

from producer.client import BatchHandle, Client, JobHandle
from producer.config import CodeActionSettings, SandboxConfig
from producer.contracts import JobResult, JobSpec, JobStatus

__all__ = [
    "BatchHandle",
    "Client",
    "CodeActionSettings",
    "JobHandle",
    "JobResult",
    "JobSpec",
    "JobStatus",
    "SandboxConfig",
]
