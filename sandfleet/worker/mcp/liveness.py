"""Keeping up with a connected server: its list-changed notifications and a periodic ping.

**Changes.** A server says its tools (or resources) changed with ``notifications/tools/list_changed``
(``resources/list_changed``). On a handshake-era connection (2025-11-25 and before) it sends them
unasked; on a 2026-07-28 connection only on a ``subscriptions/listen`` stream, which
:func:`listen_for_changes` holds open (and opens again after a pause when it ends: a dropped stream
has no replay, so the listing is refetched then). Either way the SDK hands each notification to the
client's message handler, :meth:`ChangeNotes.handler`, which only counts it and marks a refresh due.
The session re-lists at most once per ``min_interval_s`` (notifications meanwhile are one refresh),
so a server flooding notifications costs one listing per interval and a counter, never a busy loop.

**Ping.** :func:`ping` asks for an answer the protocol guarantees: ``ping`` on a handshake-era
connection, ``server/discover`` on a 2026-07-28 one (which removed ``ping``; discover has no side
effect). Any JSON-RPC answer, an error included, means the server is there.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import anyio.lowlevel
import mcp_types as types
from mcp import Client
from mcp.client.subscriptions import SubscriptionLost
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

log = logging.getLogger("sandfleet.mcp")

_CHANGES = (types.ToolListChangedNotification, types.ResourceListChangedNotification)
_NO_ANSWER = (types.CONNECTION_CLOSED, types.REQUEST_TIMEOUT)
RELISTEN_MIN_PAUSE_S = 1.0  # a server ending every stream at once costs one listen a second


class ChangeNotes:
    """One server's list-changed notifications and the refreshes they are owed (on the loop thread;
    the counters are read from any)."""

    def __init__(self, min_interval_s: float) -> None:
        self.min_interval_s = min_interval_s
        self.notified = 0  # notifications received, over every connection
        self.refreshes = 0  # listings read after one
        self.last_refresh_s: float | None = None  # how long the last one took
        self._due = anyio.Event()
        self._next_at = 0.0

    def reset(self) -> None:
        """A new connection: it starts from a fresh listing, nothing is due."""
        self._due = anyio.Event()

    def note(self) -> None:
        self.notified += 1
        self._due.set()

    async def handler(self, message: Any) -> None:
        """The client's message handler: counts change notifications, ignores everything else."""
        if isinstance(message, _CHANGES):
            self.note()
        await anyio.lowlevel.checkpoint()

    async def wait_due(self) -> None:
        """Return once a refresh is due and allowed (at most one per ``min_interval_s``)."""
        await self._due.wait()
        delay = self._next_at - time.monotonic()
        if delay > 0:
            await anyio.sleep(delay)
        self._due = anyio.Event()  # what arrives from now on is owed the next refresh

    def refreshed(self, took_s: float) -> None:
        self.refreshes += 1
        self.last_refresh_s = took_s
        self._next_at = time.monotonic() + self.min_interval_s


async def listen_for_changes(client: Client, notes: ChangeNotes, pause_s: float) -> None:
    """Hold a ``subscriptions/listen`` stream open on a 2026-07-28 connection whose server announces
    list changes; returns at once otherwise (handshake-era servers notify unasked)."""
    capabilities = client.server_capabilities
    tools = bool(capabilities.tools and capabilities.tools.list_changed)
    resources = bool(capabilities.resources and capabilities.resources.list_changed)
    if client.protocol_version not in MODERN_PROTOCOL_VERSIONS or not (tools or resources):
        return
    while True:
        try:
            async with client.listen(tools_list_changed=tools, resources_list_changed=resources) as events:
                async for _event in events:  # each one reached notes.handler too
                    pass
        except SubscriptionLost:
            pass
        except (MCPError, TimeoutError) as e:
            if isinstance(e, MCPError) and e.code == types.CONNECTION_CLOSED:
                return  # the session is ending
            log.info(
                "MCP: the server does not keep a change stream (%s); its changes show at reconnection", e
            )
            return
        await anyio.sleep(max(pause_s, RELISTEN_MIN_PAUSE_S))
        notes.note()  # no stream for a while: changes may have been missed, refetch


async def ping(client: Client, timeout_s: float) -> float:
    """One round trip to the server, in seconds.

    Raises:
        TimeoutError: no answer within ``timeout_s``.
        MCPError: the connection closed (``CONNECTION_CLOSED``) or the SDK timed the request out.
        httpx2 errors: an HTTP server that cannot be reached (they also end the SDK's transport).
    """
    began = time.monotonic()
    with anyio.fail_after(timeout_s):
        try:
            if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
                await client.session.send_discover(client.protocol_version)
            else:
                await client.session.send_ping()
        except MCPError as e:
            if e.code in _NO_ANSWER:
                raise
    return time.monotonic() - began
