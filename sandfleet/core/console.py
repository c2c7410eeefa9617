"""Everything the ``sandfleet`` commands print goes through here, escaped for a person's terminal.

The commands build their lines from text that programs, models, submitters, MCP servers and whoever
can write Redis control; :mod:`sandfleet.core.terminal_text` says what is escaped and why. Here:

- :func:`echo`: a message or listing; keeps its lines and tabs (multi-line text keeps its shape),
  everything else escaped. A one-line field inside it (a file, tool or worker name, an id) is passed
  through :func:`escape_line` where it is formatted, so it cannot start a line of its own;
- :func:`echo_json` / :func:`echo_json_text`: ``--json`` outputs, exact: non-ASCII letters as they
  are, unsafe characters as JSON ``\\u`` escapes, so ``json.loads`` gives back the original strings;
- :func:`escaping_formatter`: the command's log lines (``-v``), escaped the same way;
- :func:`escaped_click_error`: click's own error display (``Error: ...``) of a command's exception.

Nothing else in a command module calls ``click.echo`` or ``print`` (tests/layout/test_console.py).
Files written with ``--out`` keep their exact bytes: only what reaches the screen is escaped.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import click

from sandfleet.core.terminal_text import escape_json, escape_line, escape_program, escape_text

__all__ = [
    "echo",
    "echo_json",
    "echo_json_text",
    "escape_line",
    "escape_program",
    "escape_text",
    "escaped_click_error",
    "escaping_formatter",
    "json_text",
]


def echo(message: str = "", *, err: bool = False, nl: bool = True) -> None:
    """Print ``message`` (stderr with ``err``) with every unsafe character but newline and tab escaped."""
    click.echo(escape_text(message), err=err, nl=nl)


def json_text(value: Any, *, indent: int | None = None, default: Any = None) -> str:
    """``value`` as JSON for the terminal: exact after ``json.loads``, no raw control characters."""
    return escape_json(json.dumps(value, ensure_ascii=False, indent=indent, default=default))


def echo_json(value: Any, *, err: bool = False, indent: int | None = None, default: Any = None) -> None:
    """Print ``value`` as one JSON document (see :func:`json_text`)."""
    click.echo(json_text(value, indent=indent, default=default), err=err)


def echo_json_text(text: str, *, err: bool = False) -> None:
    """Print JSON already encoded (a pydantic ``model_dump_json``), its unsafe characters as ``\\u``."""
    click.echo(escape_json(text), err=err)


class _EscapingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return escape_text(super().format(record))


def escaping_formatter(fmt: str) -> logging.Formatter:
    """A log formatter whose lines (tracebacks included) are escaped as :func:`echo` escapes."""
    return _EscapingFormatter(fmt)


def escaped_click_error(error: click.ClickException) -> None:
    """Escape ``error``'s message in place (click prints it as ``Error: MESSAGE``)."""
    # typed Final in click, an ordinary attribute at run time: every show() formats it afresh
    setattr(error, "message", escape_text(error.message))  # noqa: B010
