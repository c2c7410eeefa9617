"""A thin Docker Engine API client over the engine's unix socket, for commands that run one sandbox.

Importing the Docker SDK with requests and urllib3, and making its client (which asks the engine
for its API version first), cost ``sandfleet sandbox run`` ~60-70 ms of a ~370 ms command (issue
25); this module speaks the few calls a sandbox's life needs with the standard library's sockets:
one connection per request, ``Connection: close``, JSON in and out, and the attach stream hijacked
as Docker's CLI does. It answers to the subset of ``docker.DockerClient`` that backend.py uses
(``ping``, ``info``, ``images.get``, and under ``api``: create from a finished body, attach, start,
inspect, events, remove), so the backend has one code path for both clients, and the body it
creates comes from one builder (spec.create_body) either way.

Only unix sockets are spoken here (``DOCKER_HOST=unix://...`` or the default socket): an engine
over TCP, TLS or SSH is the SDK's (``socket_path`` says None and the backend uses the SDK). The
engine is the host's own daemon, trusted as the SDK trusts it; paths are unversioned, which the
engine serves at its own API version, as the SDK's version negotiation would pick.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

DEFAULT_SOCKET = "/var/run/docker.sock"
CALL_TIMEOUT_S = 60.0  # the SDK's default timeout for one call
HEAD_LIMIT_BYTES = 64 * 1024
IMAGE_MISSING_WORDS = ("no such image", "repository does not exist", "no pull access")


class EngineCallError(Exception):
    """The engine answered a call with an error status; ``explanation`` is its own message."""

    def __init__(self, status: int, explanation: str, doing: str = "") -> None:
        super().__init__(status, explanation, doing)
        self.status_code = status
        self.explanation = explanation
        self.doing = doing

    def __str__(self) -> str:
        return f"{self.status_code} {self.doing}: {self.explanation}"

    def is_server_error(self) -> bool:
        return 500 <= self.status_code < 600


class EngineNotFoundError(EngineCallError):
    """404: the engine does not know the container (or image)."""


class EngineImageNotFoundError(EngineNotFoundError):
    """404 naming a missing image."""


class EngineConnectionError(ConnectionError):
    """The engine's socket refused, closed or timed out: no engine answers (the SDK's transport errors)."""


def socket_path(docker_host: str | None) -> str | None:
    """The unix socket a ``DOCKER_HOST`` value names (unset or empty: the default socket); None for any
    other scheme (tcp, ssh, npipe), which only the SDK speaks."""
    if not docker_host:
        return DEFAULT_SOCKET
    if docker_host.startswith("unix://"):
        return docker_host.removeprefix("unix://") or DEFAULT_SOCKET
    return None


def from_env() -> EngineClient | None:
    """A client for the engine ``DOCKER_HOST`` names, as ``docker.from_env`` reads it; None when that is
    not a unix socket. Connects to nothing yet."""
    path = socket_path(os.environ.get("DOCKER_HOST"))
    return EngineClient(path) if path else None


class _Images:
    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine

    def get(self, name: str) -> dict[str, Any]:
        """The image's attributes. Raises EngineImageNotFoundError when the engine has no such image."""
        found: dict[str, Any] = self._engine.call(
            "GET", f"/images/{quote(name, safe='')}/json", doing="image"
        )
        return found


class EngineClient:
    """The calls of one sandbox's life on a local engine (see the module's docstring). Thread-safe:
    every call opens its own connection."""

    def __init__(self, path: str, timeout: float = CALL_TIMEOUT_S) -> None:
        self.path = path
        self.timeout = timeout
        self.api = self  # the SDK's low-level calls live under ``client.api``; here they are ours
        self.images = _Images(self)
        self._early_info: threading.Thread | None = None
        self._early_answer: list[Any] = []  # the info, or the exception asking for it raised

    def prefetch_info(self) -> None:
        """Ask for ``info`` now, in a thread, for the next ``info()`` to take. A command's own imports
        (pydantic above all) take longer than the engine's ~7 ms answer, and need the CPU while the
        request needs none: the answer waits for them instead of them for it."""

        def ask() -> None:
            try:
                self._early_answer.append(self._info_now())
            except Exception as e:  # handed to the caller of info(), as if it had asked itself
                self._early_answer.append(e)

        self._early_info = threading.Thread(target=ask, name="sandfleet-engine-info", daemon=True)
        self._early_info.start()

    # -- the calls --------------------------------------------------------------------------------

    def ping(self) -> bool:
        """True, or raises as every call does (the SDK's ``ping`` too)."""
        status, body = self._request("GET", "/_ping")
        if status != 200:
            raise _call_error(status, body, "ping")
        return True

    def info(self) -> dict[str, Any]:
        """The engine's facts (the answer ``prefetch_info`` asked for, once, if it did)."""
        early, self._early_info = self._early_info, None
        if early is not None:
            early.join()
            answer = self._early_answer.pop()
            if isinstance(answer, Exception):
                raise answer
            return dict(answer)
        return self._info_now()

    def _info_now(self) -> dict[str, Any]:
        found: dict[str, Any] = self.call("GET", "/info", doing="info")
        return found

    def create_container_from_config(self, config: dict[str, Any], name: str | None = None) -> dict[str, Any]:
        """Create a container from a finished Engine API body (spec.create_body); returns {"Id": ...}."""
        query = f"?{urlencode({'name': name})}" if name else ""
        created: dict[str, Any] = self.call("POST", f"/containers/create{query}", config, doing="create")
        return created

    def attach_socket(self, container_id: str, params: dict[str, Any]) -> socket.socket:
        """The container's attach stream as a plain socket (stdin writable, output multiplexed)."""
        sock = self._connect()
        try:
            path = f"/containers/{quote(container_id)}/attach?{urlencode(params)}"
            head = (
                f"POST {path} HTTP/1.1\r\nHost: docker\r\nContent-Length: 0\r\n"
                "Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
            )
            sock.sendall(head.encode())
            status, _, _ = _parse_head(_read_head(sock))
            if status not in (101, 200):
                raise _call_error(status, b"", "attach")
        except BaseException:
            sock.close()
            raise
        return sock

    def start(self, container_id: str) -> None:
        self.call("POST", f"/containers/{quote(container_id)}/start", doing="start")

    def inspect_container(self, container_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.call("GET", f"/containers/{quote(container_id)}/json", doing="inspect")
        return found

    def remove_container(self, container_id: str, force: bool = False) -> None:
        query = "?force=1" if force else ""
        self.call("DELETE", f"/containers/{quote(container_id)}{query}", doing="remove")

    def events(
        self, since: str, until: str, filters: dict[str, Any], decode: bool = True
    ) -> Iterator[dict[str, Any]]:
        """The engine's events between two times (``until`` is past: the answer ends), asked for at the
        call; ``filters`` as the SDK takes them (a value or a list of values per name)."""
        listed = {k: [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in filters.items()}
        query = urlencode({"since": since, "until": until, "filters": json.dumps(listed)})
        status, body = self._request("GET", f"/events?{query}")
        if status != 200:
            raise _call_error(status, body, "events")
        return iter([json.loads(line) for line in body.splitlines() if line.strip()])

    def close(self) -> None:
        """Nothing stays open between calls (the SDK's client has pooled connections to close)."""

    # -- HTTP over the socket ------------------------------------------------------------------------

    def call(self, method: str, path: str, payload: Any = None, *, doing: str) -> Any:
        """One call's decoded JSON answer (None when empty). Raises EngineCallError (and its
        subclasses) on an error status, EngineConnectionError when the engine does not answer."""
        status, body = self._request(method, path, payload)
        if status >= 400:
            raise _call_error(status, body, doing)
        return json.loads(body) if body.strip() else None

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError as e:
            sock.close()
            raise EngineConnectionError(e.errno, e.strerror or str(e)) from e
        return sock

    def _request(self, method: str, path: str, payload: Any = None) -> tuple[int, bytes]:
        data = b"" if payload is None else json.dumps(payload).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\nContent-Length: {len(data)}\r\n"
        head += "Content-Type: application/json\r\n\r\n" if payload is not None else "\r\n"
        sock = self._connect()
        try:
            sock.sendall(head.encode() + data)
            answer = bytearray()
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError as e:  # a timeout too: the engine hangs
            raise EngineConnectionError(e.errno, e.strerror or str(e) or type(e).__name__) from e
        finally:
            sock.close()
        raw_head, sep, body = bytes(answer).partition(b"\r\n\r\n")
        if not sep:
            raise EngineConnectionError(0, "the engine closed the connection mid-answer")
        status, headers, _ = _parse_head(raw_head + sep)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = _dechunked(body)
        return status, body


def _read_head(sock: socket.socket) -> bytes:
    """The response head of a hijacked connection, and not a byte of the stream after it: read a byte
    at a time (a head is ~150 bytes; the stream that follows belongs to the agent's channel)."""
    head = bytearray()
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        if not byte:
            raise EngineConnectionError(0, "the engine closed the attach connection")
        head += byte
        if len(head) > HEAD_LIMIT_BYTES:
            raise EngineConnectionError(0, "the engine's answer to attach has no end of head")
    return bytes(head)


def _parse_head(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise EngineConnectionError(0, f"not an HTTP answer from the engine: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, raw


def _dechunked(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return bytes(out)


def _call_error(status: int, body: bytes, doing: str) -> EngineCallError:
    """The error for an error status, the engine's message as its explanation (as the SDK's)."""
    try:
        explanation = str(json.loads(body).get("message", "")) if body.strip() else ""
    except (ValueError, AttributeError):
        explanation = body.decode(errors="replace").strip()
    if status == 404:
        missing_image = any(word in explanation.lower() for word in IMAGE_MISSING_WORDS)
        return (EngineImageNotFoundError if missing_image else EngineNotFoundError)(
            status, explanation, doing
        )
    return EngineCallError(status, explanation, doing)
