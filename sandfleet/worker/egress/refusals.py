"""A sandbox's refused connections, as a run reports them: the small part of the egress room that every
run needs, apart from gateway.py, which loads the settings, the proxy and the filter (``network``
"restricted" only). A run with network "none" imports only this (issue 25: what ``sandfleet run``
loads)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Refusals:
    """A sandbox's refused connections over some span (a run, a command): the itemised ones, and how
    many there were in all (the proxy's, each itemised, and every packet the filter's REJECT rules
    counted, logged or not). ``total - listed`` were refused past the filter log's rate."""

    denials: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0

    @property
    def listed(self) -> int:
        return sum(int(d.get("count", 1)) for d in self.denials)

    @property
    def unlisted(self) -> int:
        return self.total - self.listed


def take_refusals(container: Any) -> Refusals:
    """A sandbox's refused connections since the last call; none for sandboxes without egress."""
    lease = getattr(getattr(container, "handle", None), "egress", None)
    return lease.take() if lease is not None else Refusals()
