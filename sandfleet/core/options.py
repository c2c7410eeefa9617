"""How the contracts are spelled on a command line, for every command of either side: ``-o KEY=VALUE``
sandbox options and the display of validation errors."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # imported when used: `--help` and commands without -o need no pydantic
    from pydantic import ValidationError

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


def describe_validation_error(err: ValidationError) -> str:
    """One line per problem: ``field: reason``, without pydantic's URLs."""
    lines = []
    for item in err.errors(include_url=False):
        where = ".".join(str(p) for p in item["loc"]) or "options"
        msg = item["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg}")
    return "\n".join(lines)


def sandbox_config_from(pairs: tuple[str, ...], base: dict[str, Any] | None = None) -> SandboxConfig:
    """A validated SandboxConfig from ``-o`` pairs, or a clear usage error."""
    from pydantic import ValidationError

    from sandfleet.core.config import SandboxConfig

    try:
        return SandboxConfig.model_validate({**(base or {}), **parse_options(pairs)})
    except ValidationError as e:
        raise click.UsageError(f"invalid sandbox option:\n{describe_validation_error(e)}") from None
