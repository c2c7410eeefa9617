"""The stdio transport: an MCP server as a child process, newline-delimited JSON-RPC on its pipes.

The SDK's own ``stdio_client`` reads a line of any length into memory and drops a line it cannot
parse, so a server answering a gigabyte would exhaust the worker and a garbled answer would leave its
call waiting. This transport is the same pipe work with bounds: a line longer than
``max_message_bytes`` ends the connection (every pending call fails at once, naming the reason, and the
server is restarted), and so does a line nested past the JSON nesting cap (``MAX_JSON_DEPTH`` inside
the message's own few levels: read before any parser, as json's recurses); a line that is not
JSON-RPC but names a request id answers that request with an error at once; any other garbage is
counted (the call's timeout then says what was seen). The
server's stderr is kept as a short tail (and logged at debug level), never mixed into the protocol.

Messages are parsed and serialised by the SDK's own types; the JSON-RPC session is the SDK's
``Client``. The process gets the SDK's safe default environment plus the config's ``env`` (nothing
else of the worker's), its own process group, and is stopped as the MCP spec says: stdin closed, a
grace period, then SIGTERM and SIGKILL to the whole group.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import mcp_types as types
from anyio.abc import Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from sandfleet.core import json_limits
from sandfleet.core.errors import JsonLimitError
from sandfleet.worker.mcp.config import McpServerConfig
from sandfleet.worker.mcp.wire import WireState

log = logging.getLogger("sandfleet.mcp")

EXIT_GRACE_S = 2.0  # after stdin closes, before SIGTERM (the MCP spec's shutdown sequence)
KILL_GRACE_S = 2.0  # after SIGTERM, before SIGKILL
EXIT_NOTICE_S = 0.5  # after its stdout ends, how long to wait for the server's exit code
READ_BYTES = 1 << 16
PARSE_ERROR = -32700
# A message, its result (or params), a list in it (tools, content blocks), one item; then the values
# (a tool's schema, structured content, a block's fields) get the whole nesting cap.
MESSAGE_ENVELOPE_DEPTH = 4


@asynccontextmanager
async def stdio_transport(server: McpServerConfig, wire: WireState) -> AsyncIterator[tuple[Any, Any]]:
    """Start ``server``'s command and yield the session's (read, write) streams; stop it on exit.

    Raises:
        OSError: the command cannot be started (not found, not executable, bad cwd).
    """
    assert server.command is not None
    process = await anyio.open_process(
        [server.command, *server.args],
        env={**get_default_environment(), **server.env},
        cwd=server.cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_read_stdout, process, wire, read_writer, server.max_message_bytes)
        tasks.start_soon(_write_stdin, process, write_reader, read_writer)
        tasks.start_soon(_read_stderr, process, wire, server.name)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process, wire)
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    await stream.aclose()
            tasks.cancel_scope.cancel()


async def _deliver(
    line: bytes, wire: WireState, to_session: MemoryObjectSendStream[SessionMessage | Exception]
) -> bool:
    """Hand one line to the session; False when it ends the connection."""
    if not line.strip():
        return True
    try:
        json_limits.check_depth(line, "it sent a message that", envelope=MESSAGE_ENVELOPE_DEPTH)
    except JsonLimitError as e:
        wire.problem = str(e)
        return False
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as e:
        wire.note_malformed(line)
        answer = _error_for_request(line, e)
        if answer is not None:
            await to_session.send(SessionMessage(answer))
        return True
    await to_session.send(SessionMessage(message))
    return True


async def _read_stdout(
    process: Process,
    wire: WireState,
    to_session: MemoryObjectSendStream[SessionMessage | Exception],
    limit: int,
) -> None:
    """Split the server's stdout into lines of at most ``limit`` bytes and deliver each."""
    assert process.stdout is not None
    buffer = bytearray()
    try:
        async with to_session:  # closing it fails every pending call at once
            while True:
                try:
                    chunk = await process.stdout.receive(READ_BYTES)
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    with anyio.move_on_after(EXIT_NOTICE_S):  # so the error can give the exit code
                        wire.exit_code = await process.wait()
                    return
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0 and end <= limit:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if not await _deliver(line, wire, to_session):
                        return
                if len(buffer) > limit:
                    wire.problem = f"it sent a message of more than {limit} bytes (maxMessageBytes)"
                    return
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass  # the session went away first
    finally:
        wire.closed.set()


async def _write_stdin(
    process: Process,
    from_session: MemoryObjectReceiveStream[SessionMessage],
    to_session: MemoryObjectSendStream[SessionMessage | Exception],
) -> None:
    """Write the session's messages to the server's stdin, one JSON line each."""
    assert process.stdin is not None
    try:
        async with from_session:
            async for item in from_session:
                data = item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                await process.stdin.send(data.encode())
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await to_session.aclose()  # the server stopped reading: the session must notice


async def _read_stderr(process: Process, wire: WireState, name: str) -> None:
    """Keep the server's stderr as a short tail (and log it at debug level), apart from the protocol."""
    assert process.stderr is not None
    with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        while True:
            chunk = await process.stderr.receive(READ_BYTES)
            wire.note_stderr(chunk)
            log.debug("MCP server %s stderr: %s", name, chunk[:500].decode(errors="replace"))


async def _stop(process: Process, wire: WireState) -> None:
    """Close stdin, wait, then terminate the process group; every wait is bounded."""
    if process.stdin is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    with anyio.move_on_after(EXIT_GRACE_S):
        await process.wait()
    if process.returncode is None:
        await terminate_posix_process_tree(process, KILL_GRACE_S)
        with anyio.move_on_after(KILL_GRACE_S):
            await process.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await pipe.aclose()
    # anyio's pipe streams do not close asyncio's subprocess transport, which then keeps the stdout
    # pipe open until garbage collection; nothing public reaches it (the SDK's stdio client does the same).
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    close = getattr(transport, "close", None)
    if callable(close):
        with suppress(PermissionError):
            close()


def _error_for_request(line: bytes, problem: Exception) -> types.JSONRPCError | None:
    """An error answer to the request a malformed response names, so its caller fails at once."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or not ("result" in data or "error" in data):
        return None
    request_id = data.get("id")
    if not isinstance(request_id, int | str) or isinstance(request_id, bool):
        return None
    message = f"malformed response: {str(problem).splitlines()[0][:300]}"
    return types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=types.ErrorData(code=PARSE_ERROR, message=message)
    )
