"""``sandfleet doctor``'s MCP rows: the servers of a config file, connected from here, and the servers
every live worker of the fleet holds, as it reported them with its last heartbeat.

Both are informational (a worker still runs jobs that do not need a server that is down), except that
a malformed config file is a failure: a worker would refuse to start with it. A worker's report is
read back from the records' Redis (``{p}:worker:{name}:mcp``, with ``SANDFLEET_RESULTS_REDIS_URL``
apart from the broker): parsed with bounds (sandfleet/worker/mcp/status.py),
shown on one line each and escaped by the doctor's printing.
"""

from __future__ import annotations

import re
import time

from sandfleet.core.errors import SandfleetError
from sandfleet.core.settings import Settings
from sandfleet.worker.cli.doctor_checks import Check
from sandfleet.worker.mcp.status import ServerStatus, from_report

REDIS_TIMEOUT_S = 2.0
MAX_WORKERS = 200  # workers shown; a fleet's set of names is a Redis writer's
_BREAKS = re.compile(r"[\r\n\x0b\x0c\x85\u2028\u2029]+")


def mcp_checks(path: str) -> list[Check]:
    """One row per server of the file at ``path``: reachable from here (its tool count) or not (why,
    and the fix)."""
    from sandfleet.worker.mcp.config import load_mcp_config
    from sandfleet.worker.mcp.sessions import McpSessions

    try:
        config = load_mcp_config(path)
    except SandfleetError as e:
        return [Check("MCP config", False, str(e), "correct the file (the line and field are named)")]
    with McpSessions(config) as sessions:
        statuses = sessions.status()
    return [
        Check(f"MCP server {s.name}", s.up or s.disabled, f"{s.where}: {s.detail}", s.fix, required=False)
        for s in statuses
    ]


def fleet_mcp_checks(settings: Settings) -> list[Check]:
    """One row per MCP server of each live worker (``MCP server NAME on WORKER``): up, with its
    tools and last ping, or down since when and why; as the worker saw it at most a heartbeat ago."""
    import redis

    from sandfleet.core.redis_connect import RedisUrlError, connect, records_url
    from sandfleet.core.redis_keys import FleetKeys
    from sandfleet.core.replies import text_list

    keys = FleetKeys(settings.key_prefix)
    rows: list[Check] = []
    try:
        client = connect(  # where WorkerPresence writes them: the records' Redis, not the broker's
            records_url(settings),
            settings,
            socket_connect_timeout=REDIS_TIMEOUT_S,
            socket_timeout=REDIS_TIMEOUT_S,
        )
        try:
            for worker in sorted(text_list(client.smembers(keys.workers)))[:MAX_WORKERS]:
                if not client.exists(keys.heartbeat(worker)):
                    continue
                for status in from_report(client.hgetall(keys.worker_mcp(worker))):
                    rows.append(_row(_one_line(worker), status))
        finally:
            client.close()
    except (redis.RedisError, RedisUrlError) as e:
        return [
            Check("MCP servers of the fleet", False, f"cannot read the workers' reports: {e}", required=False)
        ]
    return rows


def _row(worker: str, status: ServerStatus) -> Check:
    name = f"MCP server {_one_line(status.name)} on {worker}"
    since = f" for {_age(status.since)}" if status.since else ""
    if status.up:
        ping = f"; last ping {status.ping_ms:g} ms" if status.ping_ms is not None else ""
        return Check(name, True, f"up{since}: {_one_line(status.detail)}{ping}", required=False)
    if status.disabled:
        return Check(name, True, "disabled in the worker's config", required=False)
    return Check(
        name, False, f"down{since}: {_one_line(status.detail)}", _one_line(status.fix), required=False
    )


def _age(since: float) -> str:
    seconds = max(0.0, time.time() - since)
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _one_line(text: str) -> str:
    return _BREAKS.sub(" ", text)
