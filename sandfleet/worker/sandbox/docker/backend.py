"""The Docker backend: the one module that imports the Docker SDK and translates its errors.

Everything Sandfleet asks of a Docker engine goes through here: a shared client, the preflight
check before a sandbox starts (runtime registered, image present, network mode possible), a
sandbox's life on the engine (create, attach, start, how it ended, remove: DockerBackend and
DockerSandbox) and the engine's facts for the doctor. Everything else receives Sandfleet errors
that say what to do. The modules this backend owns use no SDK themselves: attach.py (the attach
stream), engine_api.py (a thin client for one-off commands), sandfleet/worker/egress/ (network
"restricted"), reaper.py (leftovers), spec.py (what a container is asked for).

The SDK is imported at first use (``sdk()``), not with this module: a one-off command on a local
engine (``sandfleet sandbox run``, ``sandfleet run``) talks to it through engine_api.py and never
pays for the SDK with requests and urllib3 (~60 ms, issue 25). The error tuples below hold the thin
client's errors from the start and the SDK's once it is loaded.
"""

from __future__ import annotations

import importlib
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from sandfleet.core.config import SandboxConfig
from sandfleet.core.errors import SandboxError, SandboxUnavailableError
from sandfleet.worker.sandbox.channel import AgentChannel, ChannelError
from sandfleet.worker.sandbox.container import SandboxContainer, SandboxEnd
from sandfleet.worker.sandbox.docker import engine_api
from sandfleet.worker.sandbox.docker.attach import AttachStream
from sandfleet.worker.sandbox.docker.labels import LABEL_CONFIG as LABEL_CONFIG
from sandfleet.worker.sandbox.docker.labels import LABEL_JOB as LABEL_JOB
from sandfleet.worker.sandbox.docker.labels import LABEL_OWNER as LABEL_OWNER
from sandfleet.worker.sandbox.docker.labels import LABEL_PERSISTENT as LABEL_PERSISTENT
from sandfleet.worker.sandbox.docker.labels import LABEL_ROLE as LABEL_ROLE
from sandfleet.worker.sandbox.docker.spec import Owner, container_kwargs, create_body

if TYPE_CHECKING:
    from sandfleet.worker.egress.gateway import EgressLease

_client_lock = threading.RLock()
docker: Any = None  # the SDK module once ``sdk()`` loaded it (None: not loaded, or not installed)
_sdk_tried = False
# Errors of either client, by what they mean. ``sdk()`` adds the SDK's own.
TransportError: tuple[type[Exception], ...] = (engine_api.EngineConnectionError,)  # no engine answers
DockerError: tuple[type[Exception], ...] = (engine_api.EngineCallError, *TransportError)
NotFoundError: tuple[type[Exception], ...] = (engine_api.EngineNotFoundError,)
ImageNotFoundError: tuple[type[Exception], ...] = (engine_api.EngineImageNotFoundError,)


def sdk() -> Any:
    """The Docker SDK module, imported on first use (None when it is not installed: the producer-only
    install), its errors added to the tuples above."""
    global docker, _sdk_tried, TransportError, DockerError, NotFoundError, ImageNotFoundError
    with _client_lock:
        if _sdk_tried:
            return docker
        try:
            loaded = importlib.import_module("docker")
            errors = importlib.import_module("docker.errors")
            transport = importlib.import_module("requests.exceptions")
        except ModuleNotFoundError:  # fail closed with the install hint (require_sdk)
            _sdk_tried = True
            return None
        # The SDK lets its transport's errors through untranslated: an engine that stops (or hangs)
        # mid-call raises requests' ConnectionError or Timeout, not a DockerException. Both mean "no engine".
        TransportError = (*TransportError, transport.ConnectionError, transport.Timeout)
        DockerError = (*DockerError, errors.DockerException, *TransportError)
        NotFoundError = (*NotFoundError, errors.NotFound)
        ImageNotFoundError = (*ImageNotFoundError, errors.ImageNotFound)
        docker, _sdk_tried = loaded, True
        return docker


DOCKER_MISSING = (
    "The 'docker' package is required for the sandbox. Install it with: pip install 'sandfleet[worker]'"
)
API_POOL_CONNECTIONS = 64
PING_FRESH_S = 1.0  # a successful ping vouches for the engine this long (jobs preflight twice each)
EXIT_RECORDED_S = 1.0  # the engine records a container's exit this long after its stream closes
LATE_OOM_S = 0.25  # an OOM event may reach the engine after the exit it caused
SIGKILL_EXIT = 128 + 9

log = logging.getLogger("sandfleet.sandbox")
_clients: dict[str, Any] = {}


def unavailable(cause: object) -> SandboxUnavailableError:
    """The error for "no engine answers"; ``cause`` is a text or the exception that said so."""
    if isinstance(cause, BaseException):
        cause = _cause(cause)
    return SandboxUnavailableError(
        f"Sandbox backend 'docker' is not available: {cause}. Make sure Docker is installed and running."
    )


def _errors_of(client: Any) -> None:
    """Make sure the error tuples hold the errors ``client`` raises (an SDK client made elsewhere)."""
    if not isinstance(client, engine_api.EngineClient):
        sdk()


def require_sdk() -> None:
    if sdk() is None:
        raise SandboxError(DOCKER_MISSING)


def create_container(client: Any, kwargs: dict[str, Any]) -> str:
    """Create a container from ``containers.create`` keyword arguments and return its id.

    Either client posts the body spec.create_body makes (the SDK's own translation, proven equal by
    tests/sandbox/test_create_body.py), so both create the same container. The SDK's
    ``containers.create`` also inspected the container it just made to build a model object; a
    sandbox needs only the id, and that inspect was one engine call in five per job.
    """
    return str(client.api.create_container_from_config(create_body(kwargs))["Id"])


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
        keep_connections(client.api)
        client.ping()
        return client
    except Exception as e:  # DockerException, or requests/urllib3 errors that surface raw
        if client is not None:
            client.close()
        raise unavailable(_cause(e)) from e


def hijacked(url: str) -> bool:
    """Whether a call to ``url`` takes its connection's socket over (attach, exec): that connection
    must never go back to a pool another call borrows from."""
    path = url.split("?", 1)[0]
    return path.endswith("/attach") or "/exec/" in path


def keep_connections(api: Any) -> None:
    """Make a Docker SDK client over the engine's unix socket reuse its connections, and stop it
    reading the environment for proxies on every call (a unix socket has none).

    The SDK keeps one connection pool per request URL (its ``UnixHTTPAdapter``), so every call that
    names a container (create, start, remove, inspect: four a sandbox) opened a new connection to
    the engine, and requests scanned ``os.environ`` for proxies on each (~1 ms of the worker's CPU
    a sandbox in all). Here every plain call shares one keep-alive pool; calls that take the socket
    over (:func:`hijacked`) get a pool of their own, of one connection, that no other call can reach,
    so their connection is never lent to another call. A client over TCP or SSH is left as it is.
    """
    from docker.transport.unixconn import UnixHTTPAdapter

    adapter = getattr(api, "_custom_adapter", None)
    if not isinstance(adapter, UnixHTTPAdapter) or shares_connections(adapter):
        return
    shared = shared_adapter_class()(
        "http+unix://" + adapter.socket_path,
        adapter.timeout,
        max_pool_size=adapter.max_pool_size,
    )
    api.mount("http+docker://", shared)
    api._custom_adapter = shared
    api.trust_env = False
    adapter.close()


def plain_call(client: Any, method: str, path: str, done: tuple[int, ...]) -> bool:
    """Make a bodiless engine call (``path`` after the API version) straight on the shared keep-alive
    pool: requests' session layer is more than half of a call's CPU. True when the engine answered
    with a status in ``done``; False otherwise (no shared pool, the call failed on the way, another
    status), and the caller then makes the same call through the SDK, which raises its own errors.
    Only for calls that are safe to repeat (start: 304 the second time; a forced remove: 404)."""
    api = client.api
    adapter: Any = getattr(api, "_custom_adapter", None)
    if not shares_connections(adapter):
        return False
    import urllib3  # loaded with the SDK, which made the adapter

    try:
        timeout = urllib3.Timeout(connect=api.timeout, read=api.timeout)  # the SDK's, as it sends them
        reply = adapter.get_connection("").urlopen(
            method, f"/v{api._version}{path}", retries=False, timeout=timeout
        )
    except Exception:  # the SDK's call says what went wrong, in its own errors
        return False
    return reply.status in done


ATTACH_PARAMS = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
ATTACH_HEAD_BYTES = 4096  # the engine's answer to an attach is a status line and four headers


def attach_unix(client: Any, container_id: str) -> socket.socket | None:
    """The attach socket of a container not yet started, asked for on a connection of its own to the
    engine's unix socket, as the SDK's ``attach_socket`` asks (the same request, ``detachKeys`` of the
    Docker config included) without requests and urllib3 (~0.5 ms of CPU a sandbox). None when the
    client is not on a unix socket or the engine did not switch the connection to the stream: the
    caller then attaches through the SDK, which raises its own errors. Nothing can arrive on the
    stream before the container starts, so the answer's head is all there is to read."""
    api = client.api
    adapter: Any = getattr(api, "_custom_adapter", None)
    if not shares_connections(adapter):
        return None
    params: dict[str, Any] = dict(ATTACH_PARAMS)
    if "detachKeys" in api._general_configs:
        params["detachKeys"] = api._general_configs["detachKeys"]
    request = (
        f"POST /v{api._version}/containers/{quote(container_id)}/attach?{urlencode(params)} HTTP/1.1\r\n"
        "Host: docker\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n"
    )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(api.timeout)
        sock.connect(adapter.socket_path)
        sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head and len(head) < ATTACH_HEAD_BYTES:
            got = sock.recv(ATTACH_HEAD_BYTES - len(head))
            if not got:
                break
            head += got
        status = head.split(b" ", 2)[1] if head.startswith(b"HTTP/1.") else b""
        if status not in (b"101", b"200") or not head.endswith(b"\r\n\r\n"):
            sock.close()
            return None
        sock.settimeout(None)
        return sock
    except (OSError, IndexError):
        sock.close()
        return None


_shared_adapter: Any = None  # the SharedUnixAdapter class, made once the SDK is loaded


def shared_adapter_class() -> Any:
    """The SDK's unix-socket adapter with one pool for every call that does not take its socket
    over (see :func:`keep_connections`); made on first use, as the SDK is imported (``sdk()``)."""
    global _shared_adapter
    with _client_lock:
        if _shared_adapter is not None:
            return _shared_adapter
        from docker.transport.unixconn import UnixHTTPAdapter, UnixHTTPConnectionPool

        class SharedUnixAdapter(UnixHTTPAdapter):
            shares_connections = True

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self.shared: Any = None

            def get_connection(self, url: str, proxies: Any = None) -> Any:
                if hijacked(url):  # a pool of one connection, for this call alone (its response holds it)
                    return UnixHTTPConnectionPool(url, self.socket_path, self.timeout, maxsize=1)
                with self.pools.lock:
                    if self.shared is None:
                        self.shared = UnixHTTPConnectionPool(
                            "http+docker://localhost",
                            self.socket_path,
                            self.timeout,
                            maxsize=self.max_pool_size,
                        )
                    return self.shared

            def close(self) -> None:
                super().close()
                if self.shared is not None:
                    self.shared.close()

        _shared_adapter = SharedUnixAdapter
        return _shared_adapter


def shares_connections(adapter: Any) -> bool:
    """Whether ``adapter`` is a SharedUnixAdapter (made by :func:`keep_connections`)."""
    return bool(getattr(adapter, "shares_connections", False))


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
    _errors_of(client)
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


def translate(e: Exception, doing: str) -> Exception:
    """The Sandfleet error for an SDK error raised while ``doing`` something (a verb phrase)."""
    text = str(e)
    if isinstance(e, TransportError):
        return unavailable(e)
    if "Connection" in text or ("connect" in text.lower() and "refused" in text.lower()):
        return unavailable(text)
    explanation = getattr(e, "explanation", None) or text
    server_error = getattr(e, "is_server_error", None)
    if doing in ("create the sandbox", "start the sandbox") and server_error and server_error():
        # preflight vouched for the runtime and the image: an engine-side failure now (a daemon
        # stopping mid-create: "error creating overlay mount ...") is worth retrying later
        return unavailable(f"cannot {doing}: {explanation}")
    return SandboxError(f"cannot {doing}: {explanation}")


def image_missing(image: str) -> SandboxError:
    return SandboxError(
        f"sandbox image {image!r} is not on this engine; build it with `sandfleet images build`"
    )


# -- preflight ------------------------------------------------------------------------------------

_facts: dict[int, dict[str, Any]] = {}


def preflight(config: SandboxConfig, client: Any | None = None) -> dict[str, Any]:
    """Check, before anything starts, that the engine can make this sandbox; returns the engine facts.

    Raises:
        SandboxUnavailableError: no engine.
        SandboxError: the runtime is not registered, the image is missing, or the network mode
            cannot be enforced under the runtime.
    """
    client = client or docker_client()
    _errors_of(client)
    info = _engine_facts(client)
    if time.monotonic() - info["pinged"] > PING_FRESH_S:  # the facts are cached: is the engine there now?
        try:
            client.ping()
        except DockerError as e:
            raise unavailable(e) from e
        info["pinged"] = time.monotonic()
    if config.docker_runtime not in info["runtimes"]:
        raise SandboxError(
            f"Docker runtime {config.docker_runtime!r} is not registered with the engine; registered "
            f"runtimes: {', '.join(sorted(info['runtimes']))}. Run deploy/bootstrap.sh to register gVisor."
        )
    if config.network == "restricted" and config.is_gvisor and config.docker_runtime != "runsc-egress":
        raise SandboxError(
            f"network 'restricted' under gVisor needs the runtime 'runsc-egress' (runsc --network=host, "
            f"whose sockets the sandbox's filter holds), not {config.docker_runtime!r}"
        )
    if config.image not in info["images"]:
        try:
            client.images.get(config.image)
        except ImageNotFoundError as e:
            raise image_missing(config.image) from e
        except DockerError as e:
            raise translate(e, "look up the sandbox image") from e
        info["images"].add(config.image)
    return info


def _engine_facts(client: Any) -> dict[str, Any]:
    """Runtimes and CPU count of an engine, asked once per client."""
    facts = _facts.get(id(client))
    if facts is None:
        try:
            info = client.info()
        except DockerError as e:
            raise translate(e, "reach the engine") from e
        facts = {
            "runtimes": set(info.get("Runtimes", {})),
            "ncpu": int(info.get("NCPU", 1)),
            "images": set(),
            "pinged": time.monotonic(),  # it just answered
        }
        _facts[id(client)] = facts
    return facts


def _engine_answers(client: Any) -> bool:
    try:
        client.ping()
    except DockerError:
        return False
    return True


# -- one sandbox's life on the engine ---------------------------------------------------------------


class DockerBackend:
    """Sandboxes as Docker containers, under runc or gVisor's runsc (backend.SandboxBackend).

    ``client`` is a ``docker.DockerClient``; by default the shared one for DOCKER_HOST, asked for at
    each start (so that one made anew after the engine went away is used). With ``thin`` (one-off
    commands) and no ``client``, an engine on a unix socket is spoken to through engine_api.py
    instead, without the SDK (``thin`` may be that client, made by the caller); any other engine,
    and network "restricted" (its egress gateway drives the SDK), still get the SDK's client.
    Constructing connects to nothing.
    """

    name = "docker"

    def __init__(self, client: Any | None = None, *, thin: bool | engine_api.EngineClient = False) -> None:
        if client is not None:
            _errors_of(client)  # its errors are caught here: the tuples must hold them
        self._client = client
        self._thin = None
        if client is None and thin:
            self._thin = thin if isinstance(thin, engine_api.EngineClient) else engine_api.from_env()

    @property
    def client(self) -> Any:
        return self._client or docker_client()

    def client_for(self, config: SandboxConfig) -> Any:
        """The client that makes a sandbox of ``config``: the thin one where it can."""
        if self._thin is not None and config.network != "restricted":
            return self._thin
        return self.client

    def preflight(self, config: SandboxConfig) -> None:
        preflight(config, self.client_for(config))

    def start(
        self,
        config: SandboxConfig,
        *,
        owner: Owner | None = None,
        labels: dict[str, str] | None = None,
        read_only_mounts: dict[str, str] | None = None,
    ) -> SandboxContainer:
        """Create, attach and start a container, send it the agent and wait for its hello.

        ``read_only_mounts`` (host folder -> path inside) are bind-mounted read-only (spec.py).

        Raises:
            SandboxUnavailableError: no engine, or it went away while the sandbox started.
            SandboxError: the container cannot be made as configured (runtime, image, filter), or
                its agent sees more network than the config allows (isolation.network_refusal).
        """
        began = time.monotonic()
        client = self.client_for(config)
        info = preflight(config, client)
        if config.network == "restricted":
            from sandfleet.worker.egress.gateway import egress_gateway  # settings: only when needed

            try:
                egress_gateway().prepare(client)  # network, host rules, proxy: or EgressError
            except DockerError as e:
                raise translate(e, "prepare the egress network") from e
        kwargs = container_kwargs(
            config,
            owner=owner or Owner.current(),
            host_ncpu=info["ncpu"],
            labels=labels,
            read_only_mounts=read_only_mounts,
        )
        try:
            container_id = create_container(client, kwargs)
        except ImageNotFoundError as e:
            raise image_missing(config.image) from e
        except DockerError as e:
            raise translate(e, "create the sandbox") from e
        sandbox = DockerSandbox(client, container_id, config.docker_runtime)
        channel = None
        try:
            sock = attach_unix(client, container_id)
            if sock is None:
                sock = raw_socket(client.api.attach_socket(container_id, params=ATTACH_PARAMS))
            channel = AgentChannel(AttachStream(sock))
            if not plain_call(client, "POST", f"/containers/{container_id}/start", (204, 304)):
                client.api.start(container_id)
            if config.network == "restricted":
                sandbox.egress = egress_gateway().attach(client, container_id, config)
            return SandboxContainer.boot(config, sandbox, channel, began)
        except BaseException as e:
            if channel:
                channel.close()
            killed = isinstance(e, ChannelError) and sandbox.killed_before_start()
            sandbox.remove()
            if isinstance(e, ChannelError):
                if killed or not _engine_answers(client):  # the engine stopped and took the sandbox with it
                    raise unavailable(f"the engine went away while the sandbox started ({e})") from e
                raise SandboxError(f"the sandbox did not start: {e}") from e
            if isinstance(e, DockerError):
                raise translate(e, "start the sandbox") from e
            raise


class DockerSandbox:
    """One container as the Docker backend holds it (container.SandboxHandle)."""

    def __init__(self, client: Any, container_id: str, runtime: str) -> None:
        self._client = client
        self.id = container_id
        self.runtime = runtime
        self._created_wall = time.time()
        self.egress: EgressLease | None = None  # network "restricted": its registration with the proxy

    def ended(self) -> SandboxEnd:
        """How the container ended, once the engine has recorded its exit (waits up to ~1 s).

        OOMKilled is the engine's word for the kernel's OOM killer (under gVisor the whole sandbox
        goes at once); a kill through the engine (``docker kill``, removal, the engine stopping) is
        in its event log, so a SIGKILL with neither came from inside the container.

        Raises:
            SandboxUnavailableError: the engine does not answer: it stopped, and took the container
                with it. That is infrastructure, not the program's failure: the job is retried.
        """
        state = self._exit_state()
        if state is None:
            return SandboxEnd(gone=True)
        if state.get("Running"):
            return SandboxEnd()  # the stream closed but the container lives on: nothing to tell
        code = int(state.get("ExitCode", -1))
        if state.get("OOMKilled"):
            return SandboxEnd(exit_code=code, oom_killed=True)
        if code != SIGKILL_EXIT:
            return SandboxEnd(exit_code=code)
        time.sleep(LATE_OOM_S)
        events = self._events("kill", "oom")
        return SandboxEnd(exit_code=code, oom_killed="oom" in events, killed_from_outside="kill" in events)

    def killed_before_start(self) -> bool:
        """Whether a container that died before its agent spoke was killed by its engine (stopping:
        SIGTERM/SIGKILL, or already gone) rather than failing by itself (no python3, out of memory)."""
        try:
            state = self._exit_state()
        except SandboxUnavailableError:
            return True  # the engine itself is going
        if state is None:
            return True
        if state.get("Running"):
            return False
        return not state.get("OOMKilled") and state.get("ExitCode") in (137, 143)

    def _exit_state(self) -> dict[str, Any] | None:
        """Docker's State of the container once it has stopped (or still running after
        EXIT_RECORDED_S); None when the engine no longer knows it."""
        deadline = time.monotonic() + EXIT_RECORDED_S
        while True:
            try:
                state: dict[str, Any] = self._client.api.inspect_container(self.id)["State"]
            except TransportError as e:
                raise unavailable(e) from e
            except DockerError:
                return None
            if not state.get("Running") or time.monotonic() >= deadline:
                return state
            time.sleep(0.05)

    def _events(self, *actions: str) -> set[str]:
        """Which of ``actions`` the engine's event log shows for this container since it was made."""
        try:
            stream = self._client.api.events(
                since=f"{self._created_wall - 1:.9f}",
                until=f"{time.time():.9f}",
                filters={"container": self.id, "event": list(actions)},
                decode=True,
            )
            return {event.get("Action", "") for event in stream} & set(actions)
        except DockerError as e:
            raise unavailable(e) from e

    def remove(self) -> None:
        """Kill and remove the container. Never raises: the reaper finds what is left."""
        if self.egress is not None:
            self.egress.unregister()  # before its address can go to another sandbox
        try:
            if not plain_call(self._client, "DELETE", f"/containers/{self.id}?force=1", (204, 404)):
                self._client.api.remove_container(self.id, force=True)
        except NotFoundError:
            pass
        except Exception as e:
            log.warning("could not remove sandbox container %s: %s", self.id[:12], e)
        if self.egress is not None:
            self.egress.release()  # after: nothing of it runs, its refusals are all counted

    def inspect(self) -> dict[str, Any]:
        """Docker's own view of the container (``docker inspect``)."""
        try:
            result: dict[str, Any] = self._client.api.inspect_container(self.id)
        except DockerError as e:
            raise translate(e, "inspect the sandbox") from e
        return result
