"""``sandfleet run PROGRAM.py``: an existing program under the code-action runtime, no model."""

from __future__ import annotations

import sys

import click

from sandfleet.core.console import echo, echo_json
from sandfleet.core.errors import SandfleetError
from sandfleet.core.options import sandbox_config_from, sandbox_option
from sandfleet.worker.cli.common import (
    echo_payload,
    loading_then_frozen,
    local_engine,
    mcp_config_option,
    mcp_config_path,
    mcp_sessions,
    tool_specs,
    tools_option,
)


@click.command()
@click.argument("program", type=click.File("r"))
@tools_option
@mcp_config_option
@sandbox_option
@click.option("--exec-timeout", type=float, default=None, help="Seconds the program may run (default 120).")
@click.option("--max-tool-calls", type=int, default=None, help="Tool calls allowed (default 50).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole run result as JSON.")
def run(program, tool_modules, mcp_config, options, exec_timeout, max_tool_calls, as_json) -> None:
    """Run PROGRAM in a fresh sandbox with the tool bridge, caps and the RESULT line; print the payload."""
    with loading_then_frozen():
        engine = local_engine()  # asked for its facts while the modules below load
        from sandfleet.core.config import CodeActionSettings
        from sandfleet.core.settings import get_settings
        from sandfleet.worker.mcp.catalog import ToolCatalog
        from sandfleet.worker.program.runtime import ProgramRuntime
        from sandfleet.worker.sandbox.backends import backend_named
        from sandfleet.worker.sandbox.pool import SandboxPool
        from sandfleet.worker.tools.registry import ToolRegistry

        config = sandbox_config_from(options)
        overrides = {
            k: v
            for k, v in {"exec_timeout": exec_timeout, "max_tool_calls": max_tool_calls}.items()
            if v is not None
        }
        try:
            settings = CodeActionSettings(**overrides)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    source = program.read()
    try:
        python_tools = ToolRegistry.from_modules(tool_specs(tool_modules))
        with (
            mcp_sessions(mcp_config_path(mcp_config)) as sessions,
            SandboxPool(pool_size=0, max_live=1, backend=backend_named(thin=engine)) as pool,
        ):
            registry = ToolCatalog(python_tools, sessions).registry()
            redact = tuple(get_settings().approval_redact)  # --json shows the calls: redacted there too
            result = ProgramRuntime(pool, registry).run(
                source, config=config, settings=settings, redact=redact
            )
    except SandfleetError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        echo_json(result.to_dict(), default=str)
    elif result.result_found:
        echo_payload(result.result, result.result_text)
    failure = result.failure()
    if failure:
        if not as_json:
            echo(result.stderr[-4000:], err=True, nl=False)  # the program's own stderr, escaped
            echo(f"sandfleet run: {failure}", err=True)
        sys.exit(1)
