"""The printing helpers every command uses (sandfleet/core/console.py): what reaches the stream."""

from __future__ import annotations

import io
import json
import logging

import click
import pytest

from sandfleet.core.console import (
    echo,
    echo_json,
    echo_json_text,
    escaped_click_error,
    escaping_formatter,
    json_text,
)

HOSTILE = "\x1b[2J\x9b31m\rok\u202e\U000e0041 Zürich"
RAW = ("\x1b", "\x9b", "\r", "\u202e", "\U000e0041")


def test_echo_keeps_lines_and_tabs_and_escapes_the_rest(capsys: pytest.CaptureFixture[str]) -> None:
    echo(f"a\tb\n{HOSTILE}")
    echo(HOSTILE, err=True)
    out, err = capsys.readouterr()
    assert out == "a\tb\n\\x1b[2J\\x9b31m\\rok\\u202e\\U000e0041 Zürich\n"
    assert err == out.split("\n", 1)[1]


def test_echo_json_is_exact_after_loads_and_carries_nothing_raw(capsys: pytest.CaptureFixture[str]) -> None:
    value = {HOSTILE: [HOSTILE, 1, None], "plain": "東京"}
    echo_json(value, indent=2)
    echo_json_text(json.dumps(value, ensure_ascii=False))
    first, second = capsys.readouterr().out.split("\n}\n")
    for shown in (first + "\n}", second):
        assert json.loads(shown) == value and not any(c in shown for c in RAW) and "東京" in shown
    assert json_text("\x9b") == '"\\u009b"'


def test_log_lines_are_escaped_tracebacks_included() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(escaping_formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("tests.console")
    log.addHandler(handler)
    try:
        try:
            raise ValueError(HOSTILE)
        except ValueError:
            log.exception("job said %s", HOSTILE)
    finally:
        log.removeHandler(handler)
    shown = stream.getvalue()
    assert shown.startswith("ERROR job said \\x1b[2J") and "ValueError: \\x1b[2J" in shown
    assert not any(c in shown for c in RAW) and "\nTraceback" in shown


def test_a_click_error_is_shown_escaped() -> None:
    error = click.UsageError(f"bad value {HOSTILE}")
    escaped_click_error(error)
    shown = io.StringIO()
    error.show(file=shown)
    assert "Error: bad value \\x1b[2J\\x9b31m\\rok\\u202e" in shown.getvalue()
    assert not any(c in shown.getvalue() for c in RAW)
