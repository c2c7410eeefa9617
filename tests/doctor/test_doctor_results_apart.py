"""``sandfleet doctor`` reads the workers' MCP reports where the workers write them: with
``SANDFLEET_RESULTS_REDIS_URL`` apart from the broker, heartbeats and reports live on the records'
Redis (WorkerPresence), so reading the broker found no worker at all."""

from __future__ import annotations

from collections.abc import Callable

import redis

from sandfleet.core.redis_connect import connect
from sandfleet.core.redis_keys import FleetKeys
from sandfleet.core.settings import Settings
from sandfleet.fleet.local_redis import RedisServer
from sandfleet.worker.cli.doctor_mcp import fleet_mcp_checks
from sandfleet.worker.delivery.recovery import WorkerPresence
from sandfleet.worker.mcp.status import ServerStatus, to_report


def test_the_doctor_finds_a_workers_mcp_report_on_the_records_redis(
    redis_factory: Callable[..., RedisServer],
) -> None:
    broker, records = redis_factory(), redis_factory()
    settings = Settings(redis_url=broker.url, results_redis_url=records.url, key_prefix="doctor-apart")
    up = ServerStatus(name="time", where="stdio", up=True, detail="2 tools", fix="", tools=2, restarts=0)
    client: redis.Redis = connect(records.url, settings)
    presence = WorkerPresence(
        client,
        FleetKeys(settings.key_prefix),
        "w1@host",
        app=None,
        queue=settings.key_prefix,
        broker=connect(broker.url, settings),
        mcp_report=lambda: to_report([up]),
    )
    presence.beat()  # what a live worker writes with each heartbeat
    try:
        rows = {c.check: c for c in fleet_mcp_checks(settings)}
        assert set(rows) == {"MCP server time on w1@host"}, rows
        assert rows["MCP server time on w1@host"].ok
        assert "2 tools" in rows["MCP server time on w1@host"].detail
    finally:
        presence.stop()
        client.close()
