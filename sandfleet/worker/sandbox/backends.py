"""Where sandboxes run: the small protocol the pool and the job runner need, and a registry by name.

    backend = backend_named("docker")   # engine.DockerBackend: runc or gVisor's runsc
    backend.preflight(config)           # before a job starts: can this sandbox be made here?
    sandbox = backend.start(config, owner=Owner.current(), labels={})   # agent booted, waiting

A backend makes a sandbox, connects its stdin/stdout and hands them to
``SandboxContainer.boot``; everything after that (commands, files, tool calls, deadlines) is the
agent's protocol and the same for every backend. The backend's ``SandboxHandle`` tells how a
sandbox ended and removes it. ``SandboxConfig.backend`` ("docker" or "gvisor") picks a Docker
runtime, not one of these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import SandboxError
from sandfleet.worker.sandbox.container import SandboxContainer
from sandfleet.worker.sandbox.docker.spec import Owner

DEFAULT_BACKEND = "docker"


class SandboxBackend(Protocol):
    """What the pool, the runtime and the job runner need from where sandboxes run."""

    name: str

    def preflight(self, config: SandboxConfig) -> None:
        """Check, before anything starts, that a sandbox of ``config`` can be made.

        Raises:
            SandboxUnavailableError: the backend does not answer (transient).
            SandboxError: it cannot make this sandbox (a clear reason, not transient).
        """

    def start(
        self,
        config: SandboxConfig,
        *,
        owner: Owner | None = None,
        labels: dict[str, str] | None = None,
        read_only_mounts: dict[str, str] | None = None,
    ) -> SandboxContainer:
        """A fresh sandbox of ``config`` whose agent is waiting, labelled with ``owner``
        (default: this process) and ``labels``, with ``read_only_mounts`` (host folder -> path
        inside; a shell session's wheelhouse). Raises as ``preflight``."""
        ...


def _docker(**options: Any) -> SandboxBackend:
    from sandfleet.worker.sandbox.docker.backend import DockerBackend  # the SDK only when it is used

    return DockerBackend(**options)


BACKENDS: dict[str, Callable[..., SandboxBackend]] = {"docker": _docker}


def backend_named(name: str = DEFAULT_BACKEND, **options: Any) -> SandboxBackend:
    """The backend registered as ``name``, made with ``options`` (Docker: ``client``, or ``thin=True``
    for a one-off command: no SDK for a local engine).

    Raises:
        SandboxError: no backend of that name.
    """
    factory = BACKENDS.get(name)
    if factory is None:
        raise SandboxError(f"unknown sandbox backend {name!r}; known backends: {', '.join(sorted(BACKENDS))}")
    return factory(**options)
