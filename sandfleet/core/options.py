"""How the contracts are spelled on a command line, for every command of either side: ``-o KEY=VALUE``
sandbox options (their validation errors are shown by core/validation_text.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from sandfleet.core.validation_text import describe_validation_error

if TYPE_CHECKING:  # imported when used: `--help` and commands without -o need no pydantic
    from sandfleet.core.config import SandboxConfig

sandbox_option = click.option(
    "-o",
    "--option",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Sandbox option, named as in SandboxConfig (e.g. -o memory_limit=512M -o backend=gvisor).",
)


def parse_options(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``("memory_limit=512M", "env={...}")`` -> dict; values that are JSON are parsed as JSON."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="-o")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if isinstance(value, int | float) and key in ("memory_limit", "disk_limit"):
            value = raw if not raw.isdigit() else int(raw)
        options[key.strip()] = value
    return options


def sandbox_config_from(pairs: tuple[str, ...], base: dict[str, Any] | None = None) -> SandboxConfig:
    """A validated SandboxConfig from ``-o`` pairs, or a clear usage error."""
    from pydantic import ValidationError

    from sandfleet.core.config import SandboxConfig

    try:
        return SandboxConfig.model_validate({**(base or {}), **parse_options(pairs)})
    except ValidationError as e:
        problems = describe_validation_error(e, root="options", sep="\n")
        raise click.UsageError(f"invalid sandbox option:\n{problems}") from None
