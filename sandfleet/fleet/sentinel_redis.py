"""A throwaway Redis without a single point of failure: primary + replica + three Sentinels on 127.0.0.1
(or on the multi-host fleet's control address, inside its namespace: :class:`SentinelPlacement`).

For tests, local fleets and the multi-host fleet. The Sentinels are ``redis-server CONF --sentinel`` (Debian's
``redis-sentinel`` is the same binary); they agree (quorum 2) that the primary is down after
``DOWN_AFTER_MS`` and promote the replica. :attr:`url` is the fleet's ``sentinel://`` form
(sandfleet/core/redis_connect.py).
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import redis

from sandfleet.fleet.local_redis import NO_PERSISTENCE, RedisServer, free_port

MASTER_NAME = "sandfleet"
SENTINELS = 3
QUORUM = 2
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 5000
READY_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class SentinelPlacement:
    """Where the five processes listen and how they are started: ``host`` (every one binds it),
    ``ports`` (primary, replica, then the Sentinels; empty: free loopback ports), ``enter`` (a command
    prefix: the multi-host fleet's control namespace)."""

    host: str = "127.0.0.1"
    ports: tuple[int, ...] = ()
    enter: tuple[str, ...] = ()

    def port(self, index: int) -> int:
        return self.ports[index] if self.ports else free_port()


class SentinelProcess:
    """One ``redis-server sentinel.conf --sentinel`` watching the primary at ``primary_port``."""

    def __init__(
        self, directory: Path, primary_port: int, placement: SentinelPlacement, port: int | None = None
    ) -> None:
        self.directory = directory
        self.placement = placement
        self.port = port or free_port()
        self.primary_port = primary_port
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> SentinelProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "sentinel.conf"  # Sentinel rewrites its file: one per process
        conf.write_text(
            f"port {self.port}\nbind {self.placement.host}\nprotected-mode no\ndir {self.directory}\n"
            f"sentinel monitor {MASTER_NAME} {self.placement.host} {self.primary_port} {QUORUM}\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )
        self._log = open(self.directory / "sentinel.log", "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [*self.placement.enter, "redis-server", str(conf), "--sentinel"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None


class SentinelRedis:
    """Primary, replica (``--replicaof``) and three Sentinels, each in a folder under ``directory``."""

    def __init__(self, directory: Path, placement: SentinelPlacement | None = None) -> None:
        self.directory = directory
        self.placement = place = placement or SentinelPlacement()
        host, enter = place.host, place.enter
        # Bound to one address only; protected mode would refuse every client not on loopback.
        args = (*NO_PERSISTENCE, "--protected-mode", "no")
        self.primary = RedisServer(directory / "primary", args, host=host, port=place.port(0), enter=enter)
        replica_of = ("--replicaof", host, str(self.primary.port))
        self.replica = RedisServer(
            directory / "replica", (*args, *replica_of), host=host, port=place.port(1), enter=enter
        )
        self.sentinels = [
            SentinelProcess(directory / f"sentinel{i}", self.primary.port, place, place.port(2 + i))
            for i in range(SENTINELS)
        ]

    @property
    def url(self) -> str:
        hosts = ",".join(f"{self.placement.host}:{s.port}" for s in self.sentinels)
        return f"sentinel://{hosts}/0?master={MASTER_NAME}"

    def start(self) -> SentinelRedis:
        try:
            self.primary.start()
            self.replica.start()
            for sentinel in self.sentinels:
                sentinel.start()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        self.replica.stop(kill=True)
        self.primary.stop(kill=True)

    def _client(self, port: int) -> redis.Redis:
        return redis.Redis(
            host=self.placement.host, port=port, socket_connect_timeout=0.5, decode_responses=True
        )

    def primary_port(self) -> int | None:
        """The port the Sentinels name as primary now (None: none answers)."""
        for sentinel in self.sentinels:
            client = self._client(sentinel.port)
            try:
                addr = client.execute_command("SENTINEL", "get-master-addr-by-name", MASTER_NAME)
                if addr:
                    return int(addr[1])
            except redis.RedisError:
                continue
            finally:
                client.close()
        return None

    def _wait_ready(self) -> None:
        """Until the replica is in sync and every Sentinel sees the replica and the other Sentinels
        (a failover needs both)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Sentinels under {self.directory} not ready in {READY_TIMEOUT_S:g} s")
            time.sleep(0.1)

    def _ready(self) -> bool:
        replica = self._client(self.replica.port)
        try:
            if replica.info("replication").get("master_link_status") != "up":
                return False
            for sentinel in self.sentinels:
                client = self._client(sentinel.port)
                try:
                    masters: Any = client.sentinel_masters()
                    [info] = [m for m in masters.values() if m.get("name") == MASTER_NAME]
                    if info["num-slaves"] < 1 or info["num-other-sentinels"] < SENTINELS - 1:
                        return False
                finally:
                    client.close()
            return True
        except (redis.RedisError, ValueError, KeyError):
            return False
        finally:
            replica.close()
