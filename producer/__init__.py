"""Sandfleet's producer: job contracts, the client that enqueues them, and the CLI.

Importing this package pulls in neither ``docker`` nor ``openai``.
"""

from producer.config import CodeActionSettings, SandboxConfig
from producer.contracts import JobResult, JobSpec, JobStatus

__all__ = ["CodeActionSettings", "JobResult", "JobSpec", "JobStatus", "SandboxConfig"]
