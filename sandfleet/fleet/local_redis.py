"""A throwaway ``redis-server`` on 127.0.0.1 in a folder of its own, for local fleets and tests.

``restart()`` keeps the port and the data folder, which is what the reliability tests need (kill
Redis, bring it back, see what its AOF kept). It runs in a session of its own, so a Ctrl-C meant for
a load test does not take Redis away before the workers have drained.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import IO

import redis

START_TIMEOUT_S = 10.0
NO_PERSISTENCE = ("--save", "", "--appendonly", "no")


def free_port(preferred: int | None = None) -> int:
    """A TCP port free on 127.0.0.1 right now: ``preferred`` if nothing listens there, else any.

    The one copy: the fleet, the demo, the benchmarks and the tests all take their ports from here.
    """
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise OSError("no free port on 127.0.0.1")


class RedisServer:
    """``redis-server --bind HOST --port P --dir DIR`` plus ``args`` (persistence off by default).

    ``host``, ``port`` and ``enter`` (a command prefix, e.g. :func:`sandfleet.fleet.netns.enter`) place
    it elsewhere: the multi-host fleet runs its Redis in its control namespace on fixed ports.
    """

    def __init__(
        self,
        directory: Path,
        args: tuple[str, ...] = NO_PERSISTENCE,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        enter: tuple[str, ...] = (),
    ) -> None:
        self.directory = directory
        self.args = args
        self.host = host
        self.port = port or free_port()
        self.enter = enter
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> RedisServer:
        self.directory.mkdir(parents=True, exist_ok=True)
        cmd = [*self.enter, "redis-server", "--bind", self.host, "--port", str(self.port)]
        cmd += ["--dir", str(self.directory)]
        self._log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [*cmd, *self.args], stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self._wait_ready()
        return self

    def stop(self, kill: bool = False) -> None:
        """Stop the server: SIGTERM (Redis writes its AOF/RDB and exits) or, with ``kill``, SIGKILL."""
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
        self.process = None

    def restart(self, kill: bool = False) -> RedisServer:
        self.stop(kill=kill)
        return self.start()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        client = redis.Redis(host=self.host, port=self.port, socket_connect_timeout=0.5)
        try:
            while True:
                assert self.process is not None
                if self.process.poll() is not None:
                    log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"redis-server exited with {self.process.returncode}:\n{log}")
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server on port {self.port} did not answer within {START_TIMEOUT_S:g} s"
                    )
                time.sleep(0.05)
        finally:
            client.close()
