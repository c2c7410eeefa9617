"""The MCP sessions of one worker process: every configured server connected once, kept, restarted.

:class:`McpSessions` owns one event-loop thread and, on it, a supervisor per server. A supervisor
starts its server (stdio: the process; HTTP: a session), lists its tools, keeps the session for
every job of the process, and when the connection ends (the process died, a call found the HTTP
server gone) reconnects after 0.5 s, 1 s, 2 s ... at most 30 s, back to 0.5 s once a connection has
lived 10 s. :meth:`McpSessions.stop` ends them all (stdio processes: stdin closed, then SIGTERM and
SIGKILL to their process group).

:meth:`McpSessions.call` is thread-safe and does not serialise: calls from many bridge threads run
concurrently over one session (JSON-RPC requests are multiplexed by id). A call is bounded by its
timeout (the SDK then sends the server a cancellation); the SDK's errors become ours in
:mod:`~sandfleet.worker.mcp.failures`: ``TimeoutError``, :class:`ToolServerError` (down, crashed
mid-call, garbage, too large) or :class:`ToolError` (the server refused the call).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp import Client

from sandfleet.worker.mcp import patterns
from sandfleet.worker.mcp.config import McpConfig, McpServerConfig
from sandfleet.worker.mcp.errors import ToolServerError
from sandfleet.worker.mcp.failures import call_failure, connect_failure, timeout_message
from sandfleet.worker.mcp.http_transport import http_transport
from sandfleet.worker.mcp.stdio_transport import stdio_transport
from sandfleet.worker.mcp.wire import WireState

log = logging.getLogger("sandfleet.mcp")

CONNECT_TIMEOUT_S = 30.0  # start-up, handshake and the tool list, per request
FIRST_CONNECT_WAIT_S = 30.0  # how long start() waits for every server's first attempt
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 10.0  # a connection that lived this long resets the backoff
STOP_TIMEOUT_S = 15.0
CALL_GRACE_S = 2.0  # past the call's own timeout, how long the caller waits for the SDK to give up
MAX_TOOL_PAGES = 20
CLIENT_NAME = "sandfleet"


@dataclass(frozen=True)
class ListedTool:
    """One tool as its server lists it (its own name, schemas as sent)."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None


@dataclass(frozen=True)
class ServerStatus:
    """A server as ``sandfleet doctor`` shows it."""

    name: str
    where: str
    up: bool
    detail: str
    fix: str
    tools: int
    restarts: int
    disabled: bool = False


class _Server:
    """One supervised server; written on the loop thread, read from any."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self.client: Client | None = None
        self.wire = WireState()
        self.tools: tuple[ListedTool, ...] = ()
        self.known: tuple[ListedTool, ...] = ()  # the last listing, kept while down (stable names)
        self.protocol: str | None = None
        self.error = "not started yet"
        self.fix = ""
        self.restarts = 0
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
    ) -> None:
        self.config = config
        self._servers = {s.name: _Server(s) for s in config.enabled}
        self._connect_timeout_s = connect_timeout_s
        self._backoff = (backoff_start_s, backoff_max_s)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._main: concurrent.futures.Future[None] | None = None
        self._stopping = asyncio.Event()
        self._lock = threading.Lock()
        self._generation = 0

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
        """Changes whenever a server comes up or goes down (the offered tools may have changed)."""
        with self._lock:
            return self._generation

    def server_names(self) -> list[str]:
        """Every configured server, disabled ones included, in config order."""
        return [s.name for s in self.config.servers]

    def listings(self) -> dict[str, tuple[tuple[ListedTool, ...], bool]]:
        """``server -> (tools, up)``: the current tools of servers that are up, the last known ones of
        servers that are down (offered by nobody, kept so that names stay stable)."""
        return {
            name: (s.tools if s.client else s.known, s.client is not None)
            for name, s in self._servers.items()
        }

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
        rows = []
        for config in self.config.servers:
            state = self._servers.get(config.name)
            if state is None:
                rows.append(ServerStatus(config.name, config.describe(), False, "disabled", "", 0, 0, True))
            elif state.client is not None:
                detail = f"{len(state.tools)} tools, protocol {state.protocol}"
                rows.append(
                    ServerStatus(
                        config.name, config.describe(), True, detail, "", len(state.tools), state.restarts
                    )
                )
            else:
                rows.append(
                    ServerStatus(
                        config.name, config.describe(), False, state.error, state.fix, 0, state.restarts
                    )
                )
        return rows

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
        state = self._servers.get(server)
        loop = self._loop
        if state is None or loop is None:
            raise ToolServerError(f"MCP server {server!r} is not running ({self.down_reason(server)})")
        client = state.client
        if client is None:
            raise ToolServerError(f"MCP server {server!r} is down: {state.error}")
        future = asyncio.run_coroutine_threadsafe(self._call(state, client, tool, arguments, timeout_s), loop)
        try:
            return future.result(timeout_s + CALL_GRACE_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(timeout_message(server, tool, timeout_s, state.wire)) from None

    async def _call(
        self, state: _Server, client: Client, tool: str, arguments: dict[str, Any], timeout_s: float
    ) -> types.CallToolResult:
        try:
            return await client.call_tool(tool, arguments, read_timeout_seconds=timeout_s)
        except Exception as e:
            failure = call_failure(e, state.config, tool, timeout_s, state.wire)
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
        """Connect, list the tools, and hold the session until it breaks or the worker stops."""
        config = state.config
        wire = WireState()
        state.wire, state.broken = wire, anyio.Event()
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
            ) as client:
                tools = await _list_tools(client, config.name)
                state.tools = state.known = tools
                state.protocol = client.protocol_version
                state.client = client
                self._bump()
                state.tried.set()
                log.info("MCP server %s is up: %d tools (%s)", config.name, len(tools), config.describe())
                await _first_of(wire.closed.wait, state.broken.wait, self._stopping.wait)
                state.client = None
                self._bump()
                if not self._stopping.is_set():
                    reason = wire.describe() or "the connection ended"
        except Exception as e:  # anything the SDK or the server throws ends this attempt, never the loop
            reason, fix = connect_failure(e, config, wire)
        finally:
            if state.client is not None:
                state.client = None
                self._bump()
        state.error, state.fix = (reason, fix) if not self._stopping.is_set() else ("stopped", "")

    def _broken(self, state: _Server) -> None:
        """A call found the connection gone: offer the server's tools no more, and reconnect."""
        if state.client is not None:
            state.client = None
            self._bump()
        if state.broken is not None:
            state.broken.set()

    def _bump(self) -> None:
        with self._lock:
            self._generation += 1


async def _list_tools(client: Client, server: str) -> tuple[ListedTool, ...]:
    tools: list[ListedTool] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += [
            ListedTool(server, t.name, t.description or t.title or "", t.input_schema, t.output_schema)
            for t in page.tools
        ]
        cursor = page.next_cursor
        if not cursor:
            break
    return tuple(tools)


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
