"""``sandfleet tools``: every tool a worker would offer, from its Python modules and its MCP servers.

Each tool is shown as the model sees it (its signature and the first line of its description) with
where it comes from (``python:MODULE`` or ``mcp:SERVER``) and whether it is marked side-effecting.
MCP servers are started for the listing and stopped after it; a server that cannot be reached is
reported on stderr with the fix, and the exit status is then 1.
"""

from __future__ import annotations

import sys
from dataclasses import asdict

import click

from sandfleet.core.console import echo, echo_json, escape_line
from sandfleet.core.errors import SandfleetError
from sandfleet.worker.cli.common import (
    mcp_config_option,
    mcp_config_path,
    mcp_sessions,
    tool_specs,
    tools_option,
)


@click.command()
@tools_option
@mcp_config_option
@click.option(
    "--json", "as_json", is_flag=True, help="Print {tools: [{source, name, signature, ...}], servers: [...]}."
)
def tools(tool_modules: tuple[str, ...], mcp_config: str | None, as_json: bool) -> None:
    """List every tool a worker would offer: source, name, signature, description."""
    from sandfleet.worker.mcp.catalog import ToolCatalog
    from sandfleet.worker.tools.registry import ToolRegistry

    try:
        python_tools = ToolRegistry.from_modules(tool_specs(tool_modules))
        with mcp_sessions(mcp_config_path(mcp_config)) as sessions:
            registry = ToolCatalog(python_tools, sessions).registry()
            servers = sessions.status() if sessions is not None else []
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    rows = [
        {
            "source": tool.module if tool.module.startswith("mcp:") else f"python:{tool.module or '?'}",
            "name": tool.name,
            "signature": tool.signature,
            "description": tool.description,
            "side_effects": tool.side_effects,
        }
        for tool in registry
    ]
    down = [s for s in servers if not s.up and not s.disabled]
    if as_json:
        echo_json({"tools": rows, "servers": [asdict(s) for s in servers]}, indent=2)
    else:  # names, signatures and descriptions come from MCP servers: one line each
        for row in rows:
            mark = ", side effects" if row["side_effects"] else ""
            echo(
                f"{escape_line(row['name'])}  ({escape_line(row['source'])}{mark})\n"
                f"    {escape_line(row['signature'])}"
            )
            if row["description"]:
                echo(f"    {escape_line(row['description'])}")
        if not rows:
            echo("no tools (give --tools MODULE or --mcp-config FILE)")
        for server in down:
            echo(
                f"mcp:{escape_line(server.name)} is down: {server.detail}"
                + (f"\n  fix: {server.fix}" if server.fix else ""),
                err=True,
            )
    sys.exit(1 if down else 0)
