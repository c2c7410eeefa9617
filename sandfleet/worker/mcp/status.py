"""One MCP server's state as the worker sees it: for ``sandfleet doctor``, ``sandfleet tools`` and the
metrics; and as a worker reports it to the fleet (``{p}:worker:{name}:mcp``, refreshed with its
heartbeat), read back by ``sandfleet doctor`` from another process.

The report is read back from Redis, so whoever can write there controls it: :func:`from_report`
takes only the known fields, of the right types, strings cut to ``MAX_TEXT_CHARS``, at most
``MAX_SERVERS`` of them; the doctor prints them escaped. No SDK import here: the metrics and the
doctor read statuses without loading the MCP SDK.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from sandfleet.core import json_limits
from sandfleet.core.errors import JsonLimitError

MAX_SERVERS = 100
MAX_TEXT_CHARS = 500
MAX_REPORT_FIELD_BYTES = 8192


@dataclass(frozen=True)
class ServerStatus:
    """A server as ``sandfleet doctor`` shows it. ``since``: wall-clock time it came up or went down
    (0: never up yet); ``ping_ms``: the last ping's round trip (None: none answered on this
    connection yet); ``notified``/``refreshes``: list-changed notifications and the listings read
    after them, over the worker's life."""

    name: str
    where: str
    up: bool
    detail: str
    fix: str
    tools: int
    restarts: int
    disabled: bool = False
    resources: int = 0
    since: float = 0.0
    ping_ms: float | None = None
    notified: int = 0
    refreshes: int = 0


_KINDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "where": (str,),
    "up": (bool,),
    "detail": (str,),
    "fix": (str,),
    "tools": (int,),
    "restarts": (int,),
    "disabled": (bool,),
    "resources": (int,),
    "since": (int, float),
    "ping_ms": (int, float, type(None)),
    "notified": (int,),
    "refreshes": (int,),
}
assert set(_KINDS) == {f.name for f in fields(ServerStatus)}


def to_report(statuses: list[ServerStatus]) -> dict[str, str]:
    """Hash fields: server name -> the status as JSON."""
    return {s.name: json.dumps(asdict(s), separators=(",", ":")) for s in statuses[:MAX_SERVERS]}


def from_report(raw: dict[Any, Any]) -> list[ServerStatus]:
    """The statuses of a report read back; entries that are not well-formed are left out."""
    statuses = []
    for key in sorted(raw, key=str)[:MAX_SERVERS]:
        status = _status(raw[key])
        if status is not None:
            statuses.append(status)
    return statuses


def _status(value: Any) -> ServerStatus | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str) or len(value) > MAX_REPORT_FIELD_BYTES:
        return None
    try:
        data = json_limits.loads(value, "an MCP status", cap=2)
    except (ValueError, JsonLimitError):
        return None
    if not isinstance(data, dict):
        return None
    kept: dict[str, Any] = {}
    for name, kinds in _KINDS.items():
        item = data.get(name)
        if name not in data or type(item) not in kinds or not _finite(item):
            return None
        kept[name] = item[:MAX_TEXT_CHARS] if isinstance(item, str) else item
    return ServerStatus(**kept)


def _finite(item: Any) -> bool:
    return not isinstance(item, float) or math.isfinite(item)
