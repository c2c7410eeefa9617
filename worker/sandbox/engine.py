"""The Docker engine: the one place that imports the Docker SDK and translates its errors.

Everything else asks this module for a client and receives Sandfleet errors that say what to do.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from sandfleet.core.errors import SandboxError, SandboxUnavailableError

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
    """The error for "no engine answers"; ``cause`` is a text or the exception that said so."""
    if isinstance(cause, BaseException):
        cause = _cause(cause)
    return SandboxUnavailableError(
        f"Sandbox backend 'docker' is not available: {cause}. Make sure Docker is installed and running."
    )


def require_sdk() -> None:
    if docker is None:
        raise SandboxError(DOCKER_MISSING)


def create_container(client: Any, kwargs: dict[str, Any]) -> str:
    """Create a container from ``containers.create`` keyword arguments and return its id.

    The SDK's ``containers.create`` inspects the container it just made to build a model object; a
    sandbox needs only the id, and that inspect was one engine call in five per job.
    """
    from docker.models.containers import _create_container_args

    args = {**kwargs, "version": client.api._version}
    return str(client.api.create_container(**_create_container_args(args))["Id"])


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
            client = _connect(base_url)
            _clients[key] = client
        return client


def _connect(base_url: str | None) -> Any:
    client = None
    try:
        if base_url:
            client = docker.DockerClient(base_url=base_url, max_pool_size=API_POOL_CONNECTIONS)
        else:
            client = docker.from_env(max_pool_size=API_POOL_CONNECTIONS)
        client.ping()
        return client
    except Exception as e:  # DockerException, or requests/urllib3 errors that surface raw
        if client is not None:
            client.close()
        raise unavailable(_cause(e)) from e


def forget_client(base_url: str | None = None) -> None:
    """Drop a cached client (after the engine went away), so the next call reconnects."""
    with _client_lock:
        _clients.pop(base_url or "", None)


def _cause(e: BaseException) -> str:
    """The useful part of a Docker SDK connection error: the OS error underneath, if there is one."""
    seen: set[int] = set()
    stack: list[object] = [e]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, OSError) and item.strerror:
            return f"cannot connect to the engine ({item.strerror})"
        if isinstance(item, BaseException):
            stack.extend(x for x in (item.__cause__, item.__context__, *item.args) if x is not None)
        elif isinstance(item, tuple):
            stack.extend(item)
    return str(e).replace("Error while fetching server API version: ", "").strip() or type(e).__name__


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
    except DockerError as e:
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
    import requests.exceptions

    # The SDK lets its transport's errors through untranslated: an engine that stops (or hangs) mid-call
    # raises requests' ConnectionError or Timeout, not a DockerException. Both mean "no engine".
    TransportError: tuple[type[Exception], ...] = (
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
    )
    DockerError: tuple[type[Exception], ...] = (docker.errors.DockerException, *TransportError)
    NotFoundError: type[Exception] = docker.errors.NotFound
    ImageNotFoundError: type[Exception] = docker.errors.ImageNotFound
else:  # pragma: no cover
    TransportError = DockerError = (OSError,)
    NotFoundError = ImageNotFoundError = OSError


def raw_socket(attached: Any) -> Any:
    """The real socket under what ``attach_socket`` returns (a SocketIO over unix, a socket over TCP).

    The SocketIO is closed here: while it is open it holds a reference that keeps ``close()`` of the
    socket from closing the file descriptor, which then leaks until garbage collection.
    """
    sock = getattr(attached, "_sock", None)
    if sock is None:
        return attached
    attached.close()  # drops the SocketIO's reference; the socket itself stays open
    return sock
