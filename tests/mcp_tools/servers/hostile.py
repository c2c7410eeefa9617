"""A hostile MCP server the tests wrote with the SDK's low-level Server: deep, huge and slow-to-check.

    python tests/mcp_tools/servers/hostile.py

Tools:
- ``nested(depth)``: structured content nested ``depth`` deep. The SDK's serialiser stops at 255
  levels, so the answer is written onto the wire by hand (as any server not built on the SDK could),
  then the tool never answers through the SDK;
- ``bulky(items)``: structured content of ``items`` short strings (megabytes past a job's reply cap);
- ``match(text)``: ``text`` must match ``^(a+)+$``, a pattern Python's ``re`` needs seconds for;
- ``distinct(items)``: ``items`` must be unique objects (jsonschema compares every pair);
- ``lookahead(text)``: a pattern with a lookahead, which RE2 cannot compile;
- ``shout(text)``: answers ``{"text": text}`` under an output schema with the catastrophic pattern
  (the SDK checks it, on the worker's MCP thread);
- ``explode(text)``: ``text`` checked through 30 definitions, each a ``oneOf`` of two ``$ref`` s to
  the next (under 3 KB, 2 levels deep): jsonschema would visit it 2**30 times (the tool must not be
  offered);
- ``wide(items)``: each item checked through 7 such definitions (510 visits an item): offered, but a
  call with thousands of items would check for a minute (it must be refused before the check);
- ``ping()``: answers "pong", to show the server (and the worker) is still there.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

CATASTROPHIC = "^(a+)+$"
# The SDK's stdio server moves the protocol off fd 1; a copy taken first lets a tool write on the wire.
WIRE = os.dup(1)


def _schema(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


def _chain(prefix: str, links: int) -> dict[str, Any]:
    """Definitions ``{prefix}0`` .. ``{prefix}{links}``, each a oneOf of two $refs to the next."""
    defs: dict[str, Any] = {
        f"{prefix}{i}": {
            "oneOf": [
                {"$ref": f"#/$defs/{prefix}{i + 1}"},
                {"$ref": f"#/$defs/{prefix}{i + 1}", "minLength": 0},
            ]
        }
        for i in range(links)
    }
    defs[f"{prefix}{links}"] = {"type": "string"}
    return defs


EXPLODE = {**_schema({"text": {"$ref": "#/$defs/e0"}}), "$defs": _chain("e", 30)}
WIDE = {**_schema({"items": {"type": "array", "items": {"$ref": "#/$defs/w0"}}}), "$defs": _chain("w", 7)}

TOOLS = [
    types.Tool(name="nested", description="Structured content nested DEPTH deep.", input_schema=_schema({"depth": {"type": "integer"}})),
    types.Tool(name="bulky", description="Structured content of ITEMS strings.", input_schema=_schema({"items": {"type": "integer"}})),
    types.Tool(name="match", description="Checks TEXT against a pattern.", input_schema=_schema({"text": {"type": "string", "pattern": CATASTROPHIC}})),
    types.Tool(
        name="distinct",
        description="Takes unique objects.",
        input_schema=_schema({"items": {"type": "array", "items": {"type": "object"}, "uniqueItems": True}}),
    ),
    types.Tool(name="lookahead", description="A pattern RE2 refuses.", input_schema=_schema({"text": {"type": "string", "pattern": "^(?=a)a+$"}})),
    types.Tool(
        name="shout",
        description="Echoes TEXT as structured output.",
        input_schema=_schema({"text": {"type": "string"}}),
        output_schema=_schema({"text": {"type": "string", "pattern": CATASTROPHIC}}),
    ),
    types.Tool(name="explode", description="Checks TEXT through 2**30 paths.", input_schema=EXPLODE),
    types.Tool(name="wide", description="Checks each of ITEMS through 510 visits.", input_schema=WIDE),
    types.Tool(name="ping", description="Answers pong.", input_schema={"type": "object", "properties": {}}),
]  # fmt: skip


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    if params.name == "nested":
        depth = int(arguments["depth"])
        value = "[" * depth + "]" * depth
        line = f'{{"jsonrpc":"2.0","id":{json.dumps(ctx.request_id)},"result":{{"resultType":"complete","content":[],"structuredContent":{{"value":{value}}}}}}}\n'
        os.write(WIRE, line.encode())
        await anyio.sleep(3600)  # answered already, by hand
    if params.name == "shout":
        return types.CallToolResult(content=[], structured_content={"text": arguments["text"]})
    if params.name == "bulky":
        value = {"items": ["x" * 60] * int(arguments["items"])}
        return types.CallToolResult(content=[], structured_content=value)
    text = "pong" if params.name == "ping" else f"{params.name} accepted"
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


server = Server("hostile", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(serve_stdio)
