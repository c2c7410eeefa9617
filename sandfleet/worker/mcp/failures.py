"""The SDK's errors as ours, with what happened in words an operator or a program can act on.

A call's failure becomes ``TimeoutError`` (no answer in time), :class:`ToolServerError` (the server
crashed or closed the connection, answered unreadably or with something that is not a tool result)
or :class:`ToolError` (the server refused the call); a failed connection attempt becomes a reason
and a fix for ``sandfleet doctor`` and the job's error. Pure: the exceptions are only inspected.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx2
import mcp_types as types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from sandfleet.worker.mcp.config import McpServerConfig
from sandfleet.worker.mcp.errors import ToolError, ToolServerError
from sandfleet.worker.mcp.wire import WireState


@dataclass(frozen=True)
class CallFailure:
    error: Exception  # what the program gets
    connection_lost: bool  # the session is gone: offer the server's tools no more, reconnect


def call_failure(
    error: Exception, config: McpServerConfig, tool: str, timeout_s: float, wire: WireState
) -> CallFailure | None:
    """What a failed ``call_tool`` means (None: not an error of the server's; let it propagate)."""
    name = config.name
    if isinstance(error, MCPError):
        if error.code == types.REQUEST_TIMEOUT:
            return CallFailure(TimeoutError(timeout_message(name, tool, timeout_s, wire)), False)
        if error.code == types.CONNECTION_CLOSED:
            what = wire.describe() or error.message
            again = "it is being restarted" if config.transport == "stdio" else "reconnecting"
            message = f"MCP server {name!r} failed during the call to {tool}: {what}; {again}"
            return CallFailure(ToolServerError(message), True)
        if error.code == types.PARSE_ERROR:
            return CallFailure(
                ToolServerError(f"MCP server {name!r} answered {tool} unreadably: {error.message}"), False
            )
        message = f"MCP server {name!r} refused the call to {tool}: {error.message} (code {error.code})"
        return CallFailure(ToolError(message), False)
    if isinstance(error, ValidationError):
        problem = str(error).splitlines()[0][:300]
        return CallFailure(
            ToolServerError(f"MCP server {name!r} answered {tool} with a malformed result: {problem}"), False
        )
    if isinstance(error, RuntimeError):  # the SDK's check of structured content against the output schema
        return CallFailure(ToolServerError(f"MCP server {name!r} answered {tool} wrongly: {error}"), False)
    if isinstance(error, httpx2.HTTPError | OSError):
        return CallFailure(ToolServerError(f"MCP server {name!r} cannot be reached: {one_line(error)}"), True)
    return None


def connect_failure(error: BaseException, config: McpServerConfig, wire: WireState) -> tuple[str, str]:
    """Why a connection attempt failed, and the fix, from the SDK's exception."""
    cause = _leaf(error)
    trace = wire.describe()
    where = f"mcpServers.{config.name}"
    if isinstance(cause, FileNotFoundError | PermissionError | NotADirectoryError):
        return (
            f"cannot start {config.command!r}: {cause.strerror or cause}",
            f"install the server (e.g. pip install it) or correct its command/cwd in {where}",
        )
    if isinstance(cause, httpx2.ConnectError | httpx2.ConnectTimeout):
        return (
            f"cannot connect to {config.url}: {one_line(cause)}",
            f"start the server at {config.url}, or correct its url in {where}",
        )
    if isinstance(cause, httpx2.HTTPStatusError) and cause.response.status_code in (401, 403):
        return (
            f"{config.url} refused the client: HTTP {cause.response.status_code}",
            f"check the server's headers (e.g. Authorization) in {where}",
        )
    if isinstance(cause, MCPError) and cause.code == types.REQUEST_TIMEOUT:
        return (
            f"no answer to the handshake within the connect timeout{'; ' + trace if trace else ''}",
            "run the server's command by hand to see whether it starts and speaks MCP on stdout",
        )
    text = one_line(cause)
    return (
        f"{text}{'; ' + trace if trace else ''}" if text else trace or type(cause).__name__,
        "run the server's command by hand to see why it stops"
        if config.transport == "stdio"
        else f"check that {config.url} serves MCP (streamable HTTP)",
    )


def timeout_message(server: str, tool: str, timeout_s: float, wire: WireState) -> str:
    extra = wire.describe()
    return f"MCP server {server!r} did not answer {tool} within {timeout_s:g} s" + (
        f"; {extra}" if extra else ""
    )


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def _leaf(error: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = next(
            (e for e in error.exceptions if not isinstance(e, asyncio.CancelledError)), error.exceptions[0]
        )
    return error
