"""The sandbox API for direct use: a manager for one SandboxConfig and the sessions it opens.

    with SandboxManager(SandboxConfig(memory_limit="512M")) as manager:
        session = manager.create_session()
        result = session.execute("python3 -c 'print(1)'", timeout=10)

A session is one fresh container; ``close()`` destroys it. The manager closes whatever is still
open when it exits, also after an exception.
"""

from __future__ import annotations

import shlex
import threading
import time
from typing import Any

from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import SandboxError
from sandfleet.worker.sandbox.backends import SandboxBackend, backend_named
from sandfleet.worker.sandbox.container import DEFAULT_OUTPUT_CAP, ExecResult, SandboxContainer


class SandboxSession:
    """One fresh container for a sequence of commands and file operations."""

    def __init__(self, container: SandboxContainer, max_output: int = DEFAULT_OUTPUT_CAP) -> None:
        self._container = container
        self._max_output = max_output
        self._expires = time.monotonic() + container.config.timeout

    @property
    def container_id(self) -> str:
        return self._container.id

    @property
    def config(self) -> SandboxConfig:
        return self._container.config

    @property
    def hello(self) -> dict[str, Any]:
        """What the sandbox's agent reported at its start (its Python, filter, network view)."""
        return self._container.hello

    def execute(
        self, cmd: str | list[str], timeout: float | None = None, *, stdin: bytes = b""
    ) -> ExecResult:
        """Run ``cmd`` (a shell-like string or an argv list) and wait for it.

        ``timeout`` defaults to what is left of the sandbox's own ``timeout``; at the deadline the
        command and every process it started are killed.
        """
        left = self._expires - time.monotonic()
        if left <= 0:
            raise SandboxError(f"the sandbox reached its timeout of {self.config.timeout:g} s")
        argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("empty command")
        return self._container.execute(
            argv, timeout=min(timeout or left, left), stdin=stdin, max_output=self._max_output
        )

    def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        self._container.write_file(path, data, mode)

    def read_file(self, path: str) -> bytes:
        return self._container.read_file(path)

    def list_files(self, path: str | None = None) -> list[str]:
        return self._container.list_files(path)

    def inspect(self) -> dict[str, Any]:
        return self._container.inspect()

    def close(self) -> None:
        if not self.config.persistent:
            self._container.destroy()
        else:
            self._container.channel.close()

    def __enter__(self) -> SandboxSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SandboxManager:
    """Opens sessions of one SandboxConfig and closes them all on exit."""

    def __init__(
        self,
        config: SandboxConfig | None = None,
        *,
        max_output: int = DEFAULT_OUTPUT_CAP,
        backend: SandboxBackend | None = None,
    ) -> None:
        self.config = config or SandboxConfig()
        self._backend = backend
        self._max_output = max_output
        self._sessions: list[SandboxSession] = []
        self._lock = threading.Lock()

    def create_session(self, labels: dict[str, str] | None = None) -> SandboxSession:
        if self._backend is None:  # made at first use: constructing a manager connects to nothing
            self._backend = backend_named()
        session = SandboxSession(self._backend.start(self.config, labels=labels), self._max_output)
        with self._lock:
            self._sessions.append(session)
        return session

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()

    def __enter__(self) -> SandboxManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
