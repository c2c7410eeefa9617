"""Where a job's events go, event by event: the one protocol every part that audits writes to.

In the fleet it is the job's signed chain in Redis (core/audit.py ``RedisAuditSink``); ``sandfleet
ask`` without --audit keeps nothing (``NullAudit``); tests and local runs keep a list (``ListAudit``).
The engine, the program runtime's artifacts and the approval gate all emit through it.
"""

from __future__ import annotations

from typing import Any, Protocol

from sandfleet.core.vocabulary import AuditKind


class AuditSink(Protocol):
    """Takes one event of a job: its kind, its data, and the code-action attempt it belongs to (0: none)."""

    def emit(self, kind: AuditKind, data: dict[str, Any], attempt: int = 0) -> None: ...


class NullAudit:
    """An audit sink that keeps nothing (``sandfleet ask`` without --audit)."""

    def emit(self, kind: AuditKind, data: dict[str, Any], attempt: int = 0) -> None:
        pass


class ListAudit:
    """An audit sink that keeps events in memory, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, dict[str, Any]]] = []

    def emit(self, kind: AuditKind, data: dict[str, Any], attempt: int = 0) -> None:
        self.events.append((kind, attempt, data))
