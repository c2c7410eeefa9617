"""The MCP sessions of one worker process: every configured server connected once, kept, restarted.

:class:`McpSessions` owns one event-loop thread and, on it, a supervisor per server. A supervisor
starts its server (stdio: the process; HTTP: a session), reads its listing (tools, resources:
listing.py), keeps the session for every job of the process, and when the connection ends (the
process died, a call or a ping found the server gone) reconnects after 0.5 s, 1 s, 2 s ... at most
30 s (and at most the ping interval), back to 0.5 s once a connection has lived 10 s.
:meth:`McpSessions.stop` ends them all (stdio processes: stdin closed, then SIGTERM and SIGKILL to
their process group).

While a session is held (liveness.py): a list-changed notification has the server's listing read
again, at most once per ``refresh_interval_s``, and swapped in whole (``generation`` changes, the
catalog rebuilds; jobs already admitted keep the tools they were given); every ``ping_interval_s``
the server is pinged, and a ping unanswered within ``ping_timeout_s`` (or an HTTP server that cannot
be reached) ends the session: the server is down, its calls fail at once, and it is reconnected.

:meth:`McpSessions.call` and :meth:`McpSessions.read` are thread-safe and do not serialise: calls
from many bridge threads run concurrently over one session (JSON-RPC requests are multiplexed by id).
A call is bounded by its timeout (the SDK then sends the server a cancellation); the SDK's errors
become ours in :mod:`~sandfleet.worker.mcp.failures`: ``TimeoutError``, :class:`ToolServerError`
(down, crashed mid-call, garbage, too large) or :class:`ToolError` (the server refused the call).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError

from sandfleet.core.settings import (
    DEFAULT_MCP_PING_INTERVAL_S,
    DEFAULT_MCP_PING_TIMEOUT_S,
    DEFAULT_MCP_REFRESH_INTERVAL_S,
)
from sandfleet.worker.mcp import patterns
from sandfleet.worker.mcp.config import McpConfig, McpServerConfig
from sandfleet.worker.mcp.errors import ToolServerError
from sandfleet.worker.mcp.failures import call_failure, connect_failure, timeout_message
from sandfleet.worker.mcp.http_transport import http_transport
from sandfleet.worker.mcp.listing import ListedTool as ListedTool
from sandfleet.worker.mcp.listing import Listing, read_listing
from sandfleet.worker.mcp.liveness import ChangeNotes, listen_for_changes, ping
from sandfleet.worker.mcp.resources import ResourceIndex
from sandfleet.worker.mcp.status import ServerStatus as ServerStatus
from sandfleet.worker.mcp.stdio_transport import stdio_transport
from sandfleet.worker.mcp.wire import WireState

if TYPE_CHECKING:
    from sandfleet.core.settings import Settings

log = logging.getLogger("sandfleet.mcp")

CONNECT_TIMEOUT_S = 30.0  # start-up, handshake and the listing, per request
FIRST_CONNECT_WAIT_S = 30.0  # how long start() waits for every server's first attempt
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 10.0  # a connection that lived this long resets the backoff
STOP_TIMEOUT_S = 15.0
CALL_GRACE_S = 2.0  # past the call's own timeout, how long the caller waits for the SDK to give up
PING_INTERVAL_S = DEFAULT_MCP_PING_INTERVAL_S
PING_TIMEOUT_S = DEFAULT_MCP_PING_TIMEOUT_S
REFRESH_INTERVAL_S = DEFAULT_MCP_REFRESH_INTERVAL_S
CLIENT_NAME = "sandfleet"
READ_RESOURCE = "read_resource"
T = TypeVar("T")


class _Server:
    """One supervised server; written on the loop thread, read from any."""

    def __init__(self, config: McpServerConfig, refresh_interval_s: float) -> None:
        self.config = config
        self.client: Client | None = None
        self.wire = WireState()
        self.listing = Listing()
        self.known: tuple[ListedTool, ...] = ()  # the last listing's tools, kept while down (stable names)
        self.notes = ChangeNotes(refresh_interval_s)
        self.protocol: str | None = None
        self.error = "not started yet"
        self.fix = ""
        self.restarts = 0
        self.since = 0.0  # wall-clock time of the last change between up and down
        self.ping_ms: float | None = None
        self.pinging = False  # a ping is in flight: a failure meanwhile is the ping's finding
        self.ended_by: str | None = None  # why this connection is being ended, when we end it
        self.tried = threading.Event()  # the first attempt is over, up or not
        self.broken: anyio.Event | None = None


class McpSessions:
    """Every enabled server of ``config``, connected on :meth:`start`. Constructing it starts nothing."""

    def __init__(
        self,
        config: McpConfig,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        backoff_start_s: float = BACKOFF_START_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        ping_interval_s: float = PING_INTERVAL_S,
        ping_timeout_s: float = PING_TIMEOUT_S,
        refresh_interval_s: float = REFRESH_INTERVAL_S,
    ) -> None:
        self.config = config
        self._servers = {s.name: _Server(s, refresh_interval_s) for s in config.enabled}
        self._connect_timeout_s = connect_timeout_s
        self._backoff = (backoff_start_s, min(backoff_max_s, max(backoff_start_s, ping_interval_s)))
        self._ping = (ping_interval_s, ping_timeout_s)
        self._refresh_interval_s = refresh_interval_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._main: concurrent.futures.Future[None] | None = None
        self._stopping = asyncio.Event()
        self._lock = threading.Lock()
        self._generation = 0

    @classmethod
    def for_settings(cls, config: McpConfig, settings: Settings) -> McpSessions:
        """Sessions pinging and refreshing as the settings say (SANDFLEET_MCP_*)."""
        return cls(
            config,
            ping_interval_s=settings.mcp_ping_interval_s,
            ping_timeout_s=settings.mcp_ping_timeout_s,
            refresh_interval_s=settings.mcp_refresh_interval_s,
        )

    # -- life cycle -------------------------------------------------------------------------------

    def start(self, wait_s: float = FIRST_CONNECT_WAIT_S) -> McpSessions:
        """Start the loop thread and every server; wait (at most ``wait_s``) for each first attempt."""
        if self._loop is not None:
            return self
        patterns.install()  # before the SDK checks any server's output against its schema
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="sandfleet-mcp", daemon=True)
        self._thread.start()
        self._main = asyncio.run_coroutine_threadsafe(self._supervise_all(), loop)
        deadline = time.monotonic() + wait_s
        for server in self._servers.values():
            server.tried.wait(max(0.0, deadline - time.monotonic()))
        return self

    def stop(self) -> None:
        """Stop every server and the loop thread. Never raises; safe to call twice."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        loop.call_soon_threadsafe(self._stopping.set)
        try:
            assert self._main is not None
            self._main.result(STOP_TIMEOUT_S)
        except Exception as e:  # a server that would not stop: the loop goes anyway
            log.warning("stopping the MCP servers took too long or failed: %s", e)
            if self._main is not None:
                self._main.cancel()
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
        if not loop.is_running():
            loop.close()

    def __enter__(self) -> McpSessions:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what is offered ----------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        """Changes whenever a server comes up, goes down or its listing changed."""
        with self._lock:
            return self._generation

    def server_names(self) -> list[str]:
        """Every configured server, disabled ones included, in config order."""
        return [s.name for s in self.config.servers]

    def listings(self) -> dict[str, tuple[tuple[ListedTool, ...], bool]]:
        """``server -> (tools, up)``: the current tools of servers that are up, the last known ones of
        servers that are down (offered by nobody, kept so that names stay stable)."""
        return {
            name: (s.listing.tools if s.client else s.known, s.client is not None)
            for name, s in self._servers.items()
        }

    def resources(self, server: str) -> ResourceIndex:
        """What the server listed to read (empty when it is down or offers none)."""
        state = self._servers.get(server)
        return state.listing.resources if state is not None and state.client is not None else ResourceIndex()

    def is_up(self, server: str) -> bool:
        state = self._servers.get(server)
        return state is not None and state.client is not None

    def down_reason(self, server: str) -> str:
        state = self._servers.get(server)
        if state is None:
            return "disabled in the config" if server in self.server_names() else "not configured"
        return state.error

    def status(self) -> list[ServerStatus]:
        """Every configured server: up (with its tool count and protocol) or down (why, and the fix)."""
        return [self._status(config) for config in self.config.servers]

    def _status(self, config: McpServerConfig) -> ServerStatus:
        state = self._servers.get(config.name)
        if state is None:
            return ServerStatus(config.name, config.describe(), False, "disabled", "", 0, 0, True)
        up = state.client is not None
        listing = state.listing
        readable = len(listing.resources.uris) + len(listing.resources.templates) if up else 0
        if up:
            extra = f", {readable} resources" if readable else ""
            detail = f"{len(listing.tools)} tools{extra}, protocol {state.protocol}"
        else:
            detail = state.error
        return ServerStatus(
            name=config.name,
            where=config.describe(),
            up=up,
            detail=detail,
            fix="" if up else state.fix,
            tools=len(listing.tools) if up else 0,
            restarts=state.restarts,
            resources=readable,
            since=state.since,
            ping_ms=state.ping_ms if up else None,
            notified=state.notes.notified,
            refreshes=state.notes.refreshes,
        )

    # -- calls --------------------------------------------------------------------------------------

    def call(
        self, server: str, tool: str, arguments: dict[str, Any], timeout_s: float
    ) -> types.CallToolResult:
        """Call ``tool`` (the server's own name) with ``arguments``; from any thread.

        Raises:
            TimeoutError: no answer within ``timeout_s`` (the server was sent a cancellation).
            ToolServerError: the server is down, crashed during the call, or answered with garbage or
                too many bytes; the message names the server and what happened.
            ToolError: the server refused the call (an unknown tool, invalid parameters ...).
        """

        def request(client: Client) -> Awaitable[types.CallToolResult]:
            return client.call_tool(tool, arguments, read_timeout_seconds=timeout_s)

        return self._request(server, tool, request, timeout_s)

    def read(self, server: str, uri: str, timeout_s: float) -> types.ReadResourceResult:
        """Read the resource ``uri`` (checked by the caller against :meth:`resources`); errors as
        :meth:`call`'s."""

        async def request(client: Client) -> types.ReadResourceResult:
            with anyio.fail_after(timeout_s):  # the SDK's read has no per-request timeout of its own
                return await client.read_resource(uri)

        return self._request(server, READ_RESOURCE, request, timeout_s)

    def ping(self, server: str, timeout_s: float = PING_TIMEOUT_S) -> float:
        """One ping's round trip to a server that is up, in seconds (for measurements; the sessions
        ping on their own). Raises ToolServerError when it is down or does not answer."""
        return self._request(server, "ping", lambda client: ping(client, timeout_s), timeout_s)

    def _request(
        self, server: str, what: str, request: Callable[[Client], Awaitable[T]], timeout_s: float
    ) -> T:
        state = self._servers.get(server)
        loop = self._loop
        if state is None or loop is None:
            raise ToolServerError(f"MCP server {server!r} is not running ({self.down_reason(server)})")
        client = state.client
        if client is None:
            raise ToolServerError(f"MCP server {server!r} is down: {state.error}")
        future = asyncio.run_coroutine_threadsafe(self._send(state, client, what, request, timeout_s), loop)
        try:
            return future.result(timeout_s + CALL_GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(timeout_message(server, what, timeout_s, state.wire)) from None

    async def _send(
        self,
        state: _Server,
        client: Client,
        what: str,
        request: Callable[[Client], Awaitable[T]],
        timeout_s: float,
    ) -> T:
        try:
            return await request(client)
        except TimeoutError:
            raise TimeoutError(timeout_message(state.config.name, what, timeout_s, state.wire)) from None
        except Exception as e:
            failure = call_failure(e, state.config, what, timeout_s, state.wire)
            if failure is None:
                raise
            if failure.connection_lost:
                self._broken(state)
            raise failure.error from None

    # -- supervision (on the loop thread) -----------------------------------------------------------

    async def _supervise_all(self) -> None:
        async with anyio.create_task_group() as tasks:
            for state in self._servers.values():
                tasks.start_soon(self._supervise, state)

    async def _supervise(self, state: _Server) -> None:
        first, most = self._backoff
        delay = first
        while not self._stopping.is_set():
            began = time.monotonic()
            await self._serve_once(state)
            state.tried.set()
            if self._stopping.is_set():
                break
            if time.monotonic() - began >= STABLE_AFTER_S:
                delay = first
            log.warning(
                "MCP server %s is down (%s); restarting in %.1f s", state.config.name, state.error, delay
            )
            with anyio.move_on_after(delay):
                await self._stopping.wait()
            delay = min(delay * 2, most)
            state.restarts += 1

    async def _serve_once(self, state: _Server) -> None:
        """Connect, read the listing, and hold the session until it breaks or the worker stops."""
        config = state.config
        wire = WireState()
        state.wire, state.broken, state.ended_by, state.ping_ms = wire, anyio.Event(), None, None
        state.notes.reset()
        transport = (
            stdio_transport(config, wire) if config.transport == "stdio" else http_transport(config, wire)
        )
        reason, fix = "the connection ended", ""
        try:
            async with Client(
                transport,
                read_timeout_seconds=self._connect_timeout_s,
                client_info=types.Implementation(name=CLIENT_NAME, version=_version()),
                cache=None,
                message_handler=state.notes.handler,
            ) as client:
                state.listing = await read_listing(client, config.name)
                state.known, state.protocol = state.listing.tools, client.protocol_version
                self._mark(state, client)
                state.tried.set()
                log.info(
                    "MCP server %s is up: %d tools (%s)", config.name, len(state.known), config.describe()
                )
                await self._hold(state, client)
                reason = wire.describe() or state.ended_by or "the connection ended"  # the wire's first
                if not self._stopping.is_set():  # shown at once, while the transport shuts down
                    state.error, state.fix = reason, ""
                self._mark(state, None)
        except Exception as e:  # anything the SDK or the server throws ends this attempt, never the loop
            reason, fix = connect_failure(e, config, wire)
            if state.pinging:
                reason = f"a ping failed: {reason}"
        finally:
            state.pinging = False
            if state.client is not None:
                self._mark(state, None)
        state.error, state.fix = (reason, fix) if not self._stopping.is_set() else ("stopped", "")

    async def _hold(self, state: _Server, client: Client) -> None:
        """Serve the session until it breaks, a ping goes unanswered or the worker stops; meanwhile
        follow the server's list changes."""
        assert state.broken is not None
        async with anyio.create_task_group() as background:
            background.start_soon(self._follow_changes, state, client)
            background.start_soon(listen_for_changes, client, state.notes, self._refresh_interval_s)
            await _first_of(
                state.wire.closed.wait,
                state.broken.wait,
                self._stopping.wait,
                lambda: self._ping_until_unanswered(state, client),
            )
            background.cancel_scope.cancel()

    async def _follow_changes(self, state: _Server, client: Client) -> None:
        """Read the listing again each time a refresh is due, and offer it whole. A listing that
        cannot be read (malformed, too large) ends the session, as it would at connection."""
        name = state.config.name
        while True:
            await state.notes.wait_due()
            began = time.monotonic()
            try:
                listing = await read_listing(client, name)
            except Exception as e:
                reason, _ = connect_failure(e, state.config, state.wire)
                self._broken(state, f"its listing after a change could not be read: {reason}")
                return
            state.listing, state.known = listing, listing.tools
            state.notes.refreshed(time.monotonic() - began)
            self._bump()
            log.info("MCP server %s changed: now %d tools", name, len(listing.tools))

    async def _ping_until_unanswered(self, state: _Server, client: Client) -> None:
        interval_s, timeout_s = self._ping
        while True:
            await anyio.sleep(interval_s)
            state.pinging = True  # left set if the ping's request ends the transport (HTTP unreachable)
            try:
                took = await ping(client, timeout_s)
            except TimeoutError:
                state.ended_by = f"no answer to a ping within {timeout_s:g} s"
                return
            except MCPError as e:  # the connection closed (the wire says why), or the SDK gave up
                state.ended_by = f"a ping failed: {e.message}"
                return
            state.pinging = False
            state.ping_ms = round(took * 1000, 3)

    def _broken(self, state: _Server, reason: str | None = None) -> None:
        """The connection is gone (a call found it so) or unusable: offer the server's tools no more,
        and reconnect."""
        if reason is not None and state.ended_by is None:
            state.ended_by = reason
        if state.client is not None:
            state.error, state.fix = state.ended_by or "a call found the connection gone", ""
            self._mark(state, None)
        if state.broken is not None:
            state.broken.set()

    def _mark(self, state: _Server, client: Client | None) -> None:
        """The server is up (``client``) or down from now on."""
        state.client = client
        state.since = time.time()
        self._bump()

    def _bump(self) -> None:
        with self._lock:
            self._generation += 1


async def _first_of(*waits: Callable[[], Awaitable[Any]]) -> None:
    """Return as soon as one of ``waits`` returns."""
    async with anyio.create_task_group() as tasks:

        async def one(wait: Callable[[], Awaitable[Any]]) -> None:
            await wait()
            tasks.cancel_scope.cancel()

        for wait in waits:
            tasks.start_soon(one, wait)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sandfleet")
    except PackageNotFoundError:
        return "0"
