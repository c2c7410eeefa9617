"""Pieces the worker-side commands share: tool loading options and error display."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from sandfleet.core.console import echo, echo_json, echo_json_text

if TYPE_CHECKING:  # the settings load only when --tools does not name the modules
    from sandfleet.core.settings import Settings
    from sandfleet.worker.mcp.sessions import McpSessions
    from sandfleet.worker.sandbox.docker.engine_api import EngineClient

tools_option = click.option(
    "--tools",
    "tool_modules",
    multiple=True,
    metavar="FILE_OR_MODULE",
    help="Tools module(s) to load (import path or .py file; repeat or separate with commas). "
    "Default: SANDFLEET_TOOLS.",
)


mcp_config_option = click.option(
    "--mcp-config",
    "mcp_config",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help='MCP servers whose tools to offer: a JSON file {"mcpServers": {...}}. Default: SANDFLEET_MCP_CONFIG.',
)


def mcp_config_path(mcp_config: str | None, settings: Settings | None = None) -> str | None:
    """The MCP config file from --mcp-config, else from the settings (None: no MCP servers)."""
    if mcp_config:
        return mcp_config
    from sandfleet.core.settings import get_settings

    return (settings or get_settings()).mcp_config


@contextmanager
def mcp_sessions(path: str | None, settings: Settings | None = None) -> Iterator[McpSessions | None]:
    """The MCP servers of ``path``, started for the command and stopped after it (None without a file;
    pinged and refreshed as ``settings`` say, the defaults without).

    Raises:
        McpConfigError: the file is malformed (line and field named); nothing was started.
    """
    if not path:
        yield None
        return
    from sandfleet.worker.mcp.config import load_mcp_config
    from sandfleet.worker.mcp.sessions import McpSessions

    config = load_mcp_config(path)
    with McpSessions.for_settings(config, settings) if settings else McpSessions(config) as sessions:
        yield sessions


def tool_specs(tool_modules: tuple[str, ...], settings: Settings | None = None) -> list[str]:
    """Module specs from --tools, else from the settings."""
    given = [part.strip() for item in tool_modules for part in item.split(",") if part.strip()]
    if given:
        return given
    from sandfleet.core.settings import get_settings

    settings = settings or get_settings()
    return list(settings.tools)


def echo_payload(payload: Any, raw_text: str | None) -> None:
    """Print a RESULT payload as the program printed it, escaped for the terminal: JSON with its
    unsafe characters as ``\\u`` escapes (it still parses to the same value), text as
    :func:`~sandfleet.core.console.echo` escapes it."""
    if raw_text is None:
        echo_json(payload)
    elif isinstance(payload, str) and payload == raw_text:  # not JSON: printed as text
        echo(raw_text)
    else:
        echo_json_text(raw_text)


def local_engine() -> EngineClient | bool:
    """The thin client of a local engine (docker/engine_api.py: no Docker SDK), already asking the
    engine for its facts while the command's modules load; False when the engine is not local (the
    backend then uses the SDK)."""
    from sandfleet.worker.sandbox.docker import engine_api  # the standard library only

    engine = engine_api.from_env()
    if engine is None:
        return False
    engine.prefetch_info()
    return engine


@contextmanager
def loading_then_frozen() -> Iterator[None]:
    """For a one-off command about to run its sandbox and exit: the cyclic garbage collector paused
    while the block loads modules (pydantic builds many objects, none of them garbage), then every
    object alive exempted from it (``gc.freeze``).

    The collector walked all of that in its full collections and once more as the interpreter exits:
    ~20 ms of a ~280 ms ``sandfleet sandbox run -- true`` (issue 25; 15 runs of each, interleaved).
    Objects made afterwards (the run's output, the tool calls of ``run``) are collected as before.
    """
    import gc

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
