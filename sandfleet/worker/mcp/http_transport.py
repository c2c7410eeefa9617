"""The streamable HTTP transport: the SDK's own client, with the config's headers and a size bound.

One HTTP client per server connection, kept for as long as the session lives (the worker reuses
one MCP session per server, not one per call). The SDK bounds each server-sent event
(``max_sse_event_size``); a plain JSON response it reads whole, so :class:`CappedTransport` stops
reading one past ``max_message_bytes`` and the SDK turns that into an error answer for the request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp.client.streamable_http import streamable_http_client

from sandfleet.worker.mcp.config import McpServerConfig
from sandfleet.worker.mcp.wire import WireState

CONNECT_TIMEOUT_S = 10.0
STREAM_READ_TIMEOUT_S = 300.0  # a server may hold an event stream open this long between events


class MessageTooLargeError(httpx2.StreamError):
    """A response body past the server's ``maxMessageBytes``."""


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, stream: Any, limit: int) -> None:
        self._stream, self._limit = stream, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._stream:
            seen += len(chunk)
            if seen > self._limit:  # the SDK answers the request with this error; the session goes on
                raise MessageTooLargeError(
                    f"it answered with more than {self._limit} bytes (maxMessageBytes)"
                )
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class CappedTransport(httpx2.AsyncBaseTransport):
    """An HTTP transport whose non-streaming response bodies stop at ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return response  # bounded per event by the SDK
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_CappedStream(response.stream, self._limit),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


@asynccontextmanager
async def http_transport(server: McpServerConfig, wire: WireState) -> AsyncIterator[tuple[Any, Any]]:
    """Yield the session's (read, write) streams to ``server.url``, with its headers. (``wire`` is
    the stdio transport's; over HTTP every failure comes back as the answer to its request.)"""
    assert server.url is not None
    timeout = httpx2.Timeout(CONNECT_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
    client = httpx2.AsyncClient(
        headers=server.headers, timeout=timeout, transport=CappedTransport(server.max_message_bytes)
    )
    async with (
        client,
        streamable_http_client(
            server.url, http_client=client, max_sse_event_size=server.max_message_bytes
        ) as streams,
    ):
        yield streams
