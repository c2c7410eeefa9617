"""An MCP server the tests wrote with the SDK's MCPServer: one tool per kind of answer.

    python tests/mcp_tools/servers/lab.py                 # stdio
    python tests/mcp_tools/servers/lab.py --http PORT     # streamable HTTP on 127.0.0.1:PORT/mcp

Tools: structured output (``stats``), an image (``chart``), an error result (``fail``), a slow tool
(``wait``), a huge result (``huge``), a server crash mid-call (``crash``), garbage on stdout
(``garbage``, ``garbled``), the reference orders (``load_orders``, from ``--data DIR``/orders.csv),
``search`` (the odd server has one too), ``record`` (a side effect: a line in DATA/notes.log) and
``secret_env`` (what of its environment it got).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import struct
import sys
import time
import zlib
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from typing_extensions import TypedDict

server = MCPServer("lab", log_level="WARNING")
DATA = Path(os.environ.get("LAB_DATA_DIR", "."))
# The SDK's stdio server moves the protocol off fd 1 (stray prints go to stderr); a copy of the real
# stdout, taken before it does, lets the hostile tools write onto the wire itself.
WIRE = os.dup(1)


class Stats(TypedDict):
    count: int
    mean: float
    max: float


class Order(TypedDict):
    order_id: str
    date: str
    region: str
    product: str
    quantity: int
    unit_price: float


@server.tool()
def stats(numbers: list[float]) -> Stats:
    """Count, mean and maximum of some numbers."""
    return {"count": len(numbers), "mean": sum(numbers) / len(numbers), "max": max(numbers)}


@server.tool()
def chart(width: int = 2, height: int = 2) -> Image:
    """A tiny red PNG of the given size."""
    return Image(data=_png(width, height), format="png")


@server.tool()
def fail(reason: str) -> str:
    """Always fails, with the reason given."""
    raise ToolError(f"failed on purpose: {reason}")  # the SDK sends this message as an error result


_waiting = [0]  # calls of ``wait`` in flight on this server


@server.tool()
async def wait(seconds: float) -> str:
    """Sleep, then say how long and how many calls were sleeping at the end (concurrency counted,
    not timed: served one by one, every call sees only itself)."""
    began = time.monotonic()
    _waiting[0] += 1
    try:
        await anyio.sleep(seconds)
        return f"slept {time.monotonic() - began:.2f}; {_waiting[0]} waiting"
    finally:
        _waiting[0] -= 1


@server.tool()
def huge(megabytes: int) -> str:
    """A text of the given size, in megabytes."""
    return "x" * (megabytes * 1024 * 1024)


@server.tool()
def crash() -> str:
    """The server process dies in the middle of the call."""
    os._exit(3)


@server.tool()
def garbage() -> str:
    """Writes a line that is not JSON-RPC to stdout (stdio only), then answers."""
    os.write(WIRE, b"this is not JSON-RPC\n")
    return "answered after the garbage"


@server.tool()
async def garbled(ctx: Context, kind: str = "version") -> str:
    """Answers its own request with a malformed response (kind "version": not JSON-RPC 2.0; "shape":
    JSON-RPC, but not a tool result), then never answers properly."""
    version = "1.0" if kind == "version" else "2.0"
    line = {"jsonrpc": version, "id": ctx.request_id, "result": {"content": "not a list", "isError": "no"}}
    os.write(WIRE, (json.dumps(line) + "\n").encode())
    await anyio.sleep(3600)
    return "never"


@server.tool()
def load_orders() -> list[Order]:
    """All orders: order_id, date, region, product, quantity (int), unit_price (float)."""
    with (DATA / "orders.csv").open(newline="") as source:
        return [
            {**row, "quantity": int(row["quantity"]), "unit_price": float(row["unit_price"])}  # type: ignore[typeddict-item]
            for row in csv.DictReader(source)
        ]


@server.tool()
def search(query: str) -> str:
    """The lab's search (the odd server has one too)."""
    return f"lab found {query}"


@server.tool()
def record(text: str) -> int:
    """Append a line to the lab's notes (a side effect); the number of lines noted so far."""
    with (DATA / "notes.log").open("a") as notes:
        notes.write(text + "\n")
    return len((DATA / "notes.log").read_text().splitlines())


@server.tool()
def secret_env(name: str) -> str:
    """The value of one of the server's environment variables ('' if unset)."""
    return os.environ.get(name, "")


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack("!I", len(data)) + kind + data + struct.pack("!I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack("!IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def main() -> None:
    global DATA
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on this port")
    parser.add_argument("--data", default=None, help="folder of orders.csv")
    args = parser.parse_args()
    if args.data:
        DATA = Path(args.data)
    if args.http is None:
        server.run("stdio")
    else:
        import uvicorn

        print(f"lab serving on {args.http}", file=sys.stderr, flush=True)
        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=args.http, log_level="warning")


if __name__ == "__main__":
    main()
