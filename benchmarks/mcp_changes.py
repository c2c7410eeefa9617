"""MCP servers that change, measured: how long from a server's list change to a new job seeing the
tool, and what the worker's periodic ping costs; over stdio in both protocol eras and over HTTP.

    .venv/bin/python benchmarks/mcp_changes.py [--changes 20] [--pings 200]

The server is the tests' tests/mcp_tools/servers/changing.py, held by the worker's own McpSessions.
Per transport:
  1. change -> seen: ``change(add=[tN])`` is called (the server notifies the change before it
     answers) and the catalog a job is admitted from (ToolCatalog.registry()) is polled every 1 ms
     until ``ch__tN`` is in it; timed from the call's answer. With no rate limit
     (SANDFLEET_MCP_REFRESH_INTERVAL_S=0), then once with the default 1 s right after a refresh, to
     show what the limit costs a change that follows another within the interval;
  2. ping: ``McpSessions.ping`` timed from the caller (a thread, as the bridge calls), and this
     process's CPU time per ping (the session's loop thread included); a tools/call of a trivial
     tool beside it for scale. The worker pings every SANDFLEET_MCP_PING_INTERVAL_S (10 s).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _common import fmt, summary_ms, wait_until

ROOT = Path(__file__).resolve().parents[1]
CHANGING = ROOT / "tests" / "mcp_tools" / "servers" / "changing.py"


def sessions_for(entry: dict[str, Any], refresh_interval_s: float) -> Any:
    from sandfleet.worker.mcp.config import parse_mcp_config
    from sandfleet.worker.mcp.sessions import McpSessions

    config = parse_mcp_config(json.dumps({"mcpServers": {"ch": entry}}))
    return McpSessions(config, refresh_interval_s=refresh_interval_s, ping_interval_s=3600)


def change_to_seen(sessions: Any, catalog: Any, name: str) -> float:
    sessions.call("ch", "change", {"add": [name]}, 30)
    answered = time.perf_counter()
    if not wait_until(lambda: f"ch__{name}" in catalog.registry(), 30, 0.001):
        raise SystemExit(f"the catalog never showed ch__{name}: {sessions.status()}")
    return time.perf_counter() - answered


def measure(label: str, entry: dict[str, Any], changes: int, pings: int) -> None:
    from sandfleet.worker.mcp.catalog import ToolCatalog
    from sandfleet.worker.tools.registry import ToolRegistry

    with sessions_for(entry, 0.0) as sessions:
        if not sessions.is_up("ch"):
            raise SystemExit(f"{label}: the server did not come up: {sessions.status()}")
        catalog = ToolCatalog(ToolRegistry(), sessions)
        seen = [change_to_seen(sessions, catalog, f"t{i}") for i in range(changes)]
        for _ in range(10):
            sessions.ping("ch")
        cpu, samples = time.process_time(), []
        for _ in range(pings):
            began = time.perf_counter()
            sessions.ping("ch")
            samples.append(time.perf_counter() - began)
        cpu_per_ping = (time.process_time() - cpu) / pings
        calls = []
        for _ in range(pings):
            began = time.perf_counter()
            sessions.call("ch", "steady", {}, 30)
            calls.append(time.perf_counter() - began)
        protocol = sessions.status()[0].detail.rsplit(" ", 1)[-1]
    with sessions_for(entry, 1.0) as limited:
        catalog = ToolCatalog(ToolRegistry(), limited)
        first = change_to_seen(limited, catalog, "first")
        second = change_to_seen(limited, catalog, "second")
    print(f"[{label}] protocol {protocol}")
    print(f"  list change -> new job sees the tool (no rate limit): {fmt(summary_ms(seen))}")
    print(
        f"  with the 1 s limit: first change {first * 1000:.1f} ms, "
        f"one right after it {second * 1000:.1f} ms (waits out the interval)"
    )
    print(f"  ping round trip:     {fmt(summary_ms(samples))}")
    print(f"  tools/call (trivial): {fmt(summary_ms(calls))}")
    print(f"  host CPU per ping: {cpu_per_ping * 1e6:.0f} us; at one ping per 10 s per server: "
          f"{cpu_per_ping / 10 * 100:.4f} % of a core")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--pings", type=int, default=200)
    args = parser.parse_args()
    from mcp_tools.helpers import HttpServer

    python = sys.executable
    measure("stdio", {"command": python, "args": [str(CHANGING)]}, args.changes, args.pings)
    measure(
        "stdio legacy", {"command": python, "args": [str(CHANGING), "--legacy"]}, args.changes, args.pings
    )
    server = HttpServer(CHANGING).start()
    try:
        measure("http", {"url": server.url}, args.changes, args.pings)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
