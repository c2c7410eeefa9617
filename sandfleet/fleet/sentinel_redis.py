"""A throwaway Redis without a single point of failure: primary + replica + three Sentinels on 127.0.0.1.

For tests and local fleets. The Sentinels are ``redis-server CONF --sentinel`` (Debian's
``redis-sentinel`` is the same binary); they agree (quorum 2) that the primary is down after
``DOWN_AFTER_MS`` and promote the replica. :attr:`url` is the fleet's ``sentinel://`` form
(sandfleet/core/redis_connect.py).
"""

from __future__ import annotations

import subprocess
import time
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


class SentinelProcess:
    """One ``redis-server sentinel.conf --sentinel`` watching ``primary_port``."""

    def __init__(self, directory: Path, primary_port: int) -> None:
        self.directory = directory
        self.port = free_port()
        self.primary_port = primary_port
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> SentinelProcess:
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = self.directory / "sentinel.conf"  # Sentinel rewrites its file: one per process
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.directory}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.primary_port} {QUORUM}\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )
        self._log = open(self.directory / "sentinel.log", "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            ["redis-server", str(conf), "--sentinel"],
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

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.primary = RedisServer(directory / "primary", NO_PERSISTENCE)
        self.replica = RedisServer(
            directory / "replica", (*NO_PERSISTENCE, "--replicaof", "127.0.0.1", str(self.primary.port))
        )
        self.sentinels = [
            SentinelProcess(directory / f"sentinel{i}", self.primary.port) for i in range(SENTINELS)
        ]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
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

    def primary_port(self) -> int | None:
        """The port the Sentinels name as primary now (None: none answers)."""
        for sentinel in self.sentinels:
            client = redis.Redis(port=sentinel.port, socket_connect_timeout=0.5, decode_responses=True)
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
        replica = redis.Redis(port=self.replica.port, decode_responses=True)
        try:
            if replica.info("replication").get("master_link_status") != "up":
                return False
            for sentinel in self.sentinels:
                client = redis.Redis(port=sentinel.port, socket_connect_timeout=0.5, decode_responses=True)
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
