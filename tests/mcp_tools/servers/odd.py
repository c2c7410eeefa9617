"""An MCP server the tests wrote with the SDK's low-level Server: names and schemas Python lacks.

    python tests/mcp_tools/servers/odd.py [--http PORT]

Tools (each answers with the arguments it received, as structured content):
- ``get-weather.now``: not an identifier; properties ``city`` (required), ``from`` (a keyword),
  ``user-id`` (a dash), ``2fa`` (starts with a digit), ``unit`` (an enum with a default);
- ``book``: a nested object schema (guest -> name, address -> zip with a pattern) and ``nights >= 1``;
- ``search``: the same name as the lab server's tool.
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "from": {"type": "string", "description": "a date"},
        "user-id": {"type": "integer"},
        "2fa": {"type": "boolean"},
        "unit": {"enum": ["C", "F"], "default": "C"},
    },
    "required": ["city"],
}
BOOK = {
    "type": "object",
    "properties": {
        "guest": {"$ref": "#/$defs/Guest"},
        "nights": {"type": "integer", "minimum": 1},
    },
    "required": ["guest", "nights"],
    "$defs": {
        "Guest": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "address": {
                    "type": "object",
                    "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["zip"],
                },
            },
            "required": ["name", "address"],
        }
    },
}
SEARCH = {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}
TOOLS = [
    types.Tool(
        name="get-weather.now", description="The weather now.\nMore lines here.", input_schema=WEATHER
    ),
    types.Tool(name="book", description="Book a room for a guest.", input_schema=BOOK),
    types.Tool(name="search", description="The odd server's search.", input_schema=SEARCH),
]


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    received = {"tool": params.name, "arguments": params.arguments or {}}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=str(received))], structured_content=received
    )


server = Server("odd", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None)
    args = parser.parse_args()
    if args.http is None:
        anyio.run(serve_stdio)
    else:
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=args.http, log_level="warning")


if __name__ == "__main__":
    main()
