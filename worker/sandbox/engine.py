"""The Docker engine: the one place that imports the Docker SDK and translates its errors.

Everything else asks this module for a client and receives Sandfleet errors that say what to do.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from producer.errors import SandboxError, SandboxUnavailableError

try:  # the producer-only install has no docker SDK; fail closed with the install hint
    import docker
    import docker.errors
except ModuleNotFoundError:  # pragma: no cover - exercised by a test in a venv without docker
    docker = None  # type: ignore[assignment]

DOCKER_MISSING = (
    "The 'docker' package is required for the sandbox. Install it with: pip install 'sandfleet[worker]'"
)
# Container labels: every Sandfleet container carries LABEL_ROLE, and its owner (a process) so a
# reaper can tell leftovers of dead processes from containers of live ones.
LABEL_ROLE = "sandfleet.role"
LABEL_OWNER = "sandfleet.owner"
LABEL_CONFIG = "sandfleet.config"
LABEL_JOB = "sandfleet.job"
LABEL_PERSISTENT = "sandfleet.persistent"
API_POOL_CONNECTIONS = 64

_client_lock = threading.Lock()
_clients: dict[str, Any] = {}


def unavailable(cause: object) -> SandboxUnavailableError:
    return SandboxUnavailableError(
        f"Sandbox backend 'docker' is not available: {cause}. Make sure Docker is installed and running."
    )


def require_sdk() -> None:
    if docker is None:
        raise SandboxError(DOCKER_MISSING)


def docker_client(base_url: str | None = None) -> Any:
    """A shared, pinged ``docker.DockerClient`` (from DOCKER_HOST unless base_url is given).

    Raises:
        SandboxError: the SDK is not installed.
        SandboxUnavailableError: no engine answers.
    """
    require_sdk()
    key = base_url or ""
    with _client_lock:
        client = _clients.get(key)
        if client is None:
            try:
                if base_url:
                    client = docker.DockerClient(base_url=base_url, max_pool_size=API_POOL_CONNECTIONS)
                else:
                    client = docker.from_env(max_pool_size=API_POOL_CONNECTIONS)
                client.ping()
            except docker.errors.DockerException as e:
                raise unavailable(_cause(e)) from e
            except Exception as e:  # requests/urllib3 connection errors surface raw on some paths
                raise unavailable(e) from e
            _clients[key] = client
        return client


def forget_client(base_url: str | None = None) -> None:
    """Drop a cached client (after the engine went away), so the next call reconnects."""
    with _client_lock:
        _clients.pop(base_url or "", None)


def _cause(e: Exception) -> str:
    text = str(e)
    for marker in ("Error while fetching server API version: ", "Connection aborted."):
        text = text.replace(marker, "")
    return text.strip(" ()'") or type(e).__name__


@dataclass(frozen=True)
class EngineInfo:
    """What the engine can do, as the doctor and the sandbox need it."""

    server_version: str
    api_version: str
    runtimes: tuple[str, ...]
    ncpu: int
    mem_total: int
    cgroup_version: str
    images: frozenset[str] = field(default_factory=frozenset)


def engine_info(client: Any | None = None) -> EngineInfo:
    """Version, runtimes, CPUs and local image tags of the engine."""
    client = client or docker_client()
    try:
        info = client.info()
        version = client.version()
        tags = frozenset(tag for image in client.images.list() for tag in image.tags)
    except docker.errors.DockerException as e:
        raise unavailable(_cause(e)) from e
    return EngineInfo(
        server_version=version.get("Version", "?"),
        api_version=version.get("ApiVersion", "?"),
        runtimes=tuple(sorted(info.get("Runtimes", {}))),
        ncpu=int(info.get("NCPU", 1)),
        mem_total=int(info.get("MemTotal", 0)),
        cgroup_version=str(info.get("CgroupVersion", "1")),
        images=tags,
    )


if docker is not None:
    DockerError: type[Exception] = docker.errors.DockerException
    NotFoundError: type[Exception] = docker.errors.NotFound
    ImageNotFoundError: type[Exception] = docker.errors.ImageNotFound
else:  # pragma: no cover
    DockerError = NotFoundError = ImageNotFoundError = OSError


def raw_socket(attached: Any) -> Any:
    """The real socket under what ``attach_socket`` returns (a SocketIO over unix, a socket over TCP)."""
    return getattr(attached, "_sock", attached)
