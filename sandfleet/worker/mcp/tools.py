"""MCP servers' tools as registry tools, side by side with the Python ones.

An :class:`McpTool` is a :class:`~sandfleet.worker.tools.tool.Tool` (name, signature, description,
side-effect mark, ``module`` = ``mcp:SERVER``), so the registry, the allow-list, the prompt and the
bridge treat it like any other. Its call binds the program's arguments like a Python call, checks them
against the tool's input schema on the host, sends them to the server under the per-call timeout
(the lower of the job's and the server's) and turns the answer into the program's value.

A server that lists resources is offered one more tool, :class:`McpResourceReader`
``server__read_resource(uri)``: read-only (never gated, never memoised as a side effect), it accepts
only a URI the server listed or one matching its templates (resources.py), checked on the host, and
returns the contents as tool results are returned; the bridge's reply limit applies as to any call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sandfleet.worker.mcp.names import reader_names, server_prefixes, tool_names
from sandfleet.worker.mcp.resources import ResourceIndex, resource_value
from sandfleet.worker.mcp.results import result_value
from sandfleet.worker.mcp.schema import SchemaError, ToolSignature
from sandfleet.worker.mcp.sessions import ListedTool, McpSessions
from sandfleet.worker.tools.tool import Tool

log = logging.getLogger("sandfleet.mcp")

SOURCE_PREFIX = "mcp:"


@dataclass(frozen=True)
class McpTool(Tool):
    """A tool served by an MCP server. ``remote`` is the server's own name for it."""

    server: str = ""
    remote: str = ""
    shape: ToolSignature | None = None
    sessions: McpSessions | None = None
    timeout_s: float = 60.0

    stops_at_timeout: ClassVar[bool] = True

    @property
    def input_schema(self) -> dict[str, Any]:
        """The server's own schema: what a tool-calling model (shell and chat jobs) is offered."""
        assert self.shape is not None
        return self.shape.input_schema

    def call(self, args: list[Any], kwargs: dict[str, Any], timeout_s: float | None = None) -> Any:
        """Bind, validate, call the server, convert the answer. Keywords may use the Python names
        the signature shows or the server's own (``from``, ``user-id``: how a tool-calling model,
        offered the schema, names them); either way the values are checked against the schema.

        Raises:
            TypeError: the arguments do not fit the signature, or a value has the wrong type.
            ValueError: a value breaks the schema otherwise (enum, pattern, a nested key missing).
            TimeoutError, ToolServerError, ToolError: see :meth:`McpSessions.call` and
                :func:`~sandfleet.worker.mcp.results.result_value`.
        """
        assert self.shape is not None and self.sessions is not None
        arguments = self.shape.arguments(self.bind(args, self.shape.python_keywords(kwargs)))
        self.shape.validate(self.name, arguments)
        limit = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        result = self.sessions.call(self.server, self.remote, arguments, limit)
        return result_value(result, tool=self.name, unwrap=self.shape.unwraps_result)


@dataclass(frozen=True)
class McpResourceReader(Tool):
    """``server__read_resource(uri)``: one of the server's resources, as the listing it was made
    from offered them (a job keeps the reader, and so the index, it was given)."""

    server: str = ""
    index: ResourceIndex = field(default_factory=ResourceIndex)
    sessions: McpSessions | None = None
    timeout_s: float = 60.0

    stops_at_timeout: ClassVar[bool] = True
    read_only: ClassVar[bool] = True

    @property
    def input_schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"uri": {"type": "string", "description": self.index.offered()}},
            "required": ["uri"],
            "additionalProperties": False,
        }

    def call(self, args: list[Any], kwargs: dict[str, Any], timeout_s: float | None = None) -> Any:
        """Check the URI against the index, read it, convert the contents.

        Raises:
            TypeError: not one string argument ``uri``.
            ValueError: the server did not offer that URI (it is not asked).
            TimeoutError, ToolServerError, ToolError: as for a tool call.
        """
        assert self.sessions is not None
        uri = self.index.check(self.server, self.bind(args, kwargs).arguments["uri"])
        limit = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        return resource_value(self.sessions.read(self.server, uri, limit))


def mcp_tools(sessions: McpSessions, taken: Iterable[str] = ()) -> list[Tool]:
    """The tools of every server that is up (and the resource readers of those that list resources),
    named so that none clashes with ``taken`` or another.

    A tool whose input schema is unusable is left out (and logged): the program could not call it
    safely, and the host could not check its arguments.
    """
    config = sessions.config
    listings = sessions.listings()
    prefixes = server_prefixes(sessions.server_names())
    names = tool_names({s: [t.name for t in tools] for s, (tools, _) in listings.items()}, prefixes, taken)
    offered: list[Tool] = []
    for server, (tools, up) in listings.items():
        if not up:
            continue
        settings = config.server(server)
        for listed in tools:
            name = names[(server, listed.name)]
            try:
                offered.append(
                    _tool(name, listed, settings.marks_side_effects(listed.name), sessions, settings.timeout)
                )
            except SchemaError as e:
                log.warning("MCP server %s: tool %r is not offered: %s", server, listed.name, e)
    return offered + _readers(sessions, prefixes, [*taken, *names.values()])


def _readers(sessions: McpSessions, prefixes: dict[str, str], taken: list[str]) -> list[Tool]:
    indexes = {server: sessions.resources(server) for server in sessions.listings()}
    readable = [server for server, index in indexes.items() if index]
    names = reader_names(readable, prefixes, taken)
    readers: list[Tool] = []
    for server in readable:
        name, index = names[server], indexes[server]

        def func(uri: str) -> Any:  # the signature binding reads; McpResourceReader.call does the work
            raise RuntimeError("called through McpResourceReader.call")

        readers.append(
            McpResourceReader(
                name=name,
                func=func,
                signature=f"{name}(uri: str) -> dict",
                description=f"Read one of the {server} server's resources by URI ({index.offered()})",
                side_effects=False,
                module=f"{SOURCE_PREFIX}{server}",
                server=server,
                index=index,
                sessions=sessions,
                timeout_s=sessions.config.server(server).timeout,
            )
        )
    return readers


def _tool(name: str, listed: ListedTool, marked: bool, sessions: McpSessions, timeout_s: float) -> McpTool:
    shape = ToolSignature.from_schemas(listed.input_schema, listed.output_schema)

    def func(*args: Any, **kwargs: Any) -> Any:  # the signature binding reads; McpTool.call does the work
        raise RuntimeError(f"{name} is called through McpTool.call")

    func.__signature__ = shape.python_signature()  # type: ignore[attr-defined]
    return McpTool(
        name=name,
        func=func,
        signature=shape.render(name),
        description=_first_line(listed.description),
        side_effects=marked,
        module=f"{SOURCE_PREFIX}{listed.server}",
        server=listed.server,
        remote=listed.name,
        shape=shape,
        sessions=sessions,
        timeout_s=timeout_s,
    )


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
