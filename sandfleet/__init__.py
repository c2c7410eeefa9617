"""Sandfleet: an asynchronous fleet for code-action jobs run in locked-down, single-use sandboxes.

``from sandfleet import Client, JobSpec, JobResult, SandboxConfig, CodeActionSettings``.

The namespace has three rooms and a workshop (ARCHITECTURE.md):

    sandfleet.core      contracts, settings, Redis keys, job records (read and write), audit chain,
                        errors, the shared Celery configuration. Depends on no other room.
    sandfleet.producer  the client and its CLI commands. Imports only the core.
    sandfleet.worker    the Celery app and task, engine, model client, sandbox, bridge, tools.
                        Imports only the core.
    sandfleet.fleet     local fleets, the load test and the demo: they drive both sides.

The names below load on first use, so importing one room does not import another.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_EXPORTS = {
    "Client": "sandfleet.producer.client",
    "JobHandle": "sandfleet.producer.client",
    "BatchHandle": "sandfleet.producer.client",
    "JobSpec": "sandfleet.core.contracts",
    "JobResult": "sandfleet.core.contracts",
    "JobStatus": "sandfleet.core.contracts",
    "SandboxConfig": "sandfleet.core.config",
    "CodeActionSettings": "sandfleet.core.config",
}

__all__ = [
    "BatchHandle",
    "Client",
    "CodeActionSettings",
    "JobHandle",
    "JobResult",
    "JobSpec",
    "JobStatus",
    "SandboxConfig",
    "__version__",
]

if TYPE_CHECKING:
    from sandfleet.core.config import CodeActionSettings, SandboxConfig
    from sandfleet.core.contracts import JobResult, JobSpec, JobStatus
    from sandfleet.producer.client import BatchHandle, Client, JobHandle


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sandfleet' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
