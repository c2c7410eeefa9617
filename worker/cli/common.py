"""Pieces the worker-side commands share: tool loading options and error display."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # the settings load only when --tools does not name the modules
    from sandfleet.core.settings import Settings

tools_option = click.option(
    "--tools",
    "tool_modules",
    multiple=True,
    metavar="FILE_OR_MODULE",
    help="Tools module(s) to load (import path or .py file; repeat or separate with commas). "
    "Default: SANDFLEET_TOOLS.",
)


def tool_specs(tool_modules: tuple[str, ...], settings: Settings | None = None) -> list[str]:
    """Module specs from --tools, else from the settings."""
    given = [part.strip() for item in tool_modules for part in item.split(",") if part.strip()]
    if given:
        return given
    from sandfleet.core.settings import get_settings

    settings = settings or get_settings()
    return list(settings.tools)


def echo_payload(payload: Any, raw_text: str | None) -> None:
    """Print a RESULT payload exactly as the program printed it."""
    if raw_text is not None:
        click.echo(raw_text)
    else:
        click.echo(json.dumps(payload))
