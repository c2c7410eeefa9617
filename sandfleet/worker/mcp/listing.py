"""What a server offers, read from it: its tools, and the resources and templates it lists.

The same reading serves the first connection and every refresh after a list-changed notification, so
a changed listing passes the same bounds: at most ``MAX_PAGES`` pages per list (each message bounded by
the server's ``maxMessageBytes`` in the transport), every tool as the SDK's types parsed it (a
malformed listing fails the connection attempt), the resources capped in resources.py. Schemas and
names are checked where the catalog is built (tools.py, names.py), for every listing alike.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from mcp import Client
from mcp.shared.exceptions import MCPError

from sandfleet.worker.mcp.resources import MAX_RESOURCES, MAX_TEMPLATES, ResourceIndex

log = logging.getLogger("sandfleet.mcp")

MAX_PAGES = 20


@dataclass(frozen=True)
class ListedTool:
    """One tool as its server lists it (its own name, schemas as sent)."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None


@dataclass(frozen=True)
class Listing:
    """One reading of a server: its tools and (when it offers any) its resources."""

    tools: tuple[ListedTool, ...] = ()
    resources: ResourceIndex = field(default_factory=ResourceIndex)


async def read_listing(client: Client, server: str) -> Listing:
    """The server's tools, and its resources when its capabilities say it has them.

    Raises:
        MCPError, ValidationError, transport errors: the tool list could not be read (the
            connection attempt fails, as on the first connection).
    """
    tools = await list_tools(client, server)
    return Listing(tools, await list_resources(client, server))


async def list_tools(client: Client, server: str) -> tuple[ListedTool, ...]:
    tools: list[ListedTool] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += [
            ListedTool(server, t.name, t.description or t.title or "", t.input_schema, t.output_schema)
            for t in page.tools
        ]
        cursor = page.next_cursor
        if not cursor:
            break
    return tuple(tools)


async def list_resources(client: Client, server: str) -> ResourceIndex:
    """The URIs and templates the server lists (empty when it offers no resources, or refuses to list
    them: resources are optional, so a failure here is logged and the tools are still offered)."""
    if client.server_capabilities.resources is None:
        return ResourceIndex()
    try:
        uris = await _pages(client.list_resources, lambda page: [str(r.uri) for r in page.resources])
    except MCPError as e:
        log.warning("MCP server %s: its resources cannot be listed (%s); none are offered", server, e)
        return ResourceIndex()
    try:
        templates = await _pages(
            client.list_resource_templates, lambda page: [t.uri_template for t in page.resource_templates]
        )
    except MCPError as e:  # templates are optional even for a server with resources
        log.info("MCP server %s: no resource templates (%s)", server, e)
        templates = []
    if len(uris) > MAX_RESOURCES or len(templates) > MAX_TEMPLATES:
        log.warning(
            "MCP server %s lists %d resources and %d templates; the first %d and %d are readable",
            server, len(uris), len(templates), MAX_RESOURCES, MAX_TEMPLATES,
        )  # fmt: skip
    return ResourceIndex.of(uris, templates)


async def _pages(fetch: Any, items: Any) -> list[str]:
    """Every item of a paginated list call, at most ``MAX_PAGES`` pages."""
    found: list[str] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await fetch(cursor=cursor)
        found += items(page)
        cursor = page.next_cursor
        if not cursor or len(found) > MAX_RESOURCES + MAX_TEMPLATES:
            break
    return found
